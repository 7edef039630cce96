"""The install tier: the lab (tests/e2e_k8s/lab.py) without its host agent, nri-numa's image
imported into its containerd and installed with `kubectl apply -k packaging/kubernetes` (through
the lab's overlay, tests/e2e_k8s/daemonset.py): the agent runs in its DaemonSet's pod as its
ServiceAccount. One lab for the whole tier, as in tests/e2e_k8s; skips where it cannot come up,
failures under NRI_NUMA_E2E_REQUIRED=1."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, detect_layout
from tests.e2e.harness.required import fail_skip_where_required
from tests.e2e.harness.runtimes import REPO, RuntimesUnavailable, ensure_runtimes
from tests.e2e.nri_agent import require_two_cpus
from tests.e2e_k8s.daemonset import IMAGE, PODMAN, install, import_images
from tests.e2e_k8s.kube import Kube
from tests.e2e_k8s.lab import CONTAINERD_VERSION, Lab, LabFailed, LabUnavailable, find_binaries
from tests.e2e_k8s.pods import SUMMARY, delete_all_test_pods

IMAGE_B = f"{IMAGE}-b"  # the upgrade's second build (test_upgrade.py)
LOG_LINES_ON_FAILURE = 60


def build_images(env: dict[str, str]) -> None:
    """scripts/image's image (a few seconds when up to date), and a second build of it that
    differs: its own label (the first's id), so its own image id and digest; made again only
    when the first changed."""
    done = subprocess.run([str(REPO / "scripts" / "image")], capture_output=True, text=True,
                          timeout=900, env=env, check=False)
    if done.returncode != 0:
        raise LabFailed(f"scripts/image failed:\n{done.stderr[-3000:]}")

    def inspect(ref: str, field: str) -> str:
        return subprocess.run([PODMAN, "image", "inspect", "--format", field, ref],
                              capture_output=True, text=True, env=env, check=False).stdout.strip()

    base = inspect(IMAGE, "{{.Id}}")
    if inspect(IMAGE_B, '{{ index .Labels "io.nri-numa.b-of" }}') == base:
        return  # made from this A already
    previous = inspect(IMAGE_B, "{{.Id}}")
    done = subprocess.run([PODMAN, "build", "--network=none", "--pull=never", "--layers=false",
                           "--label", f"io.nri-numa.b-of={base}", "-t", IMAGE_B, "-f", "-"],
                          input=f"FROM {IMAGE}\n", capture_output=True, text=True, timeout=300,
                          env=env, check=False)
    if done.returncode != 0:
        raise LabFailed(f"podman build of {IMAGE_B} failed:\n{done.stderr[-3000:]}")
    if previous:  # the one it replaces, now untagged
        subprocess.run([PODMAN, "rmi", previous], capture_output=True, env=env, check=False)


@pytest.fixture(scope="package")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes lab needs root: it runs containerd and a kubelet")
    require_two_cpus()
    if shutil.which(PODMAN) is None:
        pytest.skip(f"{PODMAN} is missing (scripts/e2e-deps installs it): it builds the image")
    try:
        binaries = find_binaries()
        runtimes = ensure_runtimes()
    except (LabUnavailable, RuntimesUnavailable) as exc:
        pytest.skip(f"the Kubernetes lab cannot run here: {exc}")
    # No RLIMIT_NOFILE/NPROC defaults: machines without CAP_SYS_RESOURCE refuse podman's.
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    folder = Path(tempfile.mkdtemp(prefix="nri-numa-k8s-", dir=os.environ.get("NRI_NUMA_E2E_TMP", "/tmp")))
    made = Lab(folder)
    progress: list[str] = []
    try:
        build_images(env)
        took = made.up(binaries, runtimes.containerd[CONTAINERD_VERSION], runtimes.busybox,
                       progress.append, host_agent=False)
        import_images(made, [IMAGE, IMAGE_B])
        install(made, made.kube(binaries), folder / "overlay")
    except (LabUnavailable, LabFailed) as exc:
        made.down()
        made.keep_logs(tmp_path_factory.mktemp("k8s-lab-logs"))
        pytest.skip(f"the Kubernetes lab with nri-numa's DaemonSet did not come up: {exc}\n"
                    "bring-up: " + "\n".join(progress))
    SUMMARY.append(f"k8s lab (DaemonSet) up in {took:.1f} s, the images imported and the "
                   "DaemonSet's agent connected")
    try:
        yield made
    finally:
        problems = made.down()
        kept = made.keep_logs(tmp_path_factory.mktemp("k8s-lab-logs"))
        SUMMARY.append(f"k8s lab logs: {kept}")
        assert not problems, f"the lab's tear-down left: {problems}"


@pytest.fixture(scope="package")
def kube(lab: Lab) -> Kube:
    return lab.kube()


@pytest.fixture(scope="package")
def layout(lab: Lab) -> CgroupLayout:
    return detect_layout()


@pytest.fixture(autouse=True)
def no_test_pods_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    made = getattr(request.node, "funcargs", {}).get("lab")
    if isinstance(made, Lab):
        delete_all_test_pods(made.kube(), made)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
    outcome = yield
    report = outcome.get_result()
    fail_skip_where_required(report)
    made = getattr(item, "funcargs", {}).get("lab")
    if report.failed and isinstance(made, Lab):
        for name in ("kubelet", "containerd", "kube-controller-manager"):
            report.sections.append((f"k8s lab: {name} log", made.log_tail(name, LOG_LINES_ON_FAILURE)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The k8s lab section, unless tests/e2e_k8s's conftest prints it (both tiers in one run)."""
    k8s_tier = str(REPO / "tests" / "e2e_k8s" / "conftest.py")
    if any(getattr(plugin, "__file__", None) == k8s_tier
           for plugin in terminalreporter.config.pluginmanager.get_plugins()):
        return
    if SUMMARY:
        terminalreporter.section("k8s lab")
        for line in SUMMARY:
            terminalreporter.write_line(line)

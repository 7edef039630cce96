"""The k8s tier: one lab (tests/e2e_k8s/lab.py, what scripts/k8s-lab runs) brought up once for
all its tests and torn down after the last one. Where it cannot come up (not root, the
Kubernetes binaries not built, the runtimes missing, a bring-up failure) the tests skip with the
reason, and fail instead under NRI_NUMA_E2E_REQUIRED=1, as the other e2e tests do."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, detect_layout
from tests.e2e.harness.required import fail_skip_where_required
from tests.e2e.harness.runtimes import RuntimesUnavailable, ensure_runtimes
from tests.e2e.nri_agent import require_two_cpus
from tests.e2e_k8s.kube import Kube
from tests.e2e_k8s.lab import CONTAINERD_VERSION, DEVICE_PLUGIN, Lab, LabFailed, LabUnavailable, find_binaries
from tests.e2e_k8s.pods import SUMMARY, delete_all_test_pods

LOG_LINES_ON_FAILURE = 60


@pytest.fixture(scope="package")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The running lab. Its folder is short and under /tmp (NRI_NUMA_E2E_TMP): unix socket paths
    are limited to 108 bytes. Its logs are kept under pytest's base temp (k8s-lab-logs*/)."""
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes lab needs root: it runs containerd and a kubelet")
    require_two_cpus()
    try:
        binaries = find_binaries()
        runtimes = ensure_runtimes()
    except (LabUnavailable, RuntimesUnavailable) as exc:
        pytest.skip(f"the Kubernetes lab cannot run here: {exc}")
    folder = Path(tempfile.mkdtemp(prefix="nri-numa-k8s-", dir=os.environ.get("NRI_NUMA_E2E_TMP", "/tmp")))
    made = Lab(folder)
    progress: list[str] = []
    try:
        took = made.up(binaries, runtimes.containerd[CONTAINERD_VERSION], runtimes.busybox, progress.append)
    except (LabUnavailable, LabFailed) as exc:
        made.keep_logs(tmp_path_factory.mktemp("k8s-lab-logs"))
        pytest.skip(f"the Kubernetes lab did not come up: {exc}\nbring-up: " + "\n".join(progress))
    SUMMARY.append(f"k8s lab up in {took:.1f} s (Kubernetes {binaries.debian_version}, "
                   f"containerd {CONTAINERD_VERSION}): " + "; ".join(p.split("] ", 1)[-1] for p in progress[-1:]))
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
    """After each test (a failed one too) its pods are deleted and gone before the next starts."""
    yield
    made = getattr(request.node, "funcargs", {}).get("lab")
    if isinstance(made, Lab):
        delete_all_test_pods(made.kube(), made)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
    """Skips are failures where the e2e tests must run (NRI_NUMA_E2E_REQUIRED=1, set by .ci/run);
    a failure gets the tails of nri-numa's and the kubelet's logs."""
    outcome = yield
    report = outcome.get_result()
    fail_skip_where_required(report)
    made = getattr(item, "funcargs", {}).get("lab")
    if report.failed and isinstance(made, Lab):
        for name in ("nri-numa", "kubelet", "containerd", DEVICE_PLUGIN):
            if name == DEVICE_PLUGIN and not (made.logs / f"{name}.log").is_file():
                continue  # started only by the tests that need devices
            report.sections.append((f"k8s lab: {name} log", made.log_tail(name, LOG_LINES_ON_FAILURE)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("k8s lab")
        for line in SUMMARY:
            terminalreporter.write_line(line)

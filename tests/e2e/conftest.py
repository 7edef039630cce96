"""Fixtures for the end-to-end tests: the real runtimes (skipped, with the reason, only when not root
or when scripts/e2e-deps cannot fetch them), the busybox image, one private containerd per version
and module, a CRI client per test, and a timing table printed at the end of the run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, detect_layout, remove_cgroups
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient
from tests.e2e.harness.image import BuiltImage, build_image, import_image
from tests.e2e.harness.required import fail_skip_where_required
from tests.e2e.harness.runtimes import RUNTIME_VERSIONS, Runtimes, RuntimesUnavailable, ensure_runtimes
from tests.e2e.harness.timing import StepTimes

LOG_LINES_ON_FAILURE = 80
_STEP_TIMES = StepTimes()


@pytest.fixture(scope="session")
def runtime_versions() -> list[str]:
    return list(RUNTIME_VERSIONS)


@pytest.fixture(scope="session")
def step_times() -> StepTimes:
    return _STEP_TIMES


@pytest.fixture(scope="session")
def runtimes() -> Runtimes:
    if os.geteuid() != 0:
        pytest.skip("e2e tests need root: they run containerd and runc and create cgroups")
    try:
        return ensure_runtimes()
    except RuntimesUnavailable as exc:
        pytest.skip(f"real runtimes unavailable: {exc}")


@pytest.fixture(scope="session")
def cgroup_layout(runtimes: Runtimes) -> CgroupLayout:
    return detect_layout()


@pytest.fixture(scope="session")
def busybox_image(runtimes: Runtimes, tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    return build_image(runtimes.busybox, tmp_path_factory.mktemp("image"))


@pytest.fixture(scope="module", params=RUNTIME_VERSIONS)
def containerd(request: pytest.FixtureRequest, runtimes: Runtimes, busybox_image: BuiltImage,
               step_times: StepTimes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdDaemon]:
    """A private containerd of one version with NRI on, the busybox image imported (it is also the
    sandbox image). Its folder is short and under /tmp (NRI_NUMA_E2E_TMP) because unix socket
    paths are limited to 108 bytes."""
    version = request.param
    base = Path(tempfile.mkdtemp(prefix=f"nri-numa-e2e-{version}-", dir=os.environ.get("NRI_NUMA_E2E_TMP", "/tmp")))
    log = tmp_path_factory.mktemp("containerd-logs") / f"containerd-{version}.log"  # kept after the run
    daemon = ContainerdDaemon(runtimes.containerd[version], base, busybox_image.ref, log=log)
    try:
        step_times.add(version, "containerd start", daemon.start())
        with step_times.step(version, "ctr images import"):
            import_image(daemon.binaries.ctr, daemon.address, busybox_image)
        yield daemon
    finally:
        problems = daemon.cleanup()
        assert not problems, f"containerd {version} clean-up left: {problems}"


@pytest.fixture
def cri_client(containerd: ContainerdDaemon, cgroup_layout: CgroupLayout) -> Iterator[CriClient]:
    """A CRI client of the module's containerd; every pod it ran is stopped and removed after the
    test, and the pods' cgroups (which the kubelet would own) are removed too."""
    client = containerd.cri()
    try:
        yield client
    finally:
        errors = client.remove_all()
        busy = remove_cgroups(cgroup_layout, sorted(client.cgroup_parents))
        client.close()
        assert not errors and not busy, f"clean-up failed: {errors} {busy}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
    """On failure, attach the tail of the containerd log the test used. Where the e2e tests must
    run (``NRI_NUMA_E2E_REQUIRED=1``, set by .ci/run), a skip is a failure with its reason: a
    skipped end-to-end test proves nothing and must not pass as green."""
    outcome = yield
    report = outcome.get_result()
    fail_skip_where_required(report)
    daemon = getattr(item, "funcargs", {}).get("containerd")
    if report.failed and isinstance(daemon, ContainerdDaemon):
        report.sections.append(
            (f"containerd {daemon.version} log ({daemon.paths.log})", daemon.log_tail(LOG_LINES_ON_FAILURE)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _STEP_TIMES.rows:
        return
    terminalreporter.section("e2e step timings")
    for version, name, seconds in _STEP_TIMES.rows:
        terminalreporter.write_line(f"containerd {version:8} {name:40} {seconds * 1000:9.1f} ms")
    for version, seconds in _STEP_TIMES.totals().items():
        terminalreporter.write_line(f"containerd {version:8} {'total of the timed steps':40} {seconds:9.2f} s")

"""Fixtures of the vm tier: one numa-vm guest per session, booted with the layout
NRI_NUMA_VM_LAYOUT names (a file, or snc2 / cxl from tests/e2e_vm/layouts; default snc2), and the
pods each containerd version ran in it (tests/e2e_vm/guest_pods.py), run once per version.

Where the guest cannot run (not root, no QEMU, no image) the tests skip with one line saying why;
with NRI_NUMA_E2E_REQUIRED=1 (.ci/run) such a skip is a failure, as in tests/e2e."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness.required import fail_skip_where_required
from tests.e2e_vm import guest_plan
from tests.e2e_vm.layout import DEFAULT_LAYOUT, Layout, LayoutError, load_layout
from tests.e2e_vm.numa_vm import (QEMU, VmDir, VmError, console_tail, current_image, down, guest_run,
                                  refresh_sources, up)

LAYOUT_ENV = "NRI_NUMA_VM_LAYOUT"
RUNNING_GUEST_ENV = "NRI_NUMA_VM_DIR"
GUEST_PODS_TIMEOUT_S = 900
CONTAINERD_VERSIONS = ("1.7.24", "2.1.9")
_TIMES: list[str] = []  # printed at the end of the run


@dataclass
class Guest:
    vm: VmDir
    layout: Layout
    boot_s: float

    def run(self, argv: list[str], stdin: str | None = None, timeout_s: float = 120, check: bool = True):
        return guest_run(self.vm, argv, timeout_s=timeout_s, stdin=stdin, check=check)

    def json(self, argv: list[str], timeout_s: float = 120) -> object:
        return json.loads(self.run(argv, timeout_s=timeout_s).stdout)


@pytest.fixture(scope="session")
def vm_layout() -> Layout:
    running = os.environ.get(RUNNING_GUEST_ENV)
    given = str(Path(running) / "layout.json") if running else os.environ.get(LAYOUT_ENV, str(DEFAULT_LAYOUT))
    try:
        return load_layout(given)
    except LayoutError as exc:
        raise pytest.UsageError(f"{LAYOUT_ENV}={given}: {exc}") from None


@pytest.fixture(scope="session")
def guest(vm_layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    if os.geteuid() != 0:
        pytest.skip("the vm tier needs root: it builds its image in /var/cache/nri-numa and runs QEMU")
    if shutil.which(QEMU) is None and shutil.which("apt-get") is None:
        pytest.skip(f"{QEMU} is not installed and cannot be (no apt-get)")
    try:
        current_image()
    except VmError as exc:
        pytest.skip(f"no numa-vm guest image: {exc}")
    running = os.environ.get(RUNNING_GUEST_ENV)
    if running:
        # A guest `numa-vm up` left running (while working on the tests): the checkout is copied
        # in again, the guest is left running.
        vm = VmDir(Path(running).resolve())
        if vm.pid() is None:
            raise pytest.UsageError(f"{RUNNING_GUEST_ENV}={running}: no guest runs there")
        refresh_sources(vm)
        yield Guest(vm, vm_layout, float(vm.ready.read_text()))
        return
    vm = VmDir(tmp_path_factory.mktemp("numa-vm"))
    layout_file = os.environ.get(LAYOUT_ENV, str(DEFAULT_LAYOUT))
    up(vm, layout_file)  # stops what it started when it fails
    try:
        booted = Guest(vm, vm_layout, float(vm.ready.read_text()))
        _TIMES.append(f"boot (numa-vm up) {booted.boot_s:.1f} s")
        yield booted
    finally:
        down(vm)


@pytest.fixture(scope="session", params=CONTAINERD_VERSIONS)
def pods_run(request: pytest.FixtureRequest, guest: Guest) -> dict:
    """Every scenario of guest_plan on one containerd version, run once; the guest's answer."""
    plan = guest_plan.plan(guest.layout, request.param)
    done = guest.run(["python3", "-m", "tests.e2e_vm.guest_pods"], stdin=json.dumps(plan),
                     timeout_s=GUEST_PODS_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.fail(f"guest_pods on containerd {request.param} failed ({done.returncode}): {done.stderr[-3000:]}")
    answer = json.loads(done.stdout)
    (guest.vm / f"guest-pods-{request.param}.json").write_text(done.stdout)
    _TIMES.append(summary(request.param, answer))
    assert "error" not in answer, f"containerd {request.param}: {answer['error']}\n{answer['containerd_log_tail']}"
    return answer


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
    """Where the tier must run (NRI_NUMA_E2E_REQUIRED=1), a skip is a failure with its reason;
    a failure gets the tail of the guest's console."""
    outcome = yield
    report = outcome.get_result()
    fail_skip_where_required(report)
    running = getattr(item, "funcargs", {}).get("guest")
    if report.failed and isinstance(running, Guest):
        report.sections.append((f"guest console ({running.vm.console})", console_tail(running.vm, 40)))



def summary(version: str, answer: dict) -> str:
    """One line of figures of a guest_pods run: containerd's start, each scenario, the drift
    repairs and the agent's restart (guest seconds; the guest's clock runs slow under load)."""
    parts = [f"containerd {version}: start {answer.get('containerd_start_s')} s"]
    for name, got in answer.get("scenarios", {}).items():
        parts.append(f"{name} {got.get('seconds')} s")
        for pod_name, drift in got.get("drift", {}).items():
            parts.append(f"drift {pod_name} repaired in {drift.get('repaired_after_s')} s")
        if "churn" in got:
            churn = got["churn"]
            parts.append(f"churn: containerd restarted in {churn.get('containerd_restart_s')} s and "
                         f"{churn.get('second_containerd_restart_s')} s, new agent connected in "
                         f"{churn.get('agent_connect_s')} s, reconnected in {churn.get('agent_reconnect_s')} s")
        if "restart" in got:
            parts.append(f"restart: connected {got['restart']['connect_s']} s, "
                         f"synchronized {got['restart']['synchronized_s']} s")
    return "; ".join(parts)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _TIMES:
        terminalreporter.section("numa-vm figures")
        for line in filter(None, _TIMES):
            terminalreporter.write_line(line)

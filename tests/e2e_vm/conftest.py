"""Fixtures of the vm tier: the numa-vm guests of a session, one at a time, and the pods each
containerd version ran in a guest (tests/e2e_vm/guest_pods.py), run once per guest and version.

The first guest is booted with the layout NRI_NUMA_VM_LAYOUT names (a file, or snc2 / cxl from
tests/e2e_vm/layouts; default snc2) and every test runs on it. When that layout has no CPU-less
memory node, a second guest is booted from cxl.json after the first is down, for the tests marked
`memory_only_node` only (discovery and the Memory Manager, where such a node differs); its
containerd runs on guest_plan.ONE_VERSION alone, with guest_plan.memory_plan. Tests marked
`memory_only_node(exclusively=True)` run only on guests whose layout has such a node. A guest
left running (NRI_NUMA_VM_DIR) is the session's only guest.

Where the guest cannot run (not root, no QEMU, no image) the tests skip with one line saying why;
with NRI_NUMA_E2E_REQUIRED=1 (.ci/run) such a skip is a failure, as in tests/e2e."""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness.required import fail_skip_where_required
from tests.e2e_vm import guest_plan
from tests.e2e_vm.layout import DEFAULT_LAYOUT, LAYOUTS_DIR, Layout, LayoutError, load_layout
from tests.e2e_vm.numa_vm import (QEMU, VmDir, VmError, console_tail, current_image, down, guest_run,
                                  refresh_sources, up)

LAYOUT_ENV = "NRI_NUMA_VM_LAYOUT"
RUNNING_GUEST_ENV = "NRI_NUMA_VM_DIR"
GUEST_PODS_TIMEOUT_S = 900
CONTAINERD_VERSIONS = ("1.7.24", "2.1.9")
_TIMES: list[str] = []  # printed at the end of the run


MEMORY_ONLY_NODE_LAYOUT = LAYOUTS_DIR / "cxl.json"
MEMORY_ONLY_NODE_MARK = "memory_only_node"


@dataclass(frozen=True)
class GuestSpec:
    """A guest of the session: its layout file and whether every test runs on it (else only
    those marked memory_only_node)."""
    layout_file: str
    every_test: bool

    def layout(self) -> Layout:
        try:
            return load_layout(self.layout_file)
        except LayoutError as exc:
            raise pytest.UsageError(f"{LAYOUT_ENV}={self.layout_file}: {exc}") from None


@dataclass
class Guest:
    vm: VmDir
    layout: Layout
    boot_s: float
    every_test: bool

    def run(self, argv: list[str], stdin: str | None = None, timeout_s: float = 120, check: bool = True):
        return guest_run(self.vm, argv, timeout_s=timeout_s, stdin=stdin, check=check)

    def json(self, argv: list[str], timeout_s: float = 120) -> object:
        return json.loads(self.run(argv, timeout_s=timeout_s).stdout)


def has_memory_only_node(layout: Layout) -> bool:
    return any(not node.cpus for node in layout.nodes)


@functools.cache
def session_guests() -> tuple[GuestSpec, ...]:
    """The guests of this session, in boot order: the one every test runs on, then cxl's where
    the first has no memory-only node and none is left running."""
    running = os.environ.get(RUNNING_GUEST_ENV)
    if running:
        return (GuestSpec(str(Path(running) / "layout.json"), every_test=True),)
    first = GuestSpec(os.environ.get(LAYOUT_ENV, str(DEFAULT_LAYOUT)), every_test=True)
    if has_memory_only_node(first.layout()):
        return (first,)
    return first, GuestSpec(str(MEMORY_ONLY_NODE_LAYOUT), every_test=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test that needs a guest gets one parameter per guest it runs on, named by layout;
    on a guest only the memory_only_node tests run on, pods_run gets ONE_VERSION alone."""
    if "guest_spec" not in metafunc.fixturenames:
        return
    guests = session_guests()
    mark = metafunc.definition.get_closest_marker(MEMORY_ONLY_NODE_MARK)
    if mark is None:
        guests = [g for g in guests if g.every_test]
    elif mark.kwargs.get("exclusively"):
        guests = [g for g in guests if has_memory_only_node(g.layout())]
    ids = [g.layout().name for g in guests]
    pods_run_given = any("pods_run" in m.args[0] for m in metafunc.definition.iter_markers("parametrize"))
    if "pods_run" not in metafunc.fixturenames or pods_run_given:
        metafunc.parametrize("guest_spec", guests, ids=ids, indirect=True, scope="session")
        return
    pairs = [(g, v) for g in guests for v in (CONTAINERD_VERSIONS if g.every_test else (guest_plan.ONE_VERSION,))]
    metafunc.parametrize(("guest_spec", "pods_run"), pairs, ids=[f"{g.layout().name}-{v}" for g, v in pairs],
                         indirect=True, scope="session")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """After pytest's own grouping: the tests of each later guest move, in boot order, to just
    after the first guest's last test, so that one guest runs at a time (pytest ends a session
    fixture's instance before it makes the next) and the tier's tests stay together in a run
    over tests/. Other tests keep their order."""
    order = {spec: index for index, spec in enumerate(session_guests())}

    def guest_index(item: pytest.Item) -> int | None:
        callspec = getattr(item, "callspec", None)
        return order.get(callspec.params["guest_spec"]) if callspec and "guest_spec" in callspec.params else None

    later = sorted((item for item in items if (guest_index(item) or 0) > 0), key=guest_index)
    if not later:
        return
    moved = set(later)
    rest = [item for item in items if item not in moved]
    after = 1 + max((at for at, item in enumerate(rest) if guest_index(item) == 0), default=-1)
    items[:] = rest[:after] + later + rest[after:]


@pytest.fixture(scope="session")
def guest_spec(request: pytest.FixtureRequest) -> GuestSpec:
    """The guest a test runs on (a parameter from pytest_generate_tests)."""
    return request.param


@pytest.fixture(scope="session")
def vm_layout(guest_spec: GuestSpec) -> Layout:
    return guest_spec.layout()


@pytest.fixture(scope="session")
def guest(guest_spec: GuestSpec, vm_layout: Layout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
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
        yield Guest(vm, vm_layout, float(vm.ready.read_text()), guest_spec.every_test)
        return
    vm = VmDir(tmp_path_factory.mktemp("numa-vm"))
    up(vm, guest_spec.layout_file)  # stops what it started when it fails
    try:
        booted = Guest(vm, vm_layout, float(vm.ready.read_text()), guest_spec.every_test)
        _TIMES.append(f"{vm_layout.name}: boot (numa-vm up) {booted.boot_s:.1f} s")
        yield booted
    finally:
        down(vm)


@pytest.fixture(scope="session")
def pods_run(request: pytest.FixtureRequest, guest: Guest) -> dict:
    """The scenarios of guest_plan on one containerd version (a parameter from
    pytest_generate_tests), run once per guest: every one where every test runs on the guest,
    else the memory plan; the guest's answer."""
    make_plan = guest_plan.plan if guest.every_test else guest_plan.memory_plan
    plan = make_plan(guest.layout, request.param)
    done = guest.run(["python3", "-m", "tests.e2e_vm.guest_pods"], stdin=json.dumps(plan),
                     timeout_s=GUEST_PODS_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.fail(f"guest_pods on containerd {request.param} failed ({done.returncode}): {done.stderr[-3000:]}")
    answer = json.loads(done.stdout)
    (guest.vm / f"guest-pods-{request.param}.json").write_text(done.stdout)
    _TIMES.append(f"{guest.layout.name}: {summary(request.param, answer)}")
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

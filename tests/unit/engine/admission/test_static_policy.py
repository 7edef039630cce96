"""The static CPU Manager through ``admit``/``release``: kubelet's policy_static_test.go
TestStaticPolicyAdd, TestStaticPolicyRemove, TestStaticPolicyStart* and
TestStaticPolicyAddWithResvList (CPU reuse and hint-aware allocation: test_static_policy_reuse.py).

The upstream tests call the policy directly with a fake Topology Manager that has no hint; here the
topology policy is ``none``, whose merged hint is likewise empty. Where upstream reserves no CPU,
which a configuration cannot do, the machine gets a reserved twin socket
(``machines.with_reserved_twin``) so every original CPU stays available. Upstream states that
leave a CPU nowhere (neither shared nor assigned) give that CPU to another container, so that
every snapshot here passes ``EngineContext.check``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nri_numa.engine.admit import admit, release
from nri_numa.engine.allocations import AllocationsError
from nri_numa.engine.cpu import CPUTopology, take_cpus
from nri_numa.topology.cpulist import format_list

from tests.unit.engine.cpu.kubelet_fixtures import (DUAL_SOCKET_HT, DUAL_SOCKET_NO_HT,
                                                    QUAD_SOCKET_FOUR_WAY_HT, SINGLE_SOCKET_HT)

from .machines import (admitted, container, context, cpus, machine_from_cpus, pod, static_cpu,
                       with_assignments, with_reserved_twin)

FULL_PCPUS = {"full-pcpus-only": "true"}
STRICT = {"strict-cpu-reservation": "true"}
QUAD_ALL = QUAD_SOCKET_FOUR_WAY_HT.cpu_ids()
QUAD_SOCKET0 = QUAD_SOCKET_FOUR_WAY_HT.cpus_in_sockets([0])
QUAD_SOCKET1 = QUAD_SOCKET_FOUR_WAY_HT.cpus_in_sockets([1])


@dataclass(frozen=True)
class AddCase:
    description: str
    layout: CPUTopology
    reserved: frozenset[int] | None  # None: no reservation upstream (a reserved twin here)
    shared: frozenset[int]  # upstream stDefaultCPUSet, reserved CPUs aside
    assigned: dict[str, frozenset[int]]  # fakePod's containers already placed
    cpu_request: str
    cpu_limit: str
    expected: frozenset[int] | None = None  # exclusive CPUs; None: runs in the shared pool
    error: tuple[str, str] | None = None  # (reason, text the message holds)
    container: str = "fakeContainer3"
    elsewhere: frozenset[int] = field(default_factory=frozenset)  # CPUs upstream leaves nowhere


def run_add(case: AddCase, options: dict[str, str] | None = None):
    layout, reserved, shared = case.layout, case.reserved, case.shared
    if reserved is None:
        layout, reserved = with_reserved_twin(layout)
    shared = shared | reserved
    ctx = context(machine_from_cpus(layout),
                  **static_cpu(format_list(reserved), cpuManagerPolicyOptions=options or {}))
    assigned = dict(case.assigned)
    if case.elsewhere:
        assigned["placeholder"] = case.elsewhere
    allocs = with_assignments(ctx, shared, {"fakePod": assigned})
    ctx.check(allocs)
    request = pod("fakePod", container(case.container, case.cpu_limit, "1Gi",
                                       request_cpu=case.cpu_request))
    return ctx, allocs, admit(ctx, allocs, request)


def check_add(case: AddCase, options: dict[str, str] | None) -> None:
    ctx, before, result = run_add(case, options)
    if case.error is not None:
        reason, text = case.error
        rejection = result.decision.rejection
        assert rejection is not None, f"expected {reason}, got {result.decision.placements}"
        assert (rejection.reason, rejection.resource) == (reason, "cpu")
        assert text in rejection.message
        assert result.allocations is before
        return
    placement, = result.decision.placements
    ctx.check(result.allocations)
    if case.expected is None:
        assert not placement.exclusive and placement.cpus == result.allocations.shared
        return
    assert placement.exclusive and placement.cpus == case.expected, format_list(placement.cpus)
    assert not placement.cpus & result.allocations.shared


OPTIONS_INSENSITIVE = [
    AddCase("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", SINGLE_SOCKET_HT,
            cpus("0"), cpus("0-1,4-5"), {"fakeContainer100": cpus("2-3,6-7")}, "2", "2",
            cpus("1,5")),
    AddCase("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket", DUAL_SOCKET_HT,
            cpus("0"), cpus("0-1,3-11"), {"fakeContainer100": cpus("2")}, "6", "6",
            cpus("1,3,5,7,9,11")),
    AddCase("GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores", DUAL_SOCKET_HT,
            cpus("0"), cpus("0,2-4,6-11"), {"fakeContainer100": cpus("1,5")}, "6", "6",
            cpus("2-4,8-10")),
    AddCase("GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket", DUAL_SOCKET_NO_HT,
            cpus("0"), cpus("0-1,3-7"), {}, "4", "4", cpus("4-7"), container="fakeContainer1",
            elsewhere=cpus("2")),
    AddCase("GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores", DUAL_SOCKET_NO_HT,
            cpus("0"), cpus("0-1,3,6-7"), {"fakeContainer100": cpus("4-5")}, "4", "4",
            cpus("1,3,6-7"), container="fakeContainer1", elsewhere=cpus("2")),
    AddCase("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore", DUAL_SOCKET_HT,
            cpus("0"), cpus("0-1,3-11"), {"fakeContainer100": cpus("2")}, "8", "8",
            cpus("1,3-5,7,9-11")),
    AddCase("NonGuPod, SingleSocketHT, NoAlloc", SINGLE_SOCKET_HT, cpus("0"), cpus("0-7"), {},
            "1000m", "2000m", None, container="fakeContainer1"),
    AddCase("GuPodNonIntegerCore, SingleSocketHT, NoAlloc", SINGLE_SOCKET_HT, cpus("0"),
            cpus("0-7"), {}, "977m", "977m", None, container="fakeContainer4"),
    AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocSock0",
            QUAD_SOCKET_FOUR_WAY_HT, None, QUAD_ALL - cpus("3-7,11"),
            {"fakeContainer100": cpus("3-7,11")}, "72", "72", QUAD_SOCKET0,
            container="fakeContainer5"),
    AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllFullCoresFromThreeSockets",
            QUAD_SOCKET_FOUR_WAY_HT, None,
            cpus("1-2,9,11-13,23,25,35,38,48,51,53-54,61,113,173,233"),
            {"fakeContainer100": QUAD_ALL - cpus(
                "1-2,9,11-13,23,25,35,38,48,51,53-54,61,113,173,233")}, "12", "12",
            cpus("1,11,13,23,25,35,38,48,53,113,173,233"), container="fakeCcontainer5"),
    AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllSock1+FullCore",
            QUAD_SOCKET_FOUR_WAY_HT, None,
            QUAD_SOCKET1 | cpus("10,22,34,47,53,61,108,115,173,181,228,235"),
            {"fakeContainer100": QUAD_ALL - QUAD_SOCKET1
             - cpus("10,22,34,47,53,61,108,115,173,181,228,235")}, "76", "76",
            QUAD_SOCKET1 | cpus("10,22,34,47"), container="fakeContainer5"),
]

DEFAULT_OPTIONS = [
    AddCase("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", SINGLE_SOCKET_HT, cpus("0"),
            cpus("0-7"), {}, "1", "1", cpus("4"), container="fakeContainer2"),
    AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocCPUs",
            QUAD_SOCKET_FOUR_WAY_HT, None, cpus("10-11,52-53,67"),
            {"fakeContainer100": QUAD_ALL - cpus("10-11,37,52-53,55,67")}, "5", "5",
            cpus("10-11,52-53,67"), container="fakeContainer5", elsewhere=cpus("37,55")),
    AddCase("GuPodSingleCore, SingleSocketHT, ExpectError", SINGLE_SOCKET_HT, cpus("0"),
            cpus("0-7"), {}, "8", "8",
            error=("UnexpectedAdmissionError",
                   "not enough cpus available to satisfy request: requested=8, available=7"),
            container="fakeContainer2"),
    AddCase("GuPodMultipleCores, SingleSocketHT, ExpectSameAllocation", SINGLE_SOCKET_HT,
            cpus("0"), cpus("0-1,4-5"), {"fakeContainer3": cpus("2-3,6-7")}, "4", "4",
            cpus("2-3,6-7")),
    AddCase("GuPodMultipleCores, DualSocketHT, NoAllocExpectError", DUAL_SOCKET_HT, cpus("0"),
            cpus("0,4-11"), {"fakeContainer100": cpus("1-3")}, "10", "10",
            error=("UnexpectedAdmissionError",
                   "not enough cpus available to satisfy request: requested=10, available=8"),
            container="fakeContainer5"),
    AddCase("GuPodMultipleCores, SingleSocketHT, NoAllocExpectError", SINGLE_SOCKET_HT,
            cpus("0"), cpus("0,7"), {"fakeContainer100": cpus("1-6")}, "2", "2",
            error=("UnexpectedAdmissionError",
                   "not enough cpus available to satisfy request: requested=2, available=1"),
            container="fakeContainer5"),
    AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, NoAlloc", QUAD_SOCKET_FOUR_WAY_HT,
            None, cpus("10-11,37,52-53,55,67"),
            {"fakeContainer100": QUAD_ALL - cpus("10-11,37,52-53,55,67")}, "76", "76",
            error=("UnexpectedAdmissionError",
                   "not enough cpus available to satisfy request: requested=76, available=7"),
            container="fakeContainer5"),
]

# The kubelet's own pick for 8 reserved CPUs on the quad-socket machine (takeByTopology).
QUAD_RESERVED_8 = take_cpus(QUAD_SOCKET_FOUR_WAY_HT, QUAD_ALL, 8)

FULL_PCPUS_ONLY = [
    AddCase("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", SINGLE_SOCKET_HT, cpus("0"),
            cpus("0-7"), {}, "1", "1",
            error=("SMTAlignmentError",
                   "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"),
            container="fakeContainer2"),
    AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocOneCPUs",
            QUAD_SOCKET_FOUR_WAY_HT, QUAD_RESERVED_8, QUAD_ALL, {}, "15", "15",
            error=("SMTAlignmentError",
                   "SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4"),
            container="fakeContainer15"),
    AddCase("GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU", DUAL_SOCKET_HT,
            cpus("1,6"), cpus("0-11"), {}, "10", "10",
            error=("SMTAlignmentError",
                   "SMT Alignment Error: not enough free physical CPUs: available physical CPUs "
                   "= 8, requested CPUs = 10, CPUs per core = 2"),
            container="fakeContainerBug113537_1"),
    AddCase("GuPodManyCores, topoDualSocketHT, ExpectAllocAllCPUs", DUAL_SOCKET_HT,
            cpus("0,6"), cpus("0-11"), {}, "10", "10", cpus("1-5,7-11"),
            container="fakeContainerBug113537_2"),
]


@pytest.mark.parametrize("options", [None, FULL_PCPUS], ids=["default", "full-pcpus-only"])
@pytest.mark.parametrize("case", OPTIONS_INSENSITIVE, ids=lambda c: c.description)
def test_static_policy_add_whatever_the_options(case, options):
    check_add(case, options)


@pytest.mark.parametrize("case", DEFAULT_OPTIONS, ids=lambda c: c.description)
def test_static_policy_add(case):
    check_add(case, None)


@pytest.mark.parametrize("case", FULL_PCPUS_ONLY, ids=lambda c: c.description)
def test_static_policy_add_full_pcpus_only(case):
    check_add(case, FULL_PCPUS)


def test_auto_reserved_cpus_are_the_kubelets_pick():
    # GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs: 2 CPUs reserved by
    # count are one whole core, {0,6}, and a 10-CPU full-pcpus-only request gets the rest.
    ctx = context(machine_from_cpus(DUAL_SOCKET_HT), cpuManagerPolicy="static",
                  kubeReserved={"cpu": "1"}, systemReserved={"cpu": "500m"},
                  cpuManagerPolicyOptions=FULL_PCPUS)
    assert ctx.reserved_cpus == cpus("0,6")  # 1.5 CPUs round up to 2
    result = admitted(ctx, ctx.empty_allocations(), pod("fakePod", container("c", "10")))
    assert result.decision.placements[0].cpus == cpus("1-5,7-11")
    quad = context(machine_from_cpus(QUAD_SOCKET_FOUR_WAY_HT), cpuManagerPolicy="static",
                   kubeReserved={"cpu": "8"})
    assert quad.reserved_cpus == QUAD_RESERVED_8


# --- TestStaticPolicyAddWithResvList ------------------------------------------------------------

RESERVED_LIST = [
    AddCase("GuPodSingleCore, SingleSocketHT, ExpectError", SINGLE_SOCKET_HT, cpus("0"),
            cpus("0-7"), {}, "8", "8",
            error=("UnexpectedAdmissionError",
                   "not enough cpus available to satisfy request: requested=8, available=7"),
            container="fakeContainer2"),
    AddCase("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", SINGLE_SOCKET_HT, cpus("0-1"),
            cpus("0-7"), {}, "1", "1", cpus("4"), container="fakeContainer2"),
    AddCase("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", SINGLE_SOCKET_HT,
            cpus("0-1"), cpus("0-1,4-5"), {"fakeContainer100": cpus("2-3,6-7")}, "2", "2",
            cpus("4-5")),
]


@pytest.mark.parametrize("case", RESERVED_LIST, ids=lambda c: c.description)
def test_static_policy_add_with_reserved_list(case):
    check_add(case, None)


def test_shared_containers_run_on_the_reserved_cpus_unless_strict():
    topo = machine_from_cpus(DUAL_SOCKET_HT)
    burstable = pod("b", container("main", "2", "1Gi", request_cpu="500m"))
    loose = context(topo, **static_cpu("0,6"))
    assert admitted(loose, loose.empty_allocations(), burstable).decision.placements[0].cpus == \
        cpus("0-11")
    strict = context(topo, **static_cpu("0,6", cpuManagerPolicyOptions=STRICT))
    allocs = strict.empty_allocations()
    assert allocs.shared == cpus("1-5,7-11")  # "empty cpuset with StrictCPUReservationOption"
    assert admitted(strict, allocs, burstable).decision.placements[0].cpus == cpus("1-5,7-11")
    guaranteed = admitted(strict, allocs, pod("g", container("main", "8"))).allocations
    strict.check(guaranteed)
    assert not guaranteed.container("g", "main").exclusive_cpus & cpus("0,6")
    shared = admitted(strict, guaranteed, burstable).decision.placements[0].cpus
    assert shared == guaranteed.shared and len(shared) == 2 and not shared & cpus("0,6")
    back = release(strict, guaranteed, "g")
    strict.check(back)
    assert back == allocs


def test_strict_reservation_never_empties_the_shared_pool():
    strict = context(machine_from_cpus(DUAL_SOCKET_HT),
                     **static_cpu("0,6", cpuManagerPolicyOptions=STRICT))
    empty = strict.empty_allocations()
    refused = admit(strict, empty, pod("g", container("main", "10")))
    assert not refused.decision.admitted and refused.allocations is empty
    assert "would leave the shared pool empty" in refused.decision.rejection.message
    fits = admitted(strict, empty, pod("g", container("main", "9")))
    strict.check(fits.allocations)
    burstable = pod("b", container("main", "2", "1Gi", request_cpu="500m"))
    assert admitted(strict, fits.allocations, burstable).decision.placements[0].cpus


# --- TestStaticPolicyStart / TestStaticPolicyStartWithResvList: snapshots checked at start -----

START_CASES = [
    ("non-corrupted state", "1", {}, {"0": "0"}, "1-11", None),
    ("reserved core 6 is not in the shared pool", "0,6", {}, {}, "0-5,7-11",
     "shared pool and exclusive CPUs do not cover the CPUs exactly; missing 6"),
    ("some of strictly reserved cpus are in the shared pool", "0,6",
     STRICT, {}, "0-5,7-11",
     "shared pool and exclusive CPUs do not cover the CPUs exactly; unexpected 0"),
    ("assigned core 2 is still present in the shared pool", "11", {}, {"0": "0-2"}, "2-11",
     "CPUs 2 are both exclusive and in the shared pool"),
    ("assigned core 2 is still present (strict reservation)", "11",
     STRICT, {"0": "0-2"}, "2-10",
     "CPUs 2 are both exclusive and in the shared pool"),
    ("core 12 is not present in topology but is in state", "11", {},
     {"0": "0-2", "1": "3-4"}, "5-12", "unexpected 12"),
    ("core 11 is present in topology but is not in state", "10", {},
     {"0": "0-2", "1": "3-4"}, "5-10", "missing 11"),
    ("a reserved CPU allocated exclusively", "0", {}, {"0": "0"}, "1-11",
     "reserved CPUs 0 are allocated exclusively"),
]


@pytest.mark.parametrize(("name", "reserved", "options", "assigned", "shared", "error"),
                         START_CASES, ids=[c[0] for c in START_CASES])
def test_snapshots_are_checked_against_the_machine(name, reserved, options, assigned, shared,
                                                   error):
    ctx = context(machine_from_cpus(DUAL_SOCKET_HT),
                  **static_cpu(reserved, cpuManagerPolicyOptions=options))
    allocs = with_assignments(ctx, cpus(shared),
                              {"fakePod": {k: cpus(v) for k, v in assigned.items()}})
    if error is None:
        ctx.check(allocs)
    else:
        with pytest.raises(AllocationsError, match=error):
            ctx.check(allocs)


# --- TestStaticPolicyRemove ---------------------------------------------------------------------

REMOVE_CASES = [
    ("SingleSocketHT, DeAllocOneContainer", {"fakeContainer1": "1-3"}, "4-7", "fakeContainer1",
     "1-7"),
    ("SingleSocketHT, DeAllocOneContainer, BeginEmpty",
     {"fakeContainer1": "1-3", "fakeContainer2": "4-7"}, "", "fakeContainer1", "1-3"),
    ("SingleSocketHT, DeAllocTwoContainer", {"fakeContainer1": "1,3,5", "fakeContainer2": "2,4"},
     "6-7", "fakeContainer1", "1,3,5-7"),
    ("SingleSocketHT, NoDeAlloc", {"fakeContainer1": "1,3,5"}, "2,4,6-7", "fakeContainer2",
     "2,4,6-7"),
]


@pytest.mark.parametrize(("name", "assigned", "shared", "removed", "expected"), REMOVE_CASES,
                         ids=[c[0] for c in REMOVE_CASES])
def test_static_policy_remove(name, assigned, shared, removed, expected):
    ctx = context(machine_from_cpus(SINGLE_SOCKET_HT), **static_cpu("0"))
    allocs = with_assignments(ctx, cpus(shared),
                              {"fakePod": {k: cpus(v) for k, v in assigned.items()}})
    after = release(ctx, allocs, "fakePod", removed)
    assert after.shared == cpus(expected)
    assert after.container("fakePod", removed) is None

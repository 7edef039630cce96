"""Scopes, per-pod overrides, refusals and release with the real providers.

Machine: the kubelet's dual-socket HT layout (NUMA node 0 = even cores 0,2,4,6,8,10; node 1 = odd
ones), CPU 0 reserved, so node 0 has 5 CPUs to give and node 1 has 6.
"""

from __future__ import annotations

import pytest

from nri_numa.engine.admit import admit, release
from nri_numa.engine.annotations import TOPOLOGY_POLICY, TOPOLOGY_SCOPE

from tests.unit.engine.cpu.kubelet_fixtures import DUAL_SOCKET_HT

from .machines import (admitted, container, context, cpus, guaranteed_pod, machine_from_cpus,
                       manifest_pod, pod)

MACHINE = machine_from_cpus(DUAL_SOCKET_HT)
NODE0, NODE1 = cpus("0,2,4,6,8,10"), cpus("1,3,5,7,9,11")


def engine(policy: str = "single-numa-node", scope: str = "container", **more):
    return context(MACHINE, cpuManagerPolicy="static", reservedSystemCPUs="0",
                   topologyManagerPolicy=policy, topologyManagerScope=scope, **more)


def two_by_four(annotations=None):
    return pod("p", container("a", "4"), container("b", "4"), annotations=annotations)


# --- container scope against pod scope ----------------------------------------------------------

def test_container_scope_aligns_each_container_on_its_own_node():
    ctx = engine(scope="container")
    result = admitted(ctx, ctx.empty_allocations(), two_by_four())
    a, b = result.decision.placements
    assert (a.hint.affinity, b.hint.affinity) == ({0}, {1})
    assert a.cpus <= NODE0 and b.cpus <= NODE1
    assert a.mems is None and b.mems is None  # no Memory Manager: mems left alone
    assert [s.subject for s in result.steps] == ["a", "b"]


def test_pod_scope_refuses_a_pod_no_single_node_can_hold():
    ctx = engine(scope="pod")
    allocs = ctx.empty_allocations()
    result = admit(ctx, allocs, two_by_four())
    rejection = result.decision.rejection
    assert (rejection.container, rejection.reason) == (None, "TopologyAffinityError")
    assert rejection.message == (
        "TopologyAffinityError: pod: Resources cannot be allocated with Topology locality "
        "(topology policy single-numa-node); cpu: asked 8 exclusive CPUs; free node 0: 5 CPUs, "
        "node 1: 6 CPUs")
    assert result.allocations is allocs
    assert [s.subject for s in result.steps] == ["pod"]


@pytest.mark.parametrize("policy", ["best-effort", "restricted"])
def test_pod_scope_puts_the_whole_pod_on_the_nodes_of_one_hint(policy):
    ctx = engine(policy, "pod")
    result = admitted(ctx, ctx.empty_allocations(), two_by_four())
    a, b = result.decision.placements
    assert a.hint == b.hint == result.allocations.pod("p").pod_hint
    assert a.hint.affinity == {0, 1} and a.hint.preferred
    assert not a.cpus & b.cpus


def test_pod_scope_admits_containers_one_at_a_time_on_the_pod_hint():
    ctx = engine(scope="pod")
    request = pod("p", container("a", "2"), container("b", "2"))
    first = admitted(ctx, ctx.empty_allocations(), request, ["a"])
    assert [s.subject for s in first.steps] == ["pod"]
    pod_hint = first.allocations.pod("p").pod_hint
    assert pod_hint.affinity == {0} and pod_hint.preferred
    # Another pod takes node 0's best cores in between; the pod still has room there.
    between = admitted(ctx, first.allocations, guaranteed_pod("q", "1")).allocations
    second = admitted(ctx, between, request, ["b"])
    assert second.steps == ()  # no second merge: the kept hint is used
    placement, = second.decision.placements
    assert placement.hint == pod_hint and placement.cpus <= NODE0
    assert list(second.allocations.pod("p").containers) == ["a", "b"]
    ctx.check(second.allocations)


def test_admitting_an_admitted_container_again_changes_nothing():
    ctx = engine(scope="pod", memoryManagerPolicy="Static",
                 reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}])
    request = pod("p", container("a", "2"), container("b", "2"))
    once = admitted(ctx, ctx.empty_allocations(), request, ["a"])
    twice = admitted(ctx, once.allocations, request, ["a"])
    assert twice.allocations == once.allocations
    assert twice.decision.placements == once.decision.placements


def test_a_later_container_that_no_longer_fits_the_pod_hint_is_refused():
    ctx = engine(scope="pod")
    request = pod("p", container("a", "2"), container("b", "2"))
    allocs = admitted(ctx, ctx.empty_allocations(), request, ["a"]).allocations
    # Node 0 had 5 CPUs; "a" took 2, "q" takes the other 3.
    allocs = admitted(ctx, allocs, guaranteed_pod("q", "3")).allocations
    result = admit(ctx, allocs, request, ["b"])
    assert not result.decision.admitted
    assert result.allocations is allocs
    assert result.decision.rejection.reason == "TopologyAffinityError"
    assert "no longer fits on the pod's NUMA nodes {0}" in result.decision.rejection.message


# --- per-pod overrides ------------------------------------------------------------------------

def test_a_pod_may_narrow_the_policy():
    ctx = engine("best-effort")
    limits = {"cpu": "8", "memory": "1Gi"}
    big = manifest_pod("big", limits)
    assert admitted(ctx, ctx.empty_allocations(), big).decision.policy == "best-effort"
    narrowed = manifest_pod("big", limits, {TOPOLOGY_POLICY: "single-numa-node"})
    result = admit(ctx, ctx.empty_allocations(), narrowed)
    assert result.decision.policy == "single-numa-node"
    assert result.decision.rejection.reason == "TopologyAffinityError"
    assert "(topology policy single-numa-node)" in result.decision.rejection.message


def test_a_pod_may_narrow_the_scope():
    ctx = engine(scope="container")
    result = admit(ctx, ctx.empty_allocations(), two_by_four({TOPOLOGY_SCOPE: "pod"}))
    assert result.decision.scope == "pod"
    assert result.decision.rejection.container is None  # refused as a whole pod


def test_a_narrowed_pod_that_fits_is_placed_under_its_own_policy():
    ctx = engine("best-effort")
    request = pod("p", container("main", "4"), annotations={TOPOLOGY_POLICY: "restricted"})
    result = admitted(ctx, ctx.empty_allocations(), request)
    assert (result.decision.policy, result.decision.scope) == ("restricted", "container")
    assert result.decision.placements[0].hint.preferred


@pytest.mark.parametrize(("config", "annotations", "message"), [
    ({"policy": "restricted"}, {TOPOLOGY_POLICY: "best-effort"},
     'annotation numa.nri.io/topology-policy: "best-effort" is looser than this node\'s '
     'topologyManagerPolicy "restricted"'),
    ({"scope": "pod"}, {TOPOLOGY_SCOPE: "container"},
     'annotation numa.nri.io/topology-scope: "container" is looser than this node\'s '
     'topologyManagerScope "pod"'),
    ({"policy": "none"}, {TOPOLOGY_POLICY: "strict"},
     'annotation numa.nri.io/topology-policy: "strict" is not one of none, best-effort, '
     'restricted, single-numa-node'),
    ({"policy": "none"}, {"numa.nri.io/topology-polcy": "restricted"},
     "annotation numa.nri.io/topology-polcy: unknown"),
    ({"policy": "none", "allowPodOverrides": False}, {TOPOLOGY_POLICY: "restricted"},
     "pod overrides are disabled on this node (allowPodOverrides: false)"),
])
def test_an_override_the_node_does_not_allow_is_refused_by_name(config, annotations, message):
    ctx = engine(config.pop("policy", "single-numa-node"), config.pop("scope", "container"),
                 **config)
    allocs = ctx.empty_allocations()
    result = admit(ctx, allocs, pod("p", container("main", "1"), annotations=annotations))
    rejection = result.decision.rejection
    assert rejection.reason == "InvalidAnnotation"
    assert message in rejection.message
    assert result.allocations is allocs and result.steps == ()


def test_every_refusal_reports_the_shared_pool_as_it_stands():
    ctx = engine("restricted")
    allocs = admitted(ctx, ctx.empty_allocations(), guaranteed_pod("g", "2")).allocations
    topology = admit(ctx, allocs, guaranteed_pod("big", "11"))
    annotation = admit(ctx, allocs, pod("bad", container("main", "1"),
                                        annotations={TOPOLOGY_POLICY: "none"}))
    assert topology.decision.shared_pool == allocs.shared
    assert annotation.decision.shared_pool == allocs.shared


# --- refusal messages ---------------------------------------------------------------------------

def test_a_container_refusal_names_the_container_the_ask_and_what_each_node_has():
    ctx = engine()
    allocs = admitted(ctx, ctx.empty_allocations(), guaranteed_pod("g", "3")).allocations
    result = admit(ctx, allocs, pod("p", container("small", "1"), container("large", "7"),
                                    container("later", "1")))
    rejection = result.decision.rejection
    assert rejection.container == "large"
    assert rejection.message.startswith(
        "TopologyAffinityError: container large: Resources cannot be allocated with Topology "
        "locality (topology policy single-numa-node); cpu: asked 7 exclusive CPUs; free ")
    assert [(d.resource, d.asked) for d in rejection.demands] == [("cpu", "7 exclusive CPUs")]
    # Nothing of the pod was kept, not even its first container.
    assert result.allocations is allocs


def test_a_refusal_of_the_first_container_reports_exactly_what_each_node_had():
    ctx = engine()
    allocs = admitted(ctx, ctx.empty_allocations(), guaranteed_pod("g", "3")).allocations
    result = admit(ctx, allocs, pod("p", container("large", "7"), container("small", "1")))
    rejection = result.decision.rejection
    assert rejection.message == (
        "TopologyAffinityError: container large: Resources cannot be allocated with Topology "
        "locality (topology policy single-numa-node); cpu: asked 7 exclusive CPUs; free node 0: "
        "2 CPUs, node 1: 6 CPUs")
    assert [(d.resource, d.asked, dict(d.free_per_node)) for d in rejection.demands] == [
        ("cpu", "7 exclusive CPUs", {0: "2 CPUs", 1: "6 CPUs"})]


def test_the_decision_serialises_with_the_refusal():
    ctx = engine()
    decision = admit(ctx, ctx.empty_allocations(), guaranteed_pod("big", "7")).decision
    data = decision.to_dict()
    assert data["admitted"] is False and data["placements"] == []
    assert data["rejection"]["demands"] == [
        {"resource": "cpu", "asked": "7 exclusive CPUs",
         "free_per_node": {"0": "5 CPUs", "1": "6 CPUs"}}]
    assert data["shared_pool"] == "0-11"


# --- release ------------------------------------------------------------------------------------

@pytest.mark.parametrize("scope", ["container", "pod"])
def test_releasing_one_container_returns_its_cpus_and_keeps_the_rest(scope):
    ctx = engine("restricted", scope)
    request = pod("p", container("a", "2"), container("b", "2"), container("c", "1", "1Gi",
                                                                            request_cpu="500m"))
    allocs = admitted(ctx, ctx.empty_allocations(), request).allocations
    a_cpus = allocs.container("p", "a").exclusive_cpus
    b_cpus = allocs.container("p", "b").exclusive_cpus
    after = release(ctx, allocs, "p", "a")
    ctx.check(after)
    assert after.shared == allocs.shared | a_cpus
    assert after.container("p", "a") is None
    assert after.container("p", "b").exclusive_cpus == b_cpus
    assert release(ctx, after, "p", "a") == after  # already gone


def test_releasing_a_pod_returns_everything_it_held():
    ctx = engine("best-effort", memoryManagerPolicy="Static",
                 reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}])
    before = admitted(ctx, ctx.empty_allocations(), guaranteed_pod("g", "2", "2Gi")).allocations
    request = pod("p", container("a", "2", "3Gi"), container("b", "1", "2Gi"))
    during = admitted(ctx, before, request).allocations
    assert release(ctx, during, "p") == before
    assert release(ctx, release(ctx, during, "p"), "g") == ctx.empty_allocations()


def test_a_released_container_comes_back_on_the_kept_pod_hint():
    ctx = engine(scope="pod")
    request = pod("p", container("a", "2"), container("b", "2"))
    allocs = admitted(ctx, ctx.empty_allocations(), request).allocations
    pod_hint = allocs.pod("p").pod_hint
    allocs = release(ctx, allocs, "p", "b")
    assert allocs.pod("p").pod_hint == pod_hint
    again = admitted(ctx, allocs, request, ["b"])
    assert again.steps == () and again.decision.placements[0].hint == pod_hint


def test_best_effort_places_a_later_container_even_off_the_pod_nodes():
    ctx = engine("best-effort", scope="pod")
    request = pod("p", container("a", "2"), container("b", "2"))
    allocs = admitted(ctx, ctx.empty_allocations(), request, ["a"]).allocations
    allocs = admitted(ctx, allocs, guaranteed_pod("q", "3")).allocations
    result = admitted(ctx, allocs, request, ["b"])
    assert len(result.decision.placements[0].cpus) == 2
    assert not result.decision.placements[0].cpus <= NODE0

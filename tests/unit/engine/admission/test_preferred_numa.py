"""The scheduler's NUMA nodes as the engine's input (``PodRequest.preferred_numa``, issue 13
item 3): the merges count only hints inside them while that admits; otherwise the pod is decided
anew, and the decision says why the choice was stale. It never widens what the pod gets."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nri_numa.engine.admit import admit
from nri_numa.engine.annotations import (SCHEDULED_NUMA_NODES, AnnotationError, pod_topology,
                                         scheduled_numa_nodes)
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.decision import PreferredNuma
from nri_numa.engine.request import PodRequest, RequestError
from nri_numa.engine.merge import MachineMerge
from nri_numa.engine.hints import Hint
from tests.integration.nri.plugin_env import machine
from tests.unit.engine.admission.machines import container, context, guaranteed_pod, pod

# Two nodes of four single-thread CPUs: 0-3 and 4-7; CPU 0 reserved.
STATIC = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}


def ctx_for(policy: str, **more):
    return context(machine(), topologyManagerPolicy=policy, **STATIC, **more)


def nodes_of(decision) -> set[int]:
    return {n for p in decision.placements for n in (p.hint.affinity or ())}


@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_a_pod_that_fits_on_the_chosen_node_lands_there(policy):
    ctx = ctx_for(policy)
    plain = admit(ctx, ctx.empty_allocations(), guaranteed_pod("p", "2")).decision
    assert nodes_of(plain) == {0}  # the kubelet's narrowest-then-lowest node
    chosen = admit(ctx, ctx.empty_allocations(),
                   replace(guaranteed_pod("p", "2"), preferred_numa={1})).decision
    assert chosen.admitted and nodes_of(chosen) == {1}
    assert chosen.placements[0].cpus <= {4, 5, 6, 7}
    assert chosen.preferred_numa == PreferredNuma(frozenset({1}), True)


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_a_full_chosen_node_is_stale_and_the_pod_is_decided_anew(policy):
    ctx = ctx_for(policy)
    full = admit(ctx, ctx.empty_allocations(),
                 replace(guaranteed_pod("big", "4"), preferred_numa={1})).allocations
    decision = admit(ctx, full, replace(guaranteed_pod("p", "2"), preferred_numa={1})).decision
    assert decision.admitted and nodes_of(decision) == {0}
    assert decision.preferred_numa.nodes == {1} and not decision.preferred_numa.honoured
    assert "inside NUMA nodes 1" in decision.preferred_numa.stale_because
    plain = admit(ctx, full, guaranteed_pod("p", "2")).decision
    assert replace(decision, preferred_numa=None) == plain


def test_best_effort_too_decides_anew_rather_than_spill_outside_the_choice():
    ctx = ctx_for("best-effort")
    # Node 1's four CPUs taken: a 2-CPU pod told node 1 gets node 0, aligned, not node 1 plus
    # whatever best-effort would spill onto.
    full = admit(ctx, ctx.empty_allocations(),
                 replace(guaranteed_pod("big", "4"), preferred_numa={1})).allocations
    decision = admit(ctx, full, replace(guaranteed_pod("p", "2"), preferred_numa={1})).decision
    assert decision.admitted and not decision.preferred_numa.honoured
    assert nodes_of(decision) == {0} and decision.placements[0].cpus <= {1, 2, 3}
    assert "inside NUMA nodes 1" in decision.preferred_numa.stale_because


def test_a_wider_choice_never_widens_a_single_numa_node_pod():
    ctx = ctx_for("single-numa-node")
    decision = admit(ctx, ctx.empty_allocations(),
                     replace(guaranteed_pod("p", "1"), preferred_numa={0, 1})).decision
    assert decision.admitted and decision.preferred_numa.honoured
    assert len(nodes_of(decision)) == 1 and len(decision.placements[0].cpus) == 1
    # A pod too big for one node stays refused whatever it was given.
    too_big = admit(ctx, ctx.empty_allocations(),
                    replace(guaranteed_pod("q", "5"), preferred_numa={0, 1})).decision
    assert not too_big.admitted and too_big.rejection.reason == "TopologyAffinityError"


def test_shared_and_best_effort_containers_are_unaffected():
    ctx = ctx_for("restricted")
    burstable = pod("b", container("main", "2", request_cpu="500m"))
    best_effort = pod("e", container("main", None, None))
    for request in (burstable, best_effort):
        plain = admit(ctx, ctx.empty_allocations(), request).decision
        chosen = admit(ctx, ctx.empty_allocations(),
                       replace(request, preferred_numa={1})).decision
        assert chosen.preferred_numa.honoured
        assert replace(chosen, preferred_numa=None) == plain


def test_a_node_id_the_machine_lacks_is_stale_not_an_error():
    ctx = ctx_for("restricted")
    decision = admit(ctx, ctx.empty_allocations(),
                     replace(guaranteed_pod("p", "2"), preferred_numa={7})).decision
    assert decision.admitted and nodes_of(decision) == {0}
    assert decision.preferred_numa.stale_because == "NUMA node 7 is not on this machine"


def test_policy_none_has_nothing_to_narrow():
    ctx = ctx_for("none")
    decision = admit(ctx, ctx.empty_allocations(),
                     replace(guaranteed_pod("p", "2"), preferred_numa={1})).decision
    assert decision.admitted and decision.preferred_numa is None


def test_pod_scope_places_every_container_inside_the_choice():
    ctx = ctx_for("restricted", topologyManagerScope="pod")
    request = pod("p", container("a", "1"), container("b", "2"))
    decision = admit(ctx, ctx.empty_allocations(), replace(request, preferred_numa={1})).decision
    assert decision.preferred_numa.honoured
    assert all(p.cpus <= {4, 5, 6, 7} for p in decision.placements)


def test_the_merge_keeps_the_kubelets_ranking_inside_the_choice():
    merge = MachineMerge.build([0, 1, 2, 3])

    def h(nodes, preferred):
        return Hint(frozenset(nodes), preferred)

    hints = [{"cpu": [h({0}, True), h({2}, True), h({2, 3}, False)]}]
    assert merge.merge("best-effort", hints) == (h({0}, True), True)
    assert merge.merge("best-effort", hints, frozenset({2, 3})) == (h({2}, True), True)
    # Nothing inside: the kubelet's "nothing merged", not a hint outside the choice.
    assert merge.merge("restricted", hints, frozenset({1})) == (h({0, 1, 2, 3}, False), False)
    # A non-preferred best inside the choice.
    assert merge.merge("best-effort", [{"cpu": [h({0, 1}, True), h({2, 3}, False)]}],
                       frozenset({2, 3})) == (h({2, 3}, False), True)


def test_the_annotation_is_read_strictly_and_never_refuses_the_pod():
    ids = (0, 1)
    assert scheduled_numa_nodes({}, ids) is None
    assert scheduled_numa_nodes({SCHEDULED_NUMA_NODES: "1"}, ids) == {1}
    assert scheduled_numa_nodes({SCHEDULED_NUMA_NODES: "0-1"}, ids) == {0, 1}
    for bad, words in (("x", "bad element"), ("", "names no NUMA node"),
                       ("3", "NUMA node 3 of '3' is not on this machine"),
                       ("0," * 200, "at most 256 characters"), ("0-70000", "65535")):
        with pytest.raises(AnnotationError, match=words) as e:
            scheduled_numa_nodes({SCHEDULED_NUMA_NODES: bad}, ids)
        assert "\n" not in str(e.value) and str(e.value).startswith(
            f"annotation {SCHEDULED_NUMA_NODES}: ")
    # Known to the override check, whatever its value and even where overrides are off.
    config = config_from_mapping({**STATIC, "topologyManagerPolicy": "restricted",
                                  "allowPodOverrides": False})
    pod_topology(config, {SCHEDULED_NUMA_NODES: "junk" * 2000})


def test_preferred_numa_must_name_node_ids():
    for bad in (set(), {-1}, {True}, {70000}, "1"):
        with pytest.raises(RequestError, match="preferred_numa"):
            PodRequest(uid="u", namespace="n", name="p", preferred_numa=bad)


def test_under_pod_scope_a_later_container_follows_the_pods_nodes_and_says_so():
    """Containers come one at a time (NRI): the first decides the pod's NUMA nodes; a later
    one lands there, and when those are not the scheduler's, its decision says so too."""
    ctx = ctx_for("restricted", topologyManagerScope="pod")
    full = admit(ctx, ctx.empty_allocations(),
                 replace(guaranteed_pod("big", "4"), preferred_numa={1})).allocations
    first = pod("p", container("a", "1"))
    result = admit(ctx, full, replace(first, preferred_numa={1}), ["a"])
    assert not result.decision.preferred_numa.honoured
    assert result.decision.placements[0].cpus <= {1, 2, 3}
    both = pod("p", container("a", "1"), container("b", "1"))
    later = admit(ctx, result.allocations, replace(both, preferred_numa={1}), ["b"]).decision
    assert later.admitted and later.placements[0].cpus <= {1, 2, 3}
    assert not later.preferred_numa.honoured
    assert "the pod's NUMA nodes {0} were chosen at an earlier container" in \
        later.preferred_numa.stale_because
    # A pod whose nodes are the scheduler's: every later container is honoured.
    ok = admit(ctx, ctx.empty_allocations(), replace(first, preferred_numa={1}), ["a"])
    again = admit(ctx, ok.allocations, replace(both, preferred_numa={1}), ["b"]).decision
    assert again.preferred_numa.honoured and again.placements[0].cpus <= {4, 5, 6, 7}

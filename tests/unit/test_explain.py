"""Why the merge picks what it picks: the rule that decided, the runner-up, and the text."""

from __future__ import annotations

import itertools
import random

import pytest

from nri_numa.engine.bitmask import bits, mask_of
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint
from nri_numa.engine.merge import merge_hints
from nri_numa.topology.synthetic import preset_topology
from nri_numa.views.explain import LabeledSlot, Rule, explain_merge, explain_pod, labeled_slots
from nri_numa.views.explain_render import compact_hints, explanation_dict, render_text
from nri_numa.views.simulate import InputError, parse_entry


def h(*nodes: int, pref: bool = True) -> Hint:
    return Hint(frozenset(nodes), pref)


ANY = Hint(None, True)


def why(policy: str, nodes: list[int], *hint_lists, distances=None, closest=False):
    providers = [(f"p{i}", {f"r{i}": hints}) for i, hints in enumerate(hint_lists)]
    verdict = explain_merge(policy, nodes, labeled_slots(providers), distances=distances,
                            prefer_closest=closest)
    # The explanation must name the hint the engine's merge returns.
    options = {"prefer-closest-numa-nodes": "true"} if closest else {}
    merged, _ = merge_hints(policy, nodes, [p for _, p in providers], distances=distances,
                            options=options)
    winner = verdict.winner
    if policy == "single-numa-node" and winner.affinity == frozenset(nodes):
        winner = Hint(None, winner.preferred)
    assert winner == merged
    return verdict


# --- each rule ------------------------------------------------------------------------


def test_preferred_beats_non_preferred():
    v = why("best-effort", [0, 1], [h(0), h(0, 1, pref=False)], [h(0), h(1, pref=False)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.PREFERRED, h(0), h(1, pref=False))
    assert "a preferred hint beats any non-preferred one" in v.reason


def test_narrowest_among_preferred():
    v = why("restricted", [0, 1], [h(0), h(0, 1)], [h(0), h(0, 1)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.NARROWEST, h(0), h(0, 1))
    assert "{0} spans 1 node, {0,1} spans 2 nodes" in v.reason


def test_lower_mask_breaks_a_tie():
    v = why("best-effort", [0, 1], [h(0), h(1)], [h(0), h(1)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.LOWER_MASK, h(0), h(1))


FOUR_NODES = [[10, 20, 20, 20], [20, 10, 20, 20], [20, 20, 10, 11], [20, 20, 11, 10]]


def test_closest_beats_the_lower_mask_with_prefer_closest():
    hints = [h(0, 1), h(2, 3)]
    v = why("best-effort", [0, 1, 2, 3], hints, distances=FOUR_NODES, closest=True)
    assert (v.rule, v.winner, v.runner_up) == (Rule.CLOSEST, h(2, 3), h(0, 1))
    assert "{2,3} 10.5, {0,1} 15" in v.reason
    plain = why("best-effort", [0, 1, 2, 3], hints, distances=FOUR_NODES)
    assert (plain.rule, plain.winner) == (Rule.LOWER_MASK, h(0, 1))


def test_equally_close_tie_names_the_lower_mask_that_lost_on_distance():
    hints = [h(0, 1), h(2, 3), h(0, 2)]
    table = [[10, 30, 30, 30], [30, 10, 30, 30], [30, 30, 10, 11], [30, 30, 11, 10]]
    table[0][2] = table[2][0] = 11
    v = why("best-effort", [0, 1, 2, 3], hints, distances=table, closest=True)
    assert (v.rule, v.winner, v.runner_up) == (Rule.LOWER_MASK, h(0, 2), h(2, 3))
    assert "{0,1} is lower still but farther (average distance 20)" in v.reason


def test_single_numa_node_ignores_prefer_closest():
    v = why("single-numa-node", [0, 1, 2, 3], [h(1), h(2)], distances=FOUR_NODES, closest=True)
    assert (v.rule, v.winner) == (Rule.LOWER_MASK, h(1))
    assert v.reason.startswith("single-numa-node keeps only preferred one-node hints")


def test_non_preferred_tier_exact_count_first():
    # Nothing preferred agrees; merges reach {1} and {0,1}; the target is 2 nodes.
    v = why("best-effort", [0, 1, 2], [h(0, 1)], [h(2), h(1, 2, pref=False), h(0, 1, 2, pref=False)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.NODE_COUNT_TIER, h(0, 1, pref=False),
                                               h(1, pref=False))
    assert "ranked by node count against 2" in v.reason
    assert "{0,1} has exactly 2 nodes, {1} has 1 node, fewer than 2" in v.reason


def test_non_preferred_fewer_beats_more_than_the_target():
    # Target 2 (r0's narrowest); the merges reach only {1} (fewer) and {1,2,3} (more).
    v = why("best-effort", [0, 1, 2, 3], [h(0, 1, pref=False), h(0, 1, 2, 3, pref=False)],
            [h(1, pref=False), h(1, 2, 3, pref=False)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.NODE_COUNT_TIER, h(1, pref=False),
                                               h(1, 2, 3, pref=False))
    assert "{1} has 1 node, fewer than 2, {1,2,3} has 3 nodes, more than 2" in v.reason


def test_non_preferred_same_count_falls_to_the_mask():
    v = why("best-effort", [0, 1, 2], [h(0, 1), h(0, 1, 2, pref=False)],
            [h(2), h(1, 2, pref=False), h(0, 1, 2, pref=False)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.LOWER_MASK, h(0, 1, pref=False),
                                               h(1, 2, pref=False))
    assert v.reason.startswith("no combination of preferred hints agrees")


def test_missing_hint_under_single_numa_node_names_the_resource():
    v = why("single-numa-node", [0, 1], [h(0, 1)], [h(0), h(1)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.MISSING_HINTS, h(0, 1, pref=False), None)
    assert v.reason.startswith("r0: single-numa-node drops all its hints")


def test_a_resource_no_node_can_hold():
    v = why("single-numa-node", [0, 1], [], [h(0), h(1)])
    assert v.rule is Rule.MISSING_HINTS
    assert v.reason.startswith("r0: no NUMA node can hold it, so no combination")
    be = why("best-effort", [0, 1], [], [h(0), h(1)])
    assert be.reason.startswith("r0: no NUMA node can hold it; ")
    assert be.winner == h(0, pref=False)


def test_no_common_node():
    v = why("best-effort", [0, 1], [h(0, pref=False)], [h(1, pref=False)])
    assert (v.rule, v.winner) == (Rule.NO_COMMON_NODE, h(0, 1, pref=False))


def test_no_preference_anywhere():
    v = why("best-effort", [0, 1], None, [ANY])
    assert (v.rule, v.winner, v.runner_up) == (Rule.NO_PREFERENCE, h(0, 1), None)


def test_only_candidate():
    v = why("restricted", [0, 1], [h(1), h(0, 1, pref=False)], [h(1), h(0, 1, pref=False)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.PREFERRED, h(1), h(0, 1, pref=False))
    only = why("restricted", [0, 1], [h(1)], [h(1)])
    assert (only.rule, only.winner, only.runner_up) == (Rule.ONLY_CANDIDATE, h(1), None)


def test_policy_none_does_not_merge():
    v = explain_merge("none", [0, 1], labeled_slots([("cpu", {"cpu": [h(0)]})]))
    assert (v.rule, v.winner) == (Rule.NO_ALIGNMENT, Hint(None, False))


def test_sparse_node_ids():
    v = why("best-effort", [0, 70], [h(70), h(0, 70)], [h(70), h(0, 70)])
    assert (v.rule, v.winner, v.runner_up) == (Rule.NARROWEST, h(70), h(0, 70))


# --- the ranking against brute force ----------------------------------------------------


def brute_force_order(nodes, slots, policy, distances, closest):
    """Every distinct merged hint, best first, by walking every combination (the kubelet's way)."""
    whole = mask_of(nodes)
    if policy == "single-numa-node":
        slots = [[x for x in s if x.preferred and (x.mask is None or x.mask.bit_count() == 1)]
                 for s in slots]
    merged = set()
    for combo in itertools.product(*slots):
        named = [x.mask for x in combo if x.mask is not None]
        mask = whole
        for m in named:
            mask &= m
        preferred = all(x.preferred for x in combo) and len(set(named)) <= 1
        if mask:
            merged.add((mask, preferred))
    target = max((min(x.mask.bit_count() for x in s if x.mask is not None)
                  for s in slots if any(x.mask is not None for x in s)), default=0)
    row = {n: i for i, n in enumerate(nodes)}

    def avg(m):
        ids = bits(m)
        return sum(distances[row[a]][row[b]] for a in ids for b in ids) / len(ids) ** 2

    def fit(m):
        use = closest and policy != "single-numa-node"
        return (m.bit_count(), avg(m), m) if use else (m.bit_count(), m)

    def key(item):
        m, p = item
        c = m.bit_count()
        tier = 0 if c == target else target - c if c < target else c
        return (0, fit(m)) if p else (1, tier, fit(m))

    ordered, seen = [], set()
    for m, p in sorted(merged, key=key):
        if m not in seen:  # a mask reachable both ways counts once, as its better self
            seen.add(m)
            ordered.append(Hint(bits(m), p))
    return ordered


def test_winner_and_runner_up_match_brute_force():
    rng = random.Random(7)
    checked = 0
    for _ in range(400):
        nodes = sorted(rng.sample(range(6), rng.randint(1, 4)))
        table = [[10 if i == j else rng.choice([11, 12, 21, 32]) for j in nodes] for i in nodes]
        slots = []
        for _ in range(rng.randint(1, 3)):
            hints = [Hint(None if rng.random() < 0.1 else rng.sample(nodes, rng.randint(1, len(nodes))),
                          rng.random() < 0.6) for _ in range(rng.randint(1, 4))]
            slots.append(hints)
        policy = rng.choice(["best-effort", "restricted", "single-numa-node"])
        closest = rng.random() < 0.5
        ordered = brute_force_order(nodes, slots, policy, table, closest)
        if not ordered:
            continue
        v = why(policy, nodes, *slots, distances=table, closest=closest)
        assert v.winner == ordered[0]
        assert v.runner_up == (ordered[1] if len(ordered) > 1 else None)
        checked += 1
    assert checked > 250


# --- slots and compact lists -------------------------------------------------------------


def test_labeled_slots_follow_the_merge():
    slots = labeled_slots([("cpu", None), ("memory", {}),
                           ("devices", {"a/gpu": [], "b/nic": None, "c/x": [h(1)]})])
    assert [(s.provider, s.resource, s.hints) for s in slots] == [
        ("cpu", None, (ANY,)), ("memory", None, (ANY,)),
        ("devices", "a/gpu", (Hint(None, False),)), ("devices", "b/nic", (ANY,)),
        ("devices", "c/x", (h(1),))]
    assert LabeledSlot("cpu", None, (ANY,)).label == "cpu (no preference)"


def test_compact_hints():
    assert compact_hints([h(0), h(0, 1, pref=False)]) == "{0}* {0,1}"
    assert compact_hints([]) == "none: no NUMA node can hold it"
    long = [h(n) for n in range(10)]
    assert compact_hints(long) == "10 hints: {0}* {1}* {2}* {3}* {4}* {5}* …"
    assert compact_hints(long[:8]).count("*") == 8


# --- one pod from a file ----------------------------------------------------------------


def pod(name: str, cpu: str, gpus: int = 0, namespace: str = "default") -> dict:
    limits = {"cpu": cpu, "memory": "1Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "app", "resources": {"limits": limits}},
                                    {"name": "side", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}


@pytest.fixture(scope="module")
def pcie() -> EngineContext:
    config = config_from_mapping({"topologyManagerPolicy": "restricted", "cpuManagerPolicy": "static",
                                  "reservedSystemCPUs": "0,32"})
    return EngineContext.build(preset_topology("pcie-4gpu"), config)


def test_explain_pod_against_the_state_before_it(pcie):
    entries = [parse_entry(pod("a", "4", gpus=2), "document 1"),
               parse_entry({"delete": "nosuch"}, "document 2"),
               parse_entry(pod("b", "4", gpus=2), "document 3"),
               parse_entry(pod("b", "4", gpus=2, namespace="other"), "document 4")]
    ex = explain_pod(pcie, entries, "default/b")
    assert ex.entry.where == "document 3" and len(ex.before) == 2
    assert [s.where for s in ex.errors] == ["document 2"]
    assert list(ex.state.pods) == ["default/a"]
    assert [m.step.subject for m in ex.merges] == ["app", "side"]
    app = ex.merges[0]
    gpu = next(s for s in app.slots if s.resource == "nvidia.com/gpu")
    # a took the two GPUs of node 0; b's two can only be on node 1
    assert [x for x in gpu.hints if x.preferred] == [h(1)]
    assert app.verdict.winner == h(1) and app.step.merged == h(1)
    text = render_text(ex, pcie)
    assert "merge for container app" in text and "nvidia.com/gpu  {1}*" in text
    assert "policy: restricted admits only a preferred result: admitted" in text
    data = explanation_dict(ex)
    assert data["merges"][0]["why"]["winner"] == {"affinity": [1], "preferred": True}
    assert data["decision"]["admitted"] is True


def test_explain_pod_scope_has_one_merge(pcie):
    config = config_from_mapping({"topologyManagerPolicy": "single-numa-node",
                                  "topologyManagerScope": "pod", "cpuManagerPolicy": "static",
                                  "reservedSystemCPUs": "0,32"})
    ctx = EngineContext.build(pcie.topology, config)
    ex = explain_pod(ctx, [parse_entry(pod("a", "40"), "document 1")], "default/a")
    (merge,) = ex.merges
    assert merge.step.subject == "pod" and merge.step.admitted is False
    assert merge.verdict.rule is Rule.MISSING_HINTS and "cpu: single-numa-node drops" in merge.verdict.reason
    assert "merge for the whole pod (pod scope)" in render_text(ex, ctx)
    assert "decision: refused: TopologyAffinityError" in render_text(ex, ctx)


def test_explain_unknown_pod(pcie):
    with pytest.raises(InputError, match=r"no pod default/zz in pods.yaml \(pods: default/a\)"):
        explain_pod(pcie, [parse_entry(pod("a", "2"), "document 1")], "default/zz", "pods.yaml")

"""The Topology Manager's wiring with stub providers: kubelet's topology_manager_test.go TestAdmit,
scope_container_test.go / scope_pod_test.go (what the providers' hints look like when they reach
the merge) and scope_test.go (stored affinity, container removal).

Stub providers (``stubs.StubProvider``, the kubelet's mockHintProvider) stand in for the real
ones: ``admit`` runs with ``nri_numa.engine.admit.PROVIDERS`` replaced, and the scope functions
run on a ``ScopeRun`` built with stubs. The machine is the kubelet tests' two NUMA nodes.
"""

from __future__ import annotations

import importlib

import pytest

from nri_numa.engine.admit import admit, release
from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import AllocationFailure, ResourceDemand
from nri_numa.engine.request import ContainerKind
from nri_numa.engine.scope import Refused, ScopeRun
from nri_numa.engine.scope import container as container_scope
from nri_numa.engine.scope import pod as pod_scope

from tests.unit.engine.cpu.kubelet_fixtures import DUAL_SOCKET_HT

from .machines import container, context, machine_from_cpus, pod
from .stubs import StubProvider, hint

# The package re-exports the function ``admit`` under the module's name.
ADMIT_MODULE = importlib.import_module("nri_numa.engine.admit")
TWO_NODES = machine_from_cpus(DUAL_SOCKET_HT)
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")

ONE_PREFERRED = {"resource": [hint(0), hint(0, 1, preferred=False)]}
TWO_PREFERRED = {"resource": [hint(0), hint(1), hint(0, 1, preferred=False)]}
NONE_PREFERRED = {"resource": [hint(0, 1, preferred=False)]}


def best_effort_qos():
    return pod("be", container("main", None, None))


def burstable_qos():
    return pod("bu", container("main", "2", "1Gi", request_cpu="1"))


def guaranteed_qos():
    return pod("gu", container("main", "2", "1Gi"))


# (name, pod builder, policy, provider hints — None: no provider at all, admitted)
ADMIT_CASES = [
    ("BestEffort QoS, none policy, no providers", best_effort_qos, "none", None, True),
    ("Guaranteed QoS, none policy, no providers", guaranteed_qos, "none", None, True),
    ("BestEffort QoS, single-numa-node, provider without hints", best_effort_qos,
     "single-numa-node", {}, True),
    ("BestEffort QoS, restricted, provider without hints", best_effort_qos, "restricted", {},
     True),
    ("Guaranteed QoS, best-effort, preferred affinity", guaranteed_qos, "best-effort",
     ONE_PREFERRED, True),
    ("Guaranteed QoS, best-effort, more than one preferred", guaranteed_qos, "best-effort",
     TWO_PREFERRED, True),
    ("Burstable QoS, best-effort, more than one preferred", burstable_qos, "best-effort",
     TWO_PREFERRED, True),
    ("Guaranteed QoS, best-effort, no preferred affinity", guaranteed_qos, "best-effort",
     NONE_PREFERRED, True),
    ("Guaranteed QoS, restricted, preferred affinity", guaranteed_qos, "restricted",
     ONE_PREFERRED, True),
    ("Burstable QoS, restricted, preferred affinity", burstable_qos, "restricted",
     ONE_PREFERRED, True),
    ("Guaranteed QoS, restricted, more than one preferred", guaranteed_qos, "restricted",
     TWO_PREFERRED, True),
    ("Burstable QoS, restricted, more than one preferred", burstable_qos, "restricted",
     TWO_PREFERRED, True),
    ("Guaranteed QoS, restricted, no preferred affinity", guaranteed_qos, "restricted",
     NONE_PREFERRED, False),
    ("Burstable QoS, restricted, no preferred affinity", burstable_qos, "restricted",
     NONE_PREFERRED, False),
    # single-numa-node rows of our own: a preferred hint must be one node.
    ("Guaranteed QoS, single-numa-node, preferred affinity", guaranteed_qos,
     "single-numa-node", ONE_PREFERRED, True),
    ("Guaranteed QoS, single-numa-node, only a preferred two-node hint", guaranteed_qos,
     "single-numa-node", {"resource": [hint(0, 1)]}, False),
    ("Guaranteed QoS, single-numa-node, a resource nowhere satisfiable", guaranteed_qos,
     "single-numa-node", {"resource": []}, False),
]


@pytest.fixture
def stub_providers(monkeypatch):
    """Replace the engine's providers for one test; returns a setter taking the stubs."""
    def install(*stubs: StubProvider) -> None:
        monkeypatch.setattr(ADMIT_MODULE, "PROVIDERS", tuple(stubs))
    return install


@pytest.mark.parametrize("scope", SCOPES)
@pytest.mark.parametrize(("name", "make_pod", "policy", "hints", "expected"), ADMIT_CASES,
                         ids=[c[0] for c in ADMIT_CASES])
def test_admit(stub_providers, scope, name, make_pod, policy, hints, expected):
    stub_providers(*([] if hints is None else [StubProvider(hints=hints)]))
    ctx = context(TWO_NODES, topologyManagerPolicy=policy, topologyManagerScope=scope)
    allocs = ctx.empty_allocations()
    result = admit(ctx, allocs, make_pod())
    assert result.decision.admitted is expected
    assert result.decision.policy == policy and result.decision.scope == scope
    if expected:
        assert [p.container for p in result.decision.placements] == ["main"]
    else:
        rejection = result.decision.rejection
        assert rejection.reason == "TopologyAffinityError"
        assert "Resources cannot be allocated with Topology locality" in rejection.message
        assert rejection.container == ("main" if scope == "container" else None)
        assert result.allocations is allocs


# --- what reaches the merge: scope_container_test / scope_pod_test -----------------------------

ACCUMULATE_CASES = [
    ("no hint providers", []),
    ("provider returns an empty map", [{}]),
    ("provider returns a nil list for a resource", [{"resource": None}]),
    ("assorted providers", [
        {"resource-1/A": [hint(0), hint(0, 1, preferred=False)],
         "resource-1/B": [hint(1), hint(1, 2, preferred=False)]},
        {"resource-2/A": [hint(2), hint(3, 4, preferred=False)],
         "resource-2/B": [hint(2), hint(3, 4, preferred=False)]},
        {"resource-3": None}]),
    ("two providers, one resource each", [{"resource1": [Hint(None, False)]},
                                          {"resource2": [Hint(None, False)]}]),
    ("one provider with hints, one with nil", [{"resource1": [Hint(None, False)]}, None]),
    ("one provider with hints, one empty", [{"resource1": [Hint(None, False)]}, {}]),
    ("one provider, two resources", [{"resource1": [Hint(None, False)],
                                      "resource2": [Hint(None, False)]}]),
]


ACCUMULATE_IDS = [c[0] for c in ACCUMULATE_CASES]


def scope_run(stubs: list[StubProvider], policy: str = "best-effort") -> ScopeRun:
    ctx = context(TWO_NODES, topologyManagerPolicy=policy)
    return ScopeRun(ctx, stubs, policy)


@pytest.mark.parametrize(("name", "answers"), ACCUMULATE_CASES, ids=ACCUMULATE_IDS)
def test_container_scope_hands_every_providers_hints_to_the_merge(name, answers):
    stubs = [StubProvider(f"p{i}", a) for i, a in enumerate(answers)]
    run = scope_run(stubs, "none")
    request = pod("p", container("one", "1"), container("two", "1"))
    container_scope.admit_containers(run, run.ctx.empty_allocations(), request,
                                     request.containers)
    assert [s.subject for s in run.steps] == ["one", "two"]
    expected = tuple((f"p{i}", a) for i, a in enumerate(answers))
    assert all(step.hints == expected for step in run.steps)


@pytest.mark.parametrize(("name", "answers"), ACCUMULATE_CASES, ids=ACCUMULATE_IDS)
def test_pod_scope_hands_every_providers_hints_to_one_merge(name, answers):
    stubs = [StubProvider(f"p{i}", a) for i, a in enumerate(answers)]
    run = scope_run(stubs, "none")
    request = pod("p", container("one", "1"), container("two", "1"))
    pod_scope.admit_containers(run, run.ctx.empty_allocations(), request, request.containers)
    assert [s.subject for s in run.steps] == ["pod"]
    assert run.steps[0].hints == tuple((f"p{i}", a) for i, a in enumerate(answers))


# --- the merge result on two nodes: topology_manager_test.go TestCalculateAffinity -------------

CALCULATE_CASES = [
    ("TopologyHint not set", "best-effort", [], Hint({0, 1}, True)),
    ("provider returns an empty map", "best-effort", [{}], Hint({0, 1}, True)),
    ("provider returns a nil list", "best-effort", [{"resource": None}], Hint({0, 1}, True)),
    ("provider returns an empty list", "best-effort", [{"resource": []}], Hint({0, 1}, False)),
    ("single hint, preferred, nil affinity", "best-effort",
     [{"resource": [Hint(None, True)]}], Hint({0, 1}, True)),
    ("single hint, not preferred, nil affinity", "best-effort",
     [{"resource": [Hint(None, False)]}], Hint({0, 1}, False)),
    ("two providers, same mask, both preferred", "best-effort",
     [{"r1": [hint(1)]}, {"r2": [hint(1)]}], hint(1)),
    # The 2019 table expected {0} preferred here; since the merge asks every preferred mask
    # to be equal (docs/kubelet-algorithms.md §3.5), the result is no longer preferred.
    ("two providers, one wider mask, both preferred", "best-effort",
     [{"r1": [hint(0)]}, {"r2": [hint(0, 1)]}], hint(0, preferred=False)),
    ("two providers, no common mask", "best-effort",
     [{"r1": [hint(0)]}, {"r2": [hint(1)]}], Hint({0, 1}, False)),
    ("two providers, same mask, one not preferred", "best-effort",
     [{"r1": [hint(1)]}, {"r2": [hint(1, preferred=False)]}], hint(1, preferred=False)),
    ("one provider without hints, one preferred", "best-effort",
     [None, {"resource": [hint(1)]}], hint(1)),
    ("two hints against one matching", "best-effort",
     [{"r1": [hint(0), hint(1)]}, {"r2": [hint(1)]}], hint(1)),
    ("two hints against a non-preferred wide one", "best-effort",
     [{"r1": [hint(0), hint(1)]}, {"r2": [hint(0, 1, preferred=False)]}],
     hint(0, preferred=False)),
    ("less narrow preferred beats narrower non-preferred", "best-effort",
     [{"r1": [hint(1), hint(0, 1, preferred=False)]},
      {"r2": [hint(0), hint(1), hint(0, 1, preferred=False)]}], hint(1)),
    ("single-numa-node drops a preferred two-node hint", "single-numa-node",
     [{"r1": [hint(0, 1)], "r2": [hint(0), hint(1), hint(0, 1, preferred=False)]}],
     Hint(None, False)),
    ("single-numa-node with one no-preference provider", "single-numa-node",
     [{"r1": [hint(0), hint(1), hint(0, 1, preferred=False)]}, None], hint(0)),
]


@pytest.mark.parametrize(("name", "policy", "answers", "expected"), CALCULATE_CASES,
                         ids=[c[0] for c in CALCULATE_CASES])
def test_merged_affinity_on_two_nodes(name, policy, answers, expected):
    run = scope_run([StubProvider(f"p{i}", a) for i, a in enumerate(answers)], policy)
    request = pod("p", container("main", "1"))
    if policy == "single-numa-node" and not expected.preferred:
        with pytest.raises(Refused) as refused:
            container_scope.admit_containers(run, run.ctx.empty_allocations(), request,
                                             request.containers)
        assert refused.value.reason == "TopologyAffinityError"
    else:
        container_scope.admit_containers(run, run.ctx.empty_allocations(), request,
                                         request.containers)
    assert run.steps[0].merged == expected


# --- the order of asks and allocations ---------------------------------------------------------

def spec_order_pod():
    return pod("p", container("app-1", "1"), container("app-2", "1"),
               inits=[container("init", "1", kind=ContainerKind.INIT),
                      container("sidecar", "1", kind=ContainerKind.SIDECAR)])


def test_container_scope_asks_then_allocates_each_container_in_spec_order(stub_providers):
    stub = StubProvider(hints={"resource": [hint(1)]})
    stub_providers(stub)
    ctx = context(TWO_NODES, topologyManagerPolicy="restricted")
    result = admit(ctx, ctx.empty_allocations(), spec_order_pod())
    assert result.decision.admitted
    names = ("init", "sidecar", "app-1", "app-2")
    assert stub.calls == [call for n in names
                          for call in (("container_hints", n), ("allocate", n, hint(1)))]
    assert [p.container for p in result.decision.placements] == list(names)


def test_pod_scope_asks_once_then_allocates_every_container_on_the_pod_hint(stub_providers):
    stub = StubProvider(hints={"resource": [hint(1)]})
    stub_providers(stub)
    ctx = context(TWO_NODES, topologyManagerPolicy="restricted", topologyManagerScope="pod")
    result = admit(ctx, ctx.empty_allocations(), spec_order_pod())
    names = ("init", "sidecar", "app-1", "app-2")
    assert stub.calls == [("pod_hints", "p")] + [("allocate", n, hint(1)) for n in names]
    assert result.allocations.pod("p").pod_hint == hint(1)
    assert all(p.hint == hint(1) for p in result.decision.placements)


def test_pod_scope_merges_once_for_containers_admitted_one_at_a_time(stub_providers):
    stub = StubProvider(hints={"resource": [hint(1)]})
    stub_providers(stub)
    ctx = context(TWO_NODES, topologyManagerPolicy="restricted", topologyManagerScope="pod")
    allocs = ctx.empty_allocations()
    for name in ("init", "sidecar", "app-1", "app-2"):
        result = admit(ctx, allocs, spec_order_pod(), [name])
        assert [p.container for p in result.decision.placements] == [name]
        allocs = result.allocations
    stub.hints = {"resource": [hint(0)]}  # the machine changed; the pod keeps its hint
    assert [c[0] for c in stub.calls].count("pod_hints") == 1
    assert {c.hint for c in allocs.pod("p").containers.values()} == {hint(1)}


def test_the_stored_affinity_is_the_merged_hint_and_none_before_admission(stub_providers):
    stub_providers(StubProvider(hints={"resource": [hint(0), hint(1)]}))
    ctx = context(TWO_NODES, topologyManagerPolicy="best-effort")
    allocs = ctx.empty_allocations()
    assert allocs.container("p", "main") is None  # scope_test.go TestGetAffinity: nothing yet
    result = admit(ctx, allocs, pod("p", container("main", "1")))
    assert result.allocations.container("p", "main").hint == hint(0)
    assert result.allocations.pod("p").pod_hint is None  # container scope keeps no pod hint


# --- allocation failures ------------------------------------------------------------------------

def test_a_failed_allocation_refuses_with_the_providers_reason_and_changes_nothing(stub_providers):
    failing = StubProvider("gpu", {"example.com/gpu": [hint(1)]},
                           failure=AllocationFailure("example.com/gpu", "UnexpectedAdmissionError",
                                                     "requested number of devices unavailable"),
                           demand=ResourceDemand("example.com/gpu", "2 devices",
                                                 {0: "0 free", 1: "1 free"}))
    other = StubProvider("other", None,
                         demand=ResourceDemand("cpu", "2 exclusive CPUs", {0: "4 CPUs"}))
    stub_providers(other, failing)
    ctx = context(TWO_NODES, topologyManagerPolicy="restricted")
    allocs = ctx.empty_allocations()
    result = admit(ctx, allocs, pod("p", container("first", "1"), container("second", "1")))
    rejection = result.decision.rejection
    assert (rejection.container, rejection.reason, rejection.resource) == (
        "first", "UnexpectedAdmissionError", "example.com/gpu")
    # Only the failing resource's demand is reported.
    assert [d.resource for d in rejection.demands] == ["example.com/gpu"]
    assert rejection.message == (
        "UnexpectedAdmissionError: container first: requested number of devices unavailable "
        "(topology policy restricted); example.com/gpu: asked 2 devices; free node 0: 0 free, "
        "node 1: 1 free")
    assert result.allocations is allocs
    assert ("allocate", "second", hint(1)) not in failing.calls


def test_admitting_a_container_the_pod_lacks_is_an_error(stub_providers):
    stub_providers()
    ctx = context(TWO_NODES)
    with pytest.raises(ValueError, match="pod p has no container named ghost"):
        admit(ctx, ctx.empty_allocations(), pod("p", container("main", "1")), ["ghost"])


# --- scope_test.go TestRemoveContainer ----------------------------------------------------------

@pytest.mark.parametrize("scope", SCOPES)
def test_removing_containers_drops_their_hints_and_then_the_pod(stub_providers, scope):
    stub = StubProvider(hints={"resource": [hint(1)]})
    stub_providers(stub)
    ctx = context(TWO_NODES, topologyManagerPolicy="best-effort", topologyManagerScope=scope)
    two = pod("p", container("nginx", "1"), container("busybox", "1"))
    allocs = admit(ctx, ctx.empty_allocations(), two).allocations
    allocs = admit(ctx, allocs, pod("q", container("other", "1"))).allocations
    allocs = release(ctx, allocs, "p", "nginx")
    assert list(allocs.pod("p").containers) == ["busybox"]
    allocs = release(ctx, allocs, "p", "busybox")
    assert list(allocs.pods) == ["q"]
    assert stub.calls[-2:] == [("release", "nginx"), ("release", "busybox")]
    assert release(ctx, allocs, "p") is allocs  # unknown pod: nothing to do

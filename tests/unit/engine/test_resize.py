"""In-place resize (KEP-5554 semantics): grow next to the held CPUs, shrink never below the
admitted ones, refusals leave the allocations as they were."""

from dataclasses import replace

from nri_numa.engine.admit import admit, release
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.resize import INFEASIBLE, resize
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic import MachineSpec, build_topology


def context(**config) -> EngineContext:
    # Eight CPUs, one thread per core: node 0 holds 0-3, node 1 holds 4-7; CPU 0 reserved.
    machine = build_topology(MachineSpec(name="two", sockets=1, nodes_per_socket=2,
                                         cores_per_node=4, threads_per_core=1))
    settings = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                "topologyManagerPolicy": "single-numa-node", **config}
    return EngineContext.build(machine, config_from_mapping(settings))


def pod(name: str, cpu: str, memory: str = "1Gi"):
    resources = {"limits": {"cpu": cpu, "memory": memory},
                 "requests": {"cpu": cpu, "memory": memory}}
    return pod_from_manifest({"metadata": {"name": name},
                              "spec": {"containers": [{"name": "main", "resources": resources}]}})


def admitted(ctx, allocs, p):
    result = admit(ctx, allocs, p)
    assert result.decision.admitted, result.decision.rejection
    return result.allocations


def resized(ctx, allocs, before_pod, cpu, memory="1Gi"):
    after_pod = pod(before_pod.name, cpu, memory)
    after_pod = replace(after_pod, uid=before_pod.uid)
    return resize(ctx, allocs, after_pod, before_pod.containers[0], after_pod.containers[0])


def held(allocs: Allocations, p) -> frozenset[int]:
    return allocs.container(p.uid, "main").exclusive_cpus


def test_growing_keeps_the_cpus_and_adds_aligned_ones():
    ctx = context()
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    first = held(allocs, p)
    result = resized(ctx, allocs, p, "3")
    assert result.decision.admitted
    now = held(result.allocations, p)
    assert first < now and len(now) == 3
    assert len(ctx.nodes_of_cpus(now)) == 1  # on the node it was on
    assert result.decision.placements[0].cpus == now
    assert result.allocations.shared == ctx.empty_allocations().shared - now


def test_shrinking_gives_back_the_added_cpus_and_never_the_admitted_ones():
    ctx = context()
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    first = held(allocs, p)
    grown = resized(ctx, allocs, p, "3").allocations
    bigger = replace(pod("g", "3"), uid=p.uid)
    back = resized(ctx, grown, bigger, "2")
    assert back.decision.admitted
    assert held(back.allocations, p) == first
    assert back.allocations == allocs  # the admitted record is gone with the extra CPUs
    below = resized(ctx, grown, bigger, "1")
    assert below.decision.rejection.reason == INFEASIBLE
    assert "admitted with" in below.decision.rejection.message
    assert below.allocations is grown


def test_a_grow_that_does_not_fit_is_refused_and_changes_nothing():
    ctx = context()
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    result = resized(ctx, allocs, p, "5")  # a NUMA node holds 4 CPUs
    assert not result.decision.admitted
    assert result.decision.rejection.reason == "UnexpectedAdmissionError"
    assert "on NUMA node" in result.decision.rejection.message
    assert result.allocations is allocs
    # Without a strict policy the extra CPUs may come from the other node.
    loose = context(topologyManagerPolicy="best-effort")
    allocs = admitted(loose, loose.empty_allocations(), p)
    assert len(held(resized(loose, allocs, p, "5").allocations, p)) == 5


def test_a_grow_never_empties_the_shared_pool():
    ctx = context(topologyManagerPolicy="none")
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    result = resized(ctx, allocs, p, "7")  # 7 of 8 with CPU 0 reserved: pool would be {0}
    assert result.decision.admitted
    assert result.allocations.shared == {0}
    refused = resized(ctx, allocs, p, "8")
    assert not refused.decision.admitted and refused.allocations is allocs


def test_moving_between_shared_and_exclusive_is_refused():
    ctx = context()
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    to_shared = resized(ctx, allocs, p, "2500m")
    assert to_shared.decision.rejection.reason == INFEASIBLE
    assert to_shared.allocations is allocs
    s = pod("s", "1500m")
    allocs = admitted(ctx, ctx.empty_allocations(), s)
    to_exclusive = resized(ctx, allocs, s, "2")
    assert to_exclusive.decision.rejection.reason == INFEASIBLE


def test_a_shared_container_stays_in_the_shared_pool():
    ctx = context()
    s = pod("s", "500m")
    allocs = admitted(ctx, ctx.empty_allocations(), s)
    result = resized(ctx, allocs, s, "1500m")
    assert result.decision.admitted
    assert result.allocations is allocs
    assert not result.decision.placements[0].exclusive


def test_memory_the_memory_manager_placed_is_not_resized():
    ctx = context(memoryManagerPolicy="Static",
                  reservedMemory=[{"numaNode": 0, "limits": {"memory": "100Mi"}}],
                  kubeReserved={"memory": "100Mi"})
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    result = resized(ctx, allocs, p, "2", "2Gi")
    assert result.decision.rejection.reason == INFEASIBLE
    assert result.decision.rejection.resource == "memory"
    assert result.allocations is allocs
    assert resized(ctx, allocs, p, "3").decision.admitted  # CPU alone still resizes


def test_the_resized_allocation_survives_the_checkpoint_and_release():
    ctx = context()
    p = pod("g", "2")
    ledger = Ledger(ctx)
    ledger.admit(p)
    first = held(ledger.allocations, p)
    bigger = replace(pod("g", "3"), uid=p.uid)
    assert ledger.resize(bigger, p.containers[0], bigger.containers[0]).decision.admitted
    restored = Ledger.restore(ctx, ledger.to_dict())
    assert restored.allocations == ledger.allocations
    assert restored.allocations.container(p.uid, "main").original_cpus == first
    refused = restored.resize(pod("g", "1"), bigger.containers[0],
                              replace(pod("g", "1"), uid=p.uid).containers[0])
    assert not refused.decision.admitted
    assert release(ctx, restored.allocations, p.uid) == ctx.empty_allocations()


def test_a_checkpoint_without_resizes_has_no_new_key():
    ctx = context()
    p = pod("g", "2")
    allocs = admitted(ctx, ctx.empty_allocations(), p)
    entry = allocs.to_dict()["pods"][p.uid]["containers"]["main"]
    assert "admitted_cpus" not in entry

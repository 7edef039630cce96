"""The NodeResourceTopology object built from the machine, the settings and the ledger."""

from __future__ import annotations

from nri_numa.cluster.nrt import available_cpus, node_resource_topology
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.engine.manifest import container_from_resources
from nri_numa.engine.request import PodRequest
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic import MachineSpec, MemorySpec, build_topology
from nri_numa.topology.synthetic.presets import preset_topology

GIB = 1 << 30
# 2 sockets × 1 node × 4 cores × 2 threads: node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15.
MACHINE = build_topology(MachineSpec("nrt", sockets=2, nodes_per_socket=1, cores_per_node=4,
                                     memory=MemorySpec(8 * GIB)))


def engine(topology=MACHINE, **more) -> EngineContext:
    config = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,8",
              "topologyManagerPolicy": "single-numa-node", **more}
    return EngineContext.build(topology, config_from_mapping(config))


def guaranteed(uid: str, cpu: str, memory: str = "1Gi", **extra: str) -> PodRequest:
    main = container_from_resources("main", "app", {}, {"cpu": cpu, "memory": memory, **extra})
    return PodRequest(uid=uid, namespace="default", name=uid, app_containers=(main,))


def resources(obj: dict, zone: str) -> dict[str, tuple[int, int, int]]:
    [found] = [z for z in obj["zones"] if z["name"] == zone]
    return {r["name"]: (int(r["capacity"]), int(r["allocatable"]), int(r["available"]))
            for r in found["resources"]}


def attributes(obj: dict) -> dict[str, str]:
    return {a["name"]: a["value"] for a in obj["attributes"]}


def test_one_zone_per_numa_node_with_the_distances_as_costs():
    ctx = engine()
    obj = node_resource_topology(ctx, ctx.empty_allocations(), "worker-1")
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert obj["kind"] == "NodeResourceTopology" and obj["metadata"]["name"] == "worker-1"
    assert [(z["name"], z["type"]) for z in obj["zones"]] == [("node-0", "Node"), ("node-1", "Node")]
    for node, zone in zip(MACHINE.numa_nodes, obj["zones"]):
        assert {c["name"]: c["value"] for c in zone["costs"]} == {
            f"node-{other}": distance for other, distance in node.distances.items()}


def test_cpus_allocatable_without_the_reserved_ones_and_available_without_exclusive_ones():
    ledger = Ledger(engine())
    obj = node_resource_topology(ledger.ctx, ledger.allocations, "n")
    assert resources(obj, "node-0")["cpu"] == (8, 6, 6)  # CPUs 0 and 8 reserved
    assert resources(obj, "node-1")["cpu"] == (8, 8, 8)
    assert ledger.admit(guaranteed("a", "4")).decision.admitted
    where = ledger.ctx.nodes_of_cpus(ledger.allocations.container("a", "main").exclusive_cpus)
    obj = node_resource_topology(ledger.ctx, ledger.allocations, "n")
    [node] = where
    capacity, allocatable, available = resources(obj, f"node-{node}")["cpu"]
    assert available == allocatable - 4
    assert available_cpus(obj) == 14 - 4


def test_memory_without_the_memory_manager_is_all_available_less_the_reservation():
    ledger = Ledger(engine(reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}]))
    ledger.admit(guaranteed("a", "2", "2Gi"))
    obj = node_resource_topology(ledger.ctx, ledger.allocations, "n")
    node0 = resources(obj, "node-0")["memory"]
    assert node0 == (node0[0], node0[0] - GIB, node0[0] - GIB)  # nothing placed under None


def test_memory_the_static_memory_manager_placed_is_not_available():
    ledger = Ledger(engine(memoryManagerPolicy="Static",
                           reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}]))
    before = node_resource_topology(ledger.ctx, ledger.allocations, "n")
    assert ledger.admit(guaranteed("a", "2", "3Gi")).decision.admitted
    after = node_resource_topology(ledger.ctx, ledger.allocations, "n")
    dropped = [zone for zone in ("node-0", "node-1")
               if resources(after, zone)["memory"][2] == resources(before, zone)["memory"][2] - 3 * GIB]
    assert len(dropped) == 1
    assert resources(before, "node-0")["memory"][1] == resources(before, "node-1")["memory"][1] - GIB


def test_devices_per_node_and_the_ones_in_use():
    ctx = engine(preset_topology("dgx-h100"), reservedSystemCPUs="0-1")
    ledger = Ledger(ctx)
    before = node_resource_topology(ctx, ledger.allocations, "n")
    gpus = {z["name"]: resources(before, z["name"])["nvidia.com/gpu"] for z in before["zones"]}
    assert sum(c for c, _, _ in gpus.values()) == len(ctx.devices["nvidia.com/gpu"].devices)
    assert all(c == h == a for c, h, a in gpus.values())
    assert ledger.admit(guaranteed("g", "4", "8Gi", **{"nvidia.com/gpu": "2"})).decision.admitted
    after = node_resource_topology(ctx, ledger.allocations, "n")
    assert sum(resources(after, zone)["nvidia.com/gpu"][2] for zone in gpus) == \
        sum(a for _, _, a in gpus.values()) - 2


def test_the_attributes_name_the_policy_and_scope_as_node_resource_topology_match_reads_them():
    ctx = engine(topologyManagerPolicy="restricted", topologyManagerScope="pod",
                 cpuManagerPolicyOptions={"full-pcpus-only": "true"})
    obj = node_resource_topology(ctx, ctx.empty_allocations(), "n")
    attrs = attributes(obj)
    assert attrs["topologyManagerPolicy"] == "restricted"
    assert attrs["topologyManagerScope"] == "pod"
    assert attrs["topologyManagerMaxNUMANodes"] == "8"
    assert attrs["cpuManagerPolicy"] == "static"
    assert attrs["cpuManagerPolicyOptions"] == "full-pcpus-only=true"
    assert attrs["reservedSystemCPUs"] == "0,8"
    assert "topologyManagerPolicyOptions" not in attrs  # empty: left out, never null
    assert all(a["value"] for a in obj["attributes"])
    assert obj["topologyPolicies"] == ["RestrictedPodLevel"]


def test_more_than_eight_numa_nodes_are_announced():
    big = build_topology(MachineSpec("big", sockets=2, nodes_per_socket=8, cores_per_node=2,
                                     memory=MemorySpec(GIB)))
    ctx = engine(big, topologyManagerPolicy="best-effort")
    obj = node_resource_topology(ctx, ctx.empty_allocations(), "n")
    assert attributes(obj)["topologyManagerMaxNUMANodes"] == "16"
    assert len(obj["zones"]) == 16 and obj["topologyPolicies"] == ["BestEffortContainerLevel"]


def test_without_a_topology_policy_the_legacy_word_is_none():
    ctx = engine(topologyManagerPolicy="none")
    obj = node_resource_topology(ctx, ctx.empty_allocations(), "n")
    assert obj["topologyPolicies"] == ["None"]


def test_the_object_the_agent_sends_carries_the_nodes_published_state():
    from nri_numa.cluster.node_state import ANNOTATION, decode
    from nri_numa.cluster.start import nrt_snapshot

    ledger = Ledger(engine())
    ledger.admit(guaranteed("a", "2"))
    obj = nrt_snapshot(lambda: (ledger.ctx, ledger.allocations), "worker-1")()
    state = decode(obj["metadata"]["annotations"][ANNOTATION])
    assert state.allocations == ledger.allocations
    assert state.topology == MACHINE
    assert obj["zones"] == node_resource_topology(ledger.ctx, ledger.allocations, "w")["zones"]

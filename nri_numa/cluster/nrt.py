"""The node's NodeResourceTopology object (topology.node.k8s.io/v1alpha2), built from what the
agent holds: the machine, the configuration and the current allocations. Pure: no I/O.

Field for field as the NRT API v0.1.3 (k8stopologyawareschedwg/noderesourcetopology-api,
``pkg/apis/topology/v1alpha2/types.go``) defines the object: ``zones[]`` with ``name``, ``type``,
``costs[] {name, value}``, ``resources[] {name, capacity, allocatable, available}``, and top-level
``attributes[] {name, value}``. The topology manager's policy and scope go in the attributes the
scheduler-plugins' NodeResourceTopologyMatch reads (``pkg/noderesourcetopology/nodeconfig``:
``topologyManagerPolicy``, ``topologyManagerScope``, ``topologyManagerMaxNUMANodes``); the
deprecated ``topologyPolicies`` list is filled too, for consumers older than those attributes.
Zones and costs are named ``node-<id>``, as NFD's topology-updater names them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nri_numa import __version__
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config import TopologyPolicy, TopologyScope
from nri_numa.engine.context import EngineContext
from nri_numa.engine.memory.nodes import MemoryTable
from nri_numa.engine.memory.state import MemoryState, ReservedMemoryError

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
PLURAL = "noderesourcetopologies"
KIND = "NodeResourceTopology"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nri-numa"}
KUBELET_DEFAULT_MAX_NUMA_NODES = 8  # what NodeResourceTopologyMatch assumes without the attribute

# The deprecated single-word policies (v1alpha2 TopologyManagerPolicy constants).
_LEGACY_POLICY = {
    (TopologyPolicy.SINGLE_NUMA_NODE, TopologyScope.CONTAINER): "SingleNUMANodeContainerLevel",
    (TopologyPolicy.SINGLE_NUMA_NODE, TopologyScope.POD): "SingleNUMANodePodLevel",
    (TopologyPolicy.RESTRICTED, TopologyScope.CONTAINER): "RestrictedContainerLevel",
    (TopologyPolicy.RESTRICTED, TopologyScope.POD): "RestrictedPodLevel",
    (TopologyPolicy.BEST_EFFORT, TopologyScope.CONTAINER): "BestEffortContainerLevel",
    (TopologyPolicy.BEST_EFFORT, TopologyScope.POD): "BestEffortPodLevel",
}


def zone_name(node_id: int) -> str:
    return f"node-{node_id}"


def node_resource_topology(ctx: EngineContext, allocations: Allocations, node_name: str,
                           annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The whole object for ``node_name``, without an owner reference (the exporter adds the
    Node's uid once it knows it)."""
    config = ctx.config
    metadata: dict[str, Any] = {"name": node_name, "labels": dict(MANAGED_BY)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "topologyPolicies": [_LEGACY_POLICY.get((config.topology_manager_policy,
                                                 config.topology_manager_scope), "None")],
        "zones": zones(ctx, allocations),
        "attributes": attributes(ctx),
    }


def attributes(ctx: EngineContext) -> list[dict[str, str]]:
    """The node's placement settings: the three NodeResourceTopologyMatch reads, then the other
    kubelet settings a reader needs to predict a placement (named as the kubelet's keys)."""
    config = ctx.config
    nodes = len(ctx.numa_ids)
    max_nodes = config.topology_manager_policy_options.get("max-allowable-numa-nodes")
    pairs = [
        ("topologyManagerPolicy", str(config.topology_manager_policy)),
        ("topologyManagerScope", str(config.topology_manager_scope)),
        # nri-numa merges hints on any number of nodes, so the node's own count is the limit.
        ("topologyManagerMaxNUMANodes", str(max_nodes or max(KUBELET_DEFAULT_MAX_NUMA_NODES, nodes))),
        ("topologyManagerPolicyOptions", _options(config.topology_manager_policy_options)),
        ("cpuManagerPolicy", str(config.cpu_manager_policy)),
        ("cpuManagerPolicyOptions", _options(config.cpu_manager_policy_options)),
        ("memoryManagerPolicy", str(config.memory_manager_policy)),
        ("reservedSystemCPUs", _cpu_list(ctx.reserved_cpus)),
        ("nodeAgent", f"nri-numa {__version__}"),
    ]
    # An empty value is left out: the kubernetes client sends "" as null, which the schema refuses.
    return [{"name": name, "value": value} for name, value in pairs if value]


def zones(ctx: EngineContext, allocations: Allocations) -> list[dict[str, Any]]:
    exclusive = allocations.exclusive_cpus()
    memory = _memory_tables(ctx, allocations)
    devices = _device_counts(ctx, allocations)
    out = []
    for node, row in zip(ctx.topology.numa_nodes, ctx.distances):
        cpus = frozenset(node.cpus)
        allocatable_cpus = cpus - ctx.reserved_cpus
        resources = [_resource("cpu", len(cpus), len(allocatable_cpus),
                               len(allocatable_cpus - exclusive))]
        for name, table in sorted(memory.get(node.id, {}).items(), key=_memory_order):
            if table.total:
                resources.append(_resource(name, table.total, table.allocatable, table.free))
        for name, (capacity, healthy, free) in sorted(devices.get(node.id, {}).items()):
            resources.append(_resource(name, capacity, healthy, free))
        out.append({
            "name": zone_name(node.id),
            "type": "Node",
            "costs": [{"name": zone_name(other), "value": int(distance)}
                      for other, distance in zip(ctx.numa_ids, row)],
            "resources": resources,
        })
    return out


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, str]:
    # Quantities as integer strings: what the API server stores for a whole number.
    return {"name": name, "capacity": str(capacity), "allocatable": str(allocatable),
            "available": str(max(0, available))}


def _memory_tables(ctx: EngineContext,
                   allocations: Allocations) -> Mapping[int, Mapping[str, MemoryTable]]:
    """Per node and resource (memory, hugepages-<size>): what the Static memory policy accounts,
    or, without it, the node's memory less what reservedMemory keeps (nothing is placed then,
    so all of it is available)."""
    state = allocations.memory
    if state is None:
        try:
            state = MemoryState.from_topology(ctx.memory_topology,
                                              ctx.config.reserved_memory_by_node)
        except ReservedMemoryError:  # reservations the None policy never checked
            state = MemoryState.from_topology(ctx.memory_topology, {})
    return {node_id: node.tables for node_id, node in state.nodes.items()}


def _memory_order(item: tuple[str, MemoryTable]) -> tuple[bool, str]:
    return (item[0] != "memory", item[0])


def _device_counts(ctx: EngineContext,
                   allocations: Allocations) -> dict[int, dict[str, tuple[int, int, int]]]:
    """node → resource → (devices, healthy ones, healthy ones not in use). Devices that name no
    NUMA node have no zone to be counted in."""
    counts: dict[int, dict[str, list[int]]] = {}
    for name, resource in ctx.devices.items():
        in_use = allocations.devices_in_use(name)
        for device in resource.devices:
            for node in device.numa_nodes:
                row = counts.setdefault(node, {}).setdefault(name, [0, 0, 0])
                row[0] += 1
                row[1] += device.healthy
                row[2] += device.healthy and device.id not in in_use
    return {node: {name: (c, h, f) for name, (c, h, f) in by.items()}
            for node, by in counts.items()}


def _options(options: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(options.items()))


def _cpu_list(cpus: frozenset[int]) -> str:
    from nri_numa.topology.cpulist import format_list

    return format_list(cpus)


def available_cpus(obj: Mapping[str, Any]) -> int:
    """The sum of the zones' available CPUs: what a reader of the object sees free."""
    return sum(int(r["available"]) for zone in obj.get("zones", ())
               for r in zone.get("resources", ()) if r.get("name") == "cpu")

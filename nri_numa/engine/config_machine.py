"""The kubelet's start-up checks on a configuration that depend on the machine.

Kept apart from config.py because they need a ``Topology``: an ``EngineConfig`` is checked on
its own when it is built, and against the machine once, by ``validate_for_topology``, when an
engine context is built for that machine.
"""

from __future__ import annotations

from nri_numa.engine.config import (PREFER_CLOSEST, ConfigError, CpuManagerPolicy, EngineConfig,
                                    TopologyPolicy)
from nri_numa.engine.request import hugepage_size_kib
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import NumaNode


def validate_for_topology(config: EngineConfig, topology: Topology) -> None:
    """The kubelet's start-up checks that depend on the machine; raises ConfigError."""
    problems = [*_numa_problems(config, topology), *_cpu_problems(config, topology),
                *_reserved_memory_problems(config, topology)]
    if problems:
        raise ConfigError(problems)


def _numa_problems(config: EngineConfig, topology: Topology) -> list[str]:
    problems = []
    limit, count = config.max_allowable_numa_nodes, len(topology.numa_nodes)
    if config.topology_manager_policy is not TopologyPolicy.NONE and limit and count > limit:
        problems.append(f"topologyManagerPolicyOptions: unsupported on machines with more than "
                        f"{limit} NUMA Nodes (this machine has {count})")
    if config.prefer_closest_numa_nodes:
        ids = {n.id for n in topology.numa_nodes}
        problems += [f"topologyManagerPolicyOptions: cannot discover NUMA topology: error getting "
                     f"NUMA distances: NUMA node {n.id} has no distance to every node, which "
                     f"{PREFER_CLOSEST} needs" for n in topology.numa_nodes
                     if not ids <= set(n.distances)]
    return problems


def _cpu_problems(config: EngineConfig, topology: Topology) -> list[str]:
    if config.cpu_manager_policy is not CpuManagerPolicy.STATIC:
        return []
    problems = []
    online = topology.online_cpus
    sockets = {c.socket for c in topology.cpus if c.online and c.socket is not None}
    if config.cpu_options.align_by_socket and len(sockets) > len(topology.numa_nodes):
        problems.append("cpuManagerPolicyOptions: Align by socket is not compatible with hardware "
                        "where number of sockets are more than number of NUMA")
    if config.reserved_system_cpus and not config.reserved_system_cpus <= online:
        problems.append(f'reservedSystemCPUs: not all reserved cpus: '
                        f'"{format_list(config.reserved_system_cpus)}" are present in '
                        f'defaultCpuSet: "{format_list(online)}"')
    elif config.num_reserved_cpus > len(online):
        problems.append(f"kubeReserved/systemReserved: [cpumanager] unable to reserve the required "
                        f"amount of CPUs (size of {format_list(online)} did not equal "
                        f"{config.num_reserved_cpus})")
    return problems


def _reserved_memory_problems(config: EngineConfig, topology: Topology) -> list[str]:
    nodes = {n.id: n for n in topology.numa_nodes}
    problems = []
    for i, r in enumerate(config.reserved_memory):
        node = nodes.get(r.numa_node)
        if node is None:
            problems.append(f"reservedMemory[{i}]: the reserved memory configuration references "
                            f"a NUMA node {r.numa_node} that does not exist on this machine")
            continue
        for resource, amount in r.limits.items():
            capacity = _node_capacity(node, resource)
            if amount > capacity:
                problems.append(f"reservedMemory[{i}]: reserves {amount} bytes of {resource} on "
                                f"NUMA node {node.id}, which has {capacity}")
    return problems


def _node_capacity(node: NumaNode, resource: str) -> int:
    if resource == "memory":
        return node.memory_bytes
    size = hugepage_size_kib(resource)
    pages = node.hugepages.get(size)
    return 0 if pages is None else pages.total * size * 1024

"""Everything the engine derives once per machine and configuration, before any admission."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.annotations import PodTopology, pod_topology
from nri_numa.engine.config import ConfigError, CpuManagerPolicy, EngineConfig, MemoryManagerPolicy
from nri_numa.engine.config_machine import validate_for_topology
from nri_numa.engine.cpu import CPUTopology, NotEnoughCPUsError, checked_mask, take_cpus
from nri_numa.engine.devices import Chooser, Device, Resource
from nri_numa.engine.devices.requested import NIC_CLASS, PCI_PREFIX, pci_resource
from nri_numa.engine.merge import MachineMerge
from nri_numa.engine.policy.options import (DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
                                            MAX_ALLOWABLE_NUMA_NODES)
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology

if TYPE_CHECKING:
    from nri_numa.engine.memory.state import MemoryState

GPU_RESOURCE = "nvidia.com/gpu"


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True)
class EngineContext:
    topology: Topology
    config: EngineConfig
    cpus: CPUTopology
    numa_ids: tuple[int, ...]
    distances: tuple[tuple[int, ...], ...]  # indexed like numa_ids
    reserved_cpus: frozenset[int]
    devices: Mapping[str, Resource]  # resource name → its devices

    @classmethod
    def build(cls, topology: Topology, config: EngineConfig,
              extra_resources: Mapping[str, Resource] = MappingProxyType({})) -> EngineContext:
        """Raise ConfigError when the configuration cannot work on this machine."""
        validate_for_topology(config, topology)
        cpus = CPUTopology.from_topology(topology)
        numa_ids = tuple(n.id for n in topology.numa_nodes)
        distances = tuple(tuple(n.distances.get(j, 10 if i == j else 255)
                                for j in numa_ids) for i, n in zip(numa_ids, topology.numa_nodes))
        devices = {**device_resources(topology), **extra_resources}
        ctx = cls(topology, config, cpus, numa_ids, distances,
                  _reserved_cpus(config, cpus), MappingProxyType(devices))
        if ctx.withheld_cpus and not ctx.empty_allocations().shared:
            raise ConfigError([f"every CPU left for the shared pool is isolated (isolcpus "
                               f"{format_list(ctx.withheld_cpus)}): Burstable and BestEffort "
                               "containers would have no CPU; set sharedPoolIncludesIsolcpus: "
                               "true to let them run there"])
        if config.memory_manager_policy is MemoryManagerPolicy.STATIC:
            from nri_numa.engine.memory import check_reserved_memory  # loaded for this policy only

            try:
                check_reserved_memory(ctx.memory_topology, config.reserved_memory_by_node)
            except ValueError as e:
                raise ConfigError([str(e)]) from None
        return ctx

    @cached_property
    def cpu_static(self) -> bool:
        return self.config.cpu_manager_policy is CpuManagerPolicy.STATIC

    @cached_property
    def memory_static(self) -> bool:
        return self.config.memory_manager_policy is MemoryManagerPolicy.STATIC

    @cached_property
    def strict_reservation(self) -> bool:
        return self.cpu_static and self.config.cpu_options.strict_cpu_reservation

    def empty_allocations(self) -> Allocations:
        online = self.topology.online_cpus - self.withheld_cpus
        shared = online - self.reserved_cpus if self.strict_reservation else online
        return Allocations(shared=shared, memory=self._empty_memory())

    def _empty_memory(self) -> MemoryState | None:
        """The Memory Manager's state before any placement; None without its Static policy,
        which is when its modules are never loaded."""
        if not self.memory_static:
            return None
        from nri_numa.engine.memory import MemoryState

        return MemoryState.from_topology(self.memory_topology, self.config.reserved_memory_by_node)

    def check(self, allocations: Allocations) -> None:
        """Raise AllocationsError unless ``allocations`` fit this machine and configuration."""
        allocations.check(self.topology.online_cpus, self.reserved_cpus, self.strict_reservation,
                          self.withheld_cpus)
        if allocations.memory is not None:
            allocations.memory.validate(self.empty_allocations().memory)

    def nodes_of_cpus(self, cpus: frozenset[int]) -> frozenset[int]:
        node_of = self.node_of_cpu
        return frozenset(node_of[c] for c in cpus if c in node_of)

    # Values derived from the machine and configuration alone, kept for every later admission:
    # rebuilding them per admission was a measurable share of its cost (bench/bench_admission.py).

    @cached_property
    def memory_topology(self) -> Topology:
        """The machine as the Memory Manager sees it: NUMA nodes without CPUs (a GPU's memory
        on GB200 and GH200, CXL memory) hold no container memory, so that a container's memory
        never lands on them. The kubelet would count them (docs/devices.md)."""
        if all(n.cpus for n in self.topology.numa_nodes):
            return self.topology
        nodes = tuple(n if n.cpus else replace(n, memory_bytes=0, hugepages={})
                      for n in self.topology.numa_nodes)
        return replace(self.topology, numa_nodes=nodes)

    @cached_property
    def node_of_cpu(self) -> Mapping[int, int]:
        """CPU id → its NUMA node, for the CPUs that have one."""
        return MappingProxyType({c.id: c.numa for c in self.topology.cpus if c.numa is not None})

    @cached_property
    def isolated_cpus(self) -> frozenset[int]:
        """The online CPUs the kernel isolates (isolcpus): exclusive CPUs come from them only
        for containers that ask by annotation, never otherwise."""
        return self.topology.isolcpus & self.topology.online_cpus

    @cached_property
    def isolated_mask(self) -> int:
        return checked_mask(self.isolated_cpus, "isolated CPUs")

    @cached_property
    def withheld_cpus(self) -> frozenset[int]:
        """Free CPUs kept out of the shared pool: the isolated ones, unless
        sharedPoolIncludesIsolcpus lets shared containers run there."""
        return frozenset() if self.config.shared_pool_includes_isolcpus else self.isolated_cpus

    def free_isolated_mask(self, allocations: Allocations) -> int:
        """Isolated CPUs no container holds exclusively, reserved ones left out."""
        if self.withheld_cpus:
            held = checked_mask(allocations.exclusive_cpus(), "exclusive CPUs")
            return self.isolated_mask & ~held & ~self.reserved_mask
        return self.isolated_mask & allocations.shared_mask & ~self.reserved_mask

    @cached_property
    def reserved_mask(self) -> int:
        """``reserved_cpus`` as a bit mask (bit n = CPU n)."""
        return checked_mask(self.reserved_cpus, "reserved CPUs")

    @cached_property
    def distance_map(self) -> Mapping[int, Mapping[int, int]]:
        """``distances`` keyed by node id on both sides, as ``bounded_hints`` reads them."""
        return MappingProxyType({i: MappingProxyType(dict(zip(self.numa_ids, row)))
                                 for i, row in zip(self.numa_ids, self.distances)})

    @cached_property
    def merge_options(self) -> Mapping[str, str]:
        """topologyManagerPolicyOptions as the merge takes them. The engine has no node limit of
        its own (an explicit one was checked with the config), so past the kubelet's default of
        8 nodes the limit is the machine's size; up to 8 the default already allows them all."""
        options = dict(self.config.topology_manager_policy_options)
        if len(self.numa_ids) > DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
            options.setdefault(MAX_ALLOWABLE_NUMA_NODES, str(len(self.numa_ids)))
        return MappingProxyType(options)

    @cached_property
    def node_topology(self) -> PodTopology:
        """The policy and scope of a pod without annotations: the node's own."""
        return pod_topology(self.config, {})

    @cached_property
    def machine_merge(self) -> MachineMerge:
        """The hint merge on this machine's nodes, distances and merge options."""
        return MachineMerge.build(self.numa_ids, distances=self.distances,
                                  options=self.merge_options)

    @cached_property
    def choose_gpus(self) -> Chooser:
        """How GPUs (resource ``GPU_RESOURCE``) are picked among those that fit the hint."""
        from nri_numa.engine.devices.gpu_select import gpu_chooser  # only once GPUs are asked for

        return gpu_chooser(self.topology)

    @cached_property
    def device_classes(self) -> Mapping[str, tuple[str, ...]]:
        """Class names an annotation may use → the resources they stand for (``nic`` → every
        ``pci/`` resource of the machine's NICs)."""
        return MappingProxyType({NIC_CLASS: tuple(sorted(self._nic_resource_names))})

    def device_order(self, name: str) -> tuple[int, str]:
        """Allocation order of a container's resources: GPUs first, so that its NICs can be
        chosen near the GPUs it got; then every other resource by name."""
        return (0 if name == GPU_RESOURCE else 1, name)

    def device_chooser(self, name: str, given: Mapping[str, tuple[str, ...]]) -> Chooser | None:
        """The chooser for resource ``name``, knowing what the container was ``given`` so far
        (None: the allocator's default, lowest ids)."""
        if name == GPU_RESOURCE:
            return self.choose_gpus
        if name.startswith(PCI_PREFIX) and name in self._nic_resource_names:
            from nri_numa.engine.devices.nic_select import nic_chooser

            return nic_chooser(self.topology, given.get(GPU_RESOURCE, ()))
        return None

    @cached_property
    def _nic_resource_names(self) -> frozenset[str]:
        return frozenset(nic_resources(self.topology))


def device_resources(topology: Topology) -> dict[str, Resource]:
    """The device resources the machine itself shows: GPUs by UUID (as NVIDIA's plugin names
    them) and NICs (``nic_resources``)."""
    resources = nic_resources(topology)
    if topology.gpus:
        resources[GPU_RESOURCE] = Resource(GPU_RESOURCE, tuple(
            Device(g.uuid, _nodes(g.numa_node)) for g in topology.gpus))
    return resources


def nic_resources(topology: Topology) -> dict[str, Resource]:
    """The NICs' physical functions, one resource per PCI vendor:device (``pci/15b3:1021``),
    each NIC known by its PCI address. A NIC whose PCI function the topology does not list is
    left out: without it there is neither a NUMA node nor a PCIe path to choose by. SR-IOV VFs
    are the SR-IOV device plugin's business and are not offered."""
    by_kind: dict[str, dict[str, Device]] = {}
    for nic in topology.nics:
        pci = topology.pci(nic.pci_address) if nic.pci_address else None
        if pci is None or pci.physfn is not None:
            continue
        # Two netdevs of one function (an IPoIB child, a representor) are one device.
        by_kind.setdefault(pci_resource(pci.vendor, pci.device), {})[pci.address] = Device(
            pci.address, _nodes(pci.numa_node))
    return {name: Resource(name, tuple(devices.values()))
            for name, devices in sorted(by_kind.items())}


def _nodes(node: int | None) -> frozenset[int]:
    return frozenset() if node is None else frozenset({node})


def _reserved_cpus(config: EngineConfig, cpus: CPUTopology) -> frozenset[int]:
    """reservedSystemCPUs as given, else the kubelet's pick: whole cores, lowest first."""
    if config.reserved_system_cpus:
        return frozenset(config.reserved_system_cpus)
    count = config.num_reserved_cpus
    if config.cpu_manager_policy is not CpuManagerPolicy.STATIC or count == 0:
        return frozenset()
    try:
        reserved = take_cpus(cpus, cpus.cpu_ids(), count)
    except NotEnoughCPUsError:
        reserved = frozenset()
    if len(reserved) != count:
        raise ConfigError([f"[cpumanager] unable to reserve the required amount of CPUs (size of "
                           f"{{{','.join(map(str, sorted(reserved)))}}} did not equal {count})"])
    return reserved

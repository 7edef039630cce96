"""The engine's configuration, under KubeletConfiguration's names, with the kubelet's checks.

``config_from_mapping`` (config_reader.py) reads an already-parsed mapping (the CLI parses
YAML); every key is checked and every problem is reported at once in one ``ConfigError``. An
``EngineConfig`` is valid by construction: its ``__post_init__`` runs the checks the kubelet
makes when it builds its managers (option names and values, incompatible option pairs, static
policies without reservations), with the kubelet's own texts so that they can be searched for.
Checks that need the machine live in ``validate_for_topology`` (config_machine.py).

Two deliberate differences from the kubelet, both documented in docs/configuration.md:

* No feature gates: every policy option the kubelet knows is available, alpha or not.
* No NUMA node limit unless asked for. The kubelet refuses topology policies on machines with
  more than 8 NUMA nodes (``max-allowable-numa-nodes``, default 8) because its merge enumerates
  every combination of hints; our merge does not, so the limit applies only when
  ``max-allowable-numa-nodes`` is set explicitly (and then, as in the kubelet, it is at least 8).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType
from typing import Any

from nri_numa.engine.policy.options import (DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
                                            MAX_ALLOWABLE_NUMA_NODES, PREFER_CLOSEST_NUMA_NODES)
from nri_numa.engine.request import RequestError, hugepage_size_kib
from nri_numa.safeio.bounds import clip, quote


class ConfigError(ValueError):
    """A configuration that cannot be used; ``problems`` lists every reason found."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = "\n".join([f"{len(self.problems)} problems in the configuration:",
                                 *(f"  - {p}" for p in self.problems)])
        super().__init__(message)


class Ranked(StrEnum):
    """Members are declared from the loosest to the strictest; ``strictness`` is that rank."""

    @property
    def strictness(self) -> int:
        return list(type(self)).index(self)


class TopologyPolicy(Ranked):
    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"


class TopologyScope(Ranked):
    CONTAINER = "container"
    POD = "pod"  # stricter: the whole pod is aligned together


class CpuManagerPolicy(StrEnum):
    NONE = "none"
    STATIC = "static"


class MemoryManagerPolicy(StrEnum):
    NONE = "None"  # capitalised, as the kubelet spells them
    STATIC = "Static"


PREFER_CLOSEST = PREFER_CLOSEST_NUMA_NODES
MAX_ALLOWABLE = MAX_ALLOWABLE_NUMA_NODES
KUBELET_MIN_ALLOWABLE = DEFAULT_MAX_ALLOWABLE_NUMA_NODES  # the kubelet's default is its minimum
TOPOLOGY_OPTIONS = (PREFER_CLOSEST, MAX_ALLOWABLE)


@dataclass(frozen=True, slots=True)
class CpuManagerOptions:
    """cpuManagerPolicyOptions, parsed; attribute names are the option names in snake case."""

    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    prefer_align_cpus_by_uncorecache: bool = False


CPU_OPTIONS = tuple(f.name.replace("_", "-") for f in fields(CpuManagerOptions))
# The pairs the kubelet refuses, in the order it checks them.
_INCOMPATIBLE_CPU_OPTIONS = (
    ("full-pcpus-only", "distribute-cpus-across-cores"),
    ("distribute-cpus-across-numa", "distribute-cpus-across-cores"),
    ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores"),
    ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa"),
)
# Go's strconv.ParseBool.
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
# Go's strconv.Atoi syntax, compiled (and kept) by re on first use: few configurations have a
# number to check.
_GO_INT = r"[+-]?[0-9]+"


def _parse_bool(value: str) -> bool | None:
    return True if value in _TRUE else False if value in _FALSE else None


def _bool_error(name: str, value: str) -> str:
    return (f'bad value for option "{clip(name)}": strconv.ParseBool: parsing "{clip(value)}": '
            f"invalid syntax (allowed: {', '.join(_TRUE + _FALSE)})")


@dataclass(frozen=True, slots=True)
class MemoryReservation:
    """One ``reservedMemory`` entry: bytes per resource (memory, hugepages-<size>) on a node."""

    numa_node: int
    limits: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", MappingProxyType(dict(self.limits)))


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True)
class EngineConfig:
    topology_manager_policy: TopologyPolicy = TopologyPolicy.NONE
    topology_manager_scope: TopologyScope = TopologyScope.CONTAINER
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    cpu_manager_policy: CpuManagerPolicy = CpuManagerPolicy.NONE
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    reserved_system_cpus: frozenset[int] = frozenset()
    kube_reserved: Mapping[str, int] = field(default_factory=dict)  # cpu in millicores
    system_reserved: Mapping[str, int] = field(default_factory=dict)
    memory_manager_policy: MemoryManagerPolicy = MemoryManagerPolicy.NONE
    reserved_memory: tuple[MemoryReservation, ...] = ()
    allow_pod_overrides: bool = True  # ours: may pods narrow policy/scope by annotation?
    # ours: may Burstable and BestEffort containers run on isolated CPUs (isolcpus)?
    shared_pool_includes_isolcpus: bool = False
    # Seconds between the agent's checks that each container's cgroup still holds the cpuset
    # the ledger gives it (the kubelet's reconcile loop, default 10 s); 0: never checked.
    cpu_manager_reconcile_period: float = 10.0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for attr, enum in (("topology_manager_policy", TopologyPolicy),
                           ("topology_manager_scope", TopologyScope),
                           ("cpu_manager_policy", CpuManagerPolicy),
                           ("memory_manager_policy", MemoryManagerPolicy)):
            value = getattr(self, attr)
            if value not in {e.value for e in enum}:
                raise ConfigError([f"{_camel(attr)}: {not_one_of(value, enum)}"])
            set_(self, attr, enum(value))
        for attr in ("topology_manager_policy_options", "cpu_manager_policy_options",
                     "kube_reserved", "system_reserved"):
            set_(self, attr, MappingProxyType(dict(getattr(self, attr))))
        set_(self, "reserved_system_cpus", frozenset(self.reserved_system_cpus))
        set_(self, "reserved_memory", tuple(self.reserved_memory))
        problems = [*_topology_option_problems(self.topology_manager_policy_options),
                    *_cpu_manager_problems(self), *_memory_manager_problems(self)]
        if problems:
            raise ConfigError(problems)

    @property
    def prefer_closest_numa_nodes(self) -> bool:
        return _parse_bool(self.topology_manager_policy_options.get(PREFER_CLOSEST, "false"))

    @property
    def max_allowable_numa_nodes(self) -> int | None:
        """The explicit limit, or None: without the option our engine has no limit."""
        value = self.topology_manager_policy_options.get(MAX_ALLOWABLE)
        return None if value is None else int(value)

    @cached_property
    def cpu_options(self) -> CpuManagerOptions:
        return CpuManagerOptions(**{name.replace("-", "_"): _parse_bool(value)
                                    for name, value in self.cpu_manager_policy_options.items()})

    @property
    def num_reserved_cpus(self) -> int:
        """reservedSystemCPUs' size when given (the kubelet then overrides the cpu of
        kubeReserved and systemReserved), else ⌈(kubeReserved.cpu + systemReserved.cpu)⌉."""
        if self.reserved_system_cpus:
            return len(self.reserved_system_cpus)
        millicores = self.kube_reserved.get("cpu", 0) + self.system_reserved.get("cpu", 0)
        return -(-millicores // 1000)

    @property
    def reserved_memory_by_node(self) -> dict[int, dict[str, int]]:
        """NUMA node → resource → reserved bytes, as the memory manager's state takes it."""
        by_node: dict[int, dict[str, int]] = {}
        for r in self.reserved_memory:
            by_node.setdefault(r.numa_node, {}).update(r.limits)
        return by_node


def _camel(attr: str) -> str:
    head, *rest = attr.split("_")
    return head + "".join(w.capitalize() for w in rest)


def not_one_of(value: Any, enum: type[StrEnum]) -> str:
    return f"{quote(value)} is not one of {', '.join(e.value for e in enum)}"


def _topology_option_problems(options: Mapping[str, str]) -> list[str]:
    problems = (_topology_option_problem(name, value) for name, value in sorted(options.items()))
    return [f"topologyManagerPolicyOptions: {p}" for p in problems if p]


def _topology_option_problem(name: str, value: str) -> str | None:
    if name not in TOPOLOGY_OPTIONS:
        return (f'unknown Topology Manager Policy option: "{clip(name)}" '
                f"(known: {', '.join(TOPOLOGY_OPTIONS)})")
    if name == PREFER_CLOSEST:
        return _bool_error(name, value) if _parse_bool(value) is None else None
    from nri_numa.engine.quantity import MAX_INT64

    # Digits are counted before int() converts them: past 4300 it raises, and it is slow.
    go_int = re.fullmatch(_GO_INT, value)
    if not go_int or len(value.lstrip("+-0")) > 19 or int(value) > MAX_INT64:
        reason = "invalid syntax" if not go_int else "value out of range"
        return (f'unable to convert policy option to integer "{name}": strconv.Atoi: parsing '
                f'"{clip(value)}": {reason}')
    if int(value) < KUBELET_MIN_ALLOWABLE:
        return (f'the minimum value of "{MAX_ALLOWABLE}" should not be less than '
                f"{KUBELET_MIN_ALLOWABLE}")
    return None


def _cpu_manager_problems(config: EngineConfig) -> list[str]:
    options = config.cpu_manager_policy_options
    if config.cpu_manager_policy is CpuManagerPolicy.NONE:
        if not options:
            return []
        go_map = " ".join(f"{clip(k)}:{clip(v)}" for k, v in sorted(options.items())[:8])
        if len(options) > 8:
            go_map += f" …({len(options) - 8} more)"
        return [f"cpuManagerPolicyOptions: None policy: received unsupported options="
                f"map[{go_map}] (options need cpuManagerPolicy: static)"]
    problems = []
    for name, value in sorted(options.items()):
        if name not in CPU_OPTIONS:
            problems.append(f'cpuManagerPolicyOptions: unknown CPU Manager Policy option: '
                            f'"{clip(name)}" (known: {", ".join(CPU_OPTIONS)})')
        elif _parse_bool(value) is None:
            problems.append(f"cpuManagerPolicyOptions: {_bool_error(name, value)}")
    if problems:
        return problems
    enabled = {name for name, value in options.items() if _parse_bool(value)}
    problems = [f"cpuManagerPolicyOptions: static policy options {a} and {b} can not be used at "
                "the same time" for a, b in _INCOMPATIBLE_CPU_OPTIONS if {a, b} <= enabled]
    if ("align-by-socket" in enabled
            and config.topology_manager_policy is TopologyPolicy.SINGLE_NUMA_NODE):
        problems.append("cpuManagerPolicyOptions: Topology manager single-numa-node policy is "
                        "incompatible with CPUManager align-by-socket policy option")
    if config.num_reserved_cpus == 0:
        problems.append("cpuManagerPolicy: [cpumanager] the static policy requires "
                        "systemreserved.cpu + kubereserved.cpu to be greater than zero (set "
                        "reservedSystemCPUs, or cpu in systemReserved or kubeReserved)")
    return problems


def _is_hugepages(resource: str) -> bool:
    try:
        return resource.startswith("hugepages-") and hugepage_size_kib(resource) > 0
    except RequestError:
        return False


def _memory_manager_problems(config: EngineConfig) -> list[str]:
    problems = []
    seen: set[tuple[int, str]] = set()
    for i, r in enumerate(config.reserved_memory):
        where = f"reservedMemory[{i}]"
        for resource, amount in r.limits.items():
            if resource != "memory" and not _is_hugepages(resource):
                problems.append(f"{where}: invalid configuration: the limit type "
                                f'"{clip(resource)}" for '
                                f"NUMA node {r.numa_node} is not supported, only [memory "
                                "hugepages-<HugePageSize>] is accepted")
            if amount == 0:
                problems.append(f"{where}: invalid configuration: reserved memory may not be zero "
                                f'for NUMA node {r.numa_node} and resource "{resource}"')
            if (r.numa_node, resource) in seen:
                problems.append(f"{where}: invalid configuration: the reserved memory has a "
                                f"duplicate value for NUMA node {r.numa_node} and resource "
                                f'"{resource}"')
            seen.add((r.numa_node, resource))
    reserved = sum(r.limits.get("memory", 0) for r in config.reserved_memory)
    if config.memory_manager_policy is MemoryManagerPolicy.STATIC and reserved == 0:
        problems.append("memoryManagerPolicy: [memorymanager] you should specify the system "
                        "reserved memory (reservedMemory with a memory limit on some NUMA node)")
    return problems

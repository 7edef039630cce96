"""The CPU layout the CPU Manager algorithms work on (§4.1 of docs/kubelet-algorithms.md).

Every logical CPU has a core, a socket, a NUMA node and an uncore (last-level) cache. The kubelet
derives its counters from the machine — NumCPUs, NumCores, NumSockets, NumNUMANodes,
NumUncoreCache are *counts of distinct ids* — and the per-unit sizes by integer division:
CPUsPerCore = NumCPUs // NumCores and so on. Those averages, not the real sizes, decide whether a
core or socket is "free", exactly as in the kubelet, so hybrid or partly offline machines behave
the way they do there.

A CPU without uncore information gets its socket id as uncore id: the kubelet's discovery does the
same ("no shared uncore cache known, align by socket"). Core ids must be unique machine-wide (the
kubelet keys cores by id alone); ``from_topology`` uses the lowest CPU of each core, which is.

Sets of CPUs are held as Python ints (bit n = CPU n): the algorithms intersect and count them on
every step, and ``int.bit_count`` keeps a 1024-CPU admission in the millisecond range.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from nri_numa.topology.model import Topology


class CPUTopologyError(ValueError):
    """CPU records that do not describe a machine; the message names the record and field."""


@dataclass(frozen=True, slots=True)
class CPUInfo:
    cpu: int
    core: int
    socket: int
    numa: int
    uncore: int  # the socket id where the machine reports no uncore cache


def mask_of(cpus: Iterable[int]) -> int:
    """CPU ids → bit mask."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return mask


def checked_mask(cpus: Iterable[int], what: str) -> int:
    """CPU ids from a caller → bit mask; anything but non-negative integers is a ValueError."""
    mask = 0
    for cpu in cpus:
        if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
            raise ValueError(f"{what} must hold CPU ids (non-negative integers), not {cpu!r}")
        mask |= 1 << cpu
    return mask


def bits_of(mask: int) -> Iterator[int]:
    """Bit mask → CPU ids, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


# bin() spells a mask highest bit first; reversed, character i is bit i. Turned into 0/1 bytes
# it selects the CPU ids with compress, all in C: a whole NUMA node's mask is read as fast as a
# few bits walked one by one.
_BIT_DIGITS = bytes.maketrans(b"01", b"\x00\x01")


def set_of(mask: int) -> frozenset[int]:
    """Bit mask → CPU ids."""
    digits = bin(mask)[:1:-1].encode().translate(_BIT_DIGITS)
    return frozenset(itertools.compress(itertools.count(), digits))


def _frozen(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))


def _sorted_frozen(d: Mapping[int, int]) -> Mapping[int, int]:
    return MappingProxyType(dict(sorted(d.items())))


_BY_CPU = attrgetter("cpu")


def _group(pairs: Iterable[tuple[int, int]]) -> Mapping[int, tuple[int, ...]]:
    """(key, member) pairs → key → sorted distinct members."""
    out: dict[int, set[int]] = {}
    for key, member in pairs:
        out.setdefault(key, set()).add(member)
    return _frozen({k: tuple(sorted(v)) for k, v in sorted(out.items())})


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True, eq=False)
class CPUTopology:
    """Immutable CPU layout plus what the algorithms look up on every step.

    ``core_cpus``/``socket_cpus``/``numa_cpus``/``uncore_cpus`` map a unit id to the bit mask of its
    CPUs; ``sockets_of_numa`` and friends list the static containment relations, ids ascending.
    """

    cpus: tuple[CPUInfo, ...]
    all_cpus: int = field(init=False, repr=False)
    core_cpus: Mapping[int, int] = field(init=False, repr=False)
    socket_cpus: Mapping[int, int] = field(init=False, repr=False)
    numa_cpus: Mapping[int, int] = field(init=False, repr=False)
    uncore_cpus: Mapping[int, int] = field(init=False, repr=False)
    sockets_of_numa: Mapping[int, tuple[int, ...]] = field(init=False, repr=False)
    numas_of_socket: Mapping[int, tuple[int, ...]] = field(init=False, repr=False)
    cores_of_socket: Mapping[int, tuple[int, ...]] = field(init=False, repr=False)
    cores_of_numa: Mapping[int, tuple[int, ...]] = field(init=False, repr=False)
    uncores_of_numa: Mapping[int, tuple[int, ...]] = field(init=False, repr=False)
    numa_of_cpu: Mapping[int, int] = field(init=False, repr=False)
    core_of_cpu: Mapping[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cpus = tuple(sorted(self.cpus, key=_BY_CPU))
        object.__setattr__(self, "cpus", cpus)
        core_cpus: dict[int, int] = {}
        socket_cpus: dict[int, int] = {}
        numa_cpus: dict[int, int] = {}
        uncore_cpus: dict[int, int] = {}
        all_cpus = 0
        for c in cpus:
            bit = 1 << c.cpu
            all_cpus |= bit
            core_cpus[c.core] = core_cpus.get(c.core, 0) | bit
            socket_cpus[c.socket] = socket_cpus.get(c.socket, 0) | bit
            numa_cpus[c.numa] = numa_cpus.get(c.numa, 0) | bit
            uncore_cpus[c.uncore] = uncore_cpus.get(c.uncore, 0) | bit
        object.__setattr__(self, "core_cpus", _sorted_frozen(core_cpus))
        object.__setattr__(self, "socket_cpus", _sorted_frozen(socket_cpus))
        object.__setattr__(self, "numa_cpus", _sorted_frozen(numa_cpus))
        object.__setattr__(self, "uncore_cpus", _sorted_frozen(uncore_cpus))
        object.__setattr__(self, "all_cpus", all_cpus)
        # The relations from each core's (socket, NUMA node, uncore) once: a core's CPUs
        # usually share them, so grouping the distinct triples does a fraction of the work.
        homes = {(c.core, c.socket, c.numa, c.uncore) for c in cpus}
        relations = {
            "sockets_of_numa": _group({(numa, socket) for _, socket, numa, _ in homes}),
            "numas_of_socket": _group({(socket, numa) for _, socket, numa, _ in homes}),
            "cores_of_socket": _group({(socket, core) for core, socket, _, _ in homes}),
            "cores_of_numa": _group({(numa, core) for core, _, numa, _ in homes}),
            "uncores_of_numa": _group({(numa, uncore) for _, _, numa, uncore in homes}),
        }
        for name, value in relations.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "numa_of_cpu", _frozen({c.cpu: c.numa for c in cpus}))
        object.__setattr__(self, "core_of_cpu", _frozen({c.cpu: c.core for c in cpus}))

    # --- the kubelet's counters -------------------------------------------------------------
    # Cached: the algorithms read them on every step, and the layout never changes.

    @cached_property
    def num_cpus(self) -> int:
        return len(self.cpus)

    @cached_property
    def num_cores(self) -> int:
        return len(self.core_cpus)

    @cached_property
    def num_sockets(self) -> int:
        return len(self.socket_cpus)

    @cached_property
    def num_numa_nodes(self) -> int:
        return len(self.numa_cpus)

    @cached_property
    def num_uncore_caches(self) -> int:
        return len(self.uncore_cpus)

    @cached_property
    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores

    @cached_property
    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets

    @cached_property
    def cpus_per_uncore(self) -> int:
        return self.num_cpus // self.num_uncore_caches

    @cached_property
    def numa_first(self) -> bool:
        """NUMA nodes are the bigger unit (or equal): take whole NUMA nodes before sockets."""
        return self.num_sockets >= self.num_numa_nodes

    @cached_property
    def numa_ids(self) -> tuple[int, ...]:
        return tuple(self.numa_cpus)

    @cached_property
    def biggest_numa_nodes_cpus(self) -> tuple[int, ...]:
        """Entry k - 1: the CPUs of the k NUMA nodes with the most, together."""
        sizes = sorted((mask.bit_count() for mask in self.numa_cpus.values()), reverse=True)
        return tuple(itertools.accumulate(sizes))

    @cached_property
    def smallest_numa_node(self) -> int:
        """CPUs of the NUMA node with the fewest (its real size, not the average)."""
        return min(mask.bit_count() for mask in self.numa_cpus.values())

    # --- questions callers ask ----------------------------------------------------------------

    def cpu_ids(self) -> frozenset[int]:
        return frozenset(c.cpu for c in self.cpus)

    def cpus_in_numa_nodes(self, nodes: Iterable[int]) -> frozenset[int]:
        return set_of(self.numa_nodes_mask(nodes))

    def numa_nodes_mask(self, nodes: Iterable[int]) -> int:
        """The CPUs of ``nodes`` as a bit mask."""
        return self._union(self.numa_cpus, nodes)

    def sockets_mask(self, sockets: Iterable[int]) -> int:
        """The CPUs of ``sockets`` as a bit mask."""
        return self._union(self.socket_cpus, sockets)

    def cpus_in_cores(self, cores: Iterable[int]) -> frozenset[int]:
        return set_of(self._union(self.core_cpus, cores))

    def cpus_in_sockets(self, sockets: Iterable[int]) -> frozenset[int]:
        return set_of(self.sockets_mask(sockets))

    def sockets_of_numa_nodes(self, nodes: Iterable[int]) -> frozenset[int]:
        return frozenset(s for n in nodes for s in self.sockets_of_numa.get(n, ()))

    def siblings(self, cpus: Iterable[int]) -> frozenset[int]:
        """Every CPU sharing a core with one of ``cpus`` (the CPUs themselves included)."""
        wanted = mask_of(cpus) & self.all_cpus
        cores = {c.core for c in self.cpus if wanted >> c.cpu & 1}
        return set_of(self._union(self.core_cpus, cores))

    @staticmethod
    def _union(masks: Mapping[int, int], ids: Iterable[int]) -> int:
        out = 0
        for i in ids:
            out |= masks.get(i, 0)
        return out

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_topology(cls, topology: Topology) -> CPUTopology:
        """The online CPUs of a discovered machine; L3 is the uncore cache.

        An online CPU the kernel puts on no NUMA node (a kernel without NUMA) counts as node 0.
        """
        return cpu_topology(_records(topology))


def _records(topology: Topology) -> list[dict[str, Any]]:
    """The online CPUs as ``cpu_topology`` reads them."""
    return [{"cpu": c.id, "core": c.core, "socket": c.socket,
             "numa": 0 if c.numa is None else c.numa, "uncore_cache": c.l3}
            for c in topology.cpus if c.online]


_REQUIRED = ("cpu", "core", "socket", "numa")


def cpu_topology(records: Iterable[Mapping[str, Any]]) -> CPUTopology:
    """Records ``{cpu, core, socket, numa, uncore_cache}`` → CPUTopology.

    ``uncore_cache`` may be missing or None (no uncore information: the socket stands in).
    """
    infos = []
    seen: dict[int, int] = {}
    for index, record in enumerate(records):
        info = _read_record(index, record)
        if info.cpu in seen:
            raise CPUTopologyError(
                f"record {index}: cpu {info.cpu} already given by record {seen[info.cpu]}")
        seen[info.cpu] = index
        infos.append(info)
    if not infos:
        raise CPUTopologyError("no CPUs: a CPU topology needs at least one record")
    _check_cores(infos)
    return CPUTopology(tuple(infos))


def _read_record(index: int, record: Any) -> CPUInfo:
    if not isinstance(record, Mapping):
        raise CPUTopologyError(f"record {index} must be a mapping, not {type(record).__name__}")
    values: dict[str, int] = {}
    for key in _REQUIRED:
        where = f"record {index}" if key == "cpu" else f"record {index} (cpu {values['cpu']})"
        if key not in record or record[key] is None:
            raise CPUTopologyError(f"{where}: {key} is missing")
        values[key] = _id(record[key], where, key)
    uncore = record.get("uncore_cache")
    where = f"record {index} (cpu {values['cpu']})"
    values["uncore"] = values["socket"] if uncore is None else _id(uncore, where, "uncore_cache")
    return CPUInfo(**values)


def _id(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CPUTopologyError(f"{where}: {key} must be a non-negative integer, not {value!r}")
    return value


def _check_cores(infos: list[CPUInfo]) -> None:
    """A core lives in one socket and one NUMA node; ids repeated across packages break that."""
    home: dict[int, tuple[int, int, int]] = {}
    for info in infos:
        where = (info.socket, info.numa, info.cpu)
        first = home.setdefault(info.core, where)
        if first[:2] != where[:2]:
            raise CPUTopologyError(
                f"core {info.core} has cpu {first[2]} on socket {first[0]} / NUMA node {first[1]}"
                f" and cpu {info.cpu} on socket {info.socket} / NUMA node {info.numa};"
                " core ids must be unique machine-wide")

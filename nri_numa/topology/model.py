"""The machine as one immutable value, ``Topology``, and its JSON form. Its parts (CPUs, NUMA
nodes, PCI devices, NICs, GPUs) are values of ``nri_numa.topology.parts``.

The JSON form is documented in docs/topology-json.md; ``SCHEMA_VERSION`` changes whenever a
reader of the old form would misread the new one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from nri_numa.safeio.bounds import MAX_DIGITS, clip, quote
from nri_numa.safeio.documents import DocumentError, NotParsedError, load_json
from nri_numa.topology.cpulist import MAX_ID, format_list, parse_list
from nri_numa.topology.parts import PCIE_LEVELS, Cpu, Gpu, HugePages, Nic, NumaNode, PciDevice

SCHEMA_VERSION = 1


class TopologyFormatError(ValueError):
    """Topology JSON that does not describe a machine; the message names the field."""


_BY_ID, _BY_ADDRESS = attrgetter("id"), attrgetter("address")
_BY_NAME, _BY_INDEX = attrgetter("name"), attrgetter("index")


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True)
class Topology:
    cpus: tuple[Cpu, ...]
    numa_nodes: tuple[NumaNode, ...]
    isolcpus: frozenset[int] = frozenset()
    pci_devices: tuple[PciDevice, ...] = ()
    nics: tuple[Nic, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "cpus", tuple(sorted(self.cpus, key=_BY_ID)))
        object.__setattr__(self, "numa_nodes", tuple(sorted(self.numa_nodes, key=_BY_ID)))
        object.__setattr__(self, "isolcpus", frozenset(self.isolcpus))
        object.__setattr__(self, "pci_devices", tuple(sorted(self.pci_devices, key=_BY_ADDRESS)))
        object.__setattr__(self, "nics", tuple(sorted(self.nics, key=_BY_NAME)))
        object.__setattr__(self, "gpus", tuple(sorted(self.gpus, key=_BY_INDEX)))
        object.__setattr__(self, "warnings", tuple(self.warnings))

    # Cached: building an engine context asks for it several times (the configuration's
    # checks, the shared pool, the isolated CPUs), and the CPUs never change.
    @cached_property
    def online_cpus(self) -> frozenset[int]:
        return frozenset(c.id for c in self.cpus if c.online)

    def node(self, node_id: int) -> NumaNode:
        node = self._node_by_id.get(node_id)
        if node is None:
            raise KeyError(f"no NUMA node {node_id}")
        return node

    def pci(self, address: str) -> PciDevice | None:
        return self._pci_by_address.get(address)

    # Indexed once rather than scanned per lookup (device choice asks per GPU pair and NIC
    # candidate). Cached properties are not fields: no part of eq, repr or to_json.
    @cached_property
    def _node_by_id(self) -> Mapping[int, NumaNode]:
        return MappingProxyType({n.id: n for n in reversed(self.numa_nodes)})  # first wins

    @cached_property
    def _pci_by_address(self) -> Mapping[str, PciDevice]:
        return MappingProxyType({d.address: d for d in reversed(self.pci_devices)})

    def without_warnings(self) -> Topology:
        return Topology(self.cpus, self.numa_nodes, self.isolcpus, self.pci_devices,
                        self.nics, self.gpus)

    # --- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "cpus": [
                {"id": c.id, "core": c.core, "socket": c.socket, "die": c.die, "numa": c.numa,
                 "l3": c.l3, "online": c.online}
                for c in self.cpus
            ],
            "isolcpus": format_list(self.isolcpus),
            "numa_nodes": [
                {
                    "id": n.id,
                    "cpus": format_list(n.cpus),
                    "memory_bytes": n.memory_bytes,
                    "hugepages": {str(k): {"total": v.total, "free": v.free}
                                  for k, v in sorted(n.hugepages.items())},
                    "distances": {str(k): v for k, v in sorted(n.distances.items())},
                }
                for n in self.numa_nodes
            ],
            "pci_devices": [
                {
                    "address": d.address, "numa_node": d.numa_node,
                    "class": f"0x{d.class_code:06x}", "vendor": f"0x{d.vendor:04x}",
                    "device": f"0x{d.device:04x}", "local_cpus": format_list(d.local_cpus),
                    "bridges": list(d.bridges), "host_bridge": d.host_bridge,
                    "physfn": d.physfn, "virtfns": list(d.virtfns), "driver": d.driver,
                }
                for d in self.pci_devices
            ],
            "nics": [
                {"name": n.name, "pci_address": n.pci_address, "vfs": list(n.vfs),
                 "rdma": list(n.rdma)}
                for n in self.nics
            ],
            "gpus": [
                {
                    "index": g.index, "uuid": g.uuid, "minor": g.minor, "name": g.name,
                    "pci_address": g.pci_address, "numa_node": g.numa_node,
                    "nvswitch_links": g.nvswitch_links,
                    "nvlink_peers": dict(sorted(g.nvlink_peers.items())),
                    "pcie": dict(sorted(g.pcie.items())),
                }
                for g in self.gpus
            ],
            "warnings": list(self.warnings),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> Topology:
        return _TopologyReader(data).read()

    @classmethod
    def from_json(cls, text: str) -> Topology:
        # Nesting, values and digits bounded before anything is walked (nri_numa.safeio.documents).
        try:
            data = load_json(text, "topology")
        except NotParsedError as e:
            raise TopologyFormatError(f"topology is not JSON: {e.detail}") from None
        except DocumentError as e:
            raise TopologyFormatError(str(e)) from None
        return cls.from_dict(data)


class _TopologyReader:
    """Reads the JSON form strictly, naming the path of the first bad field."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def read(self) -> Topology:
        d = self._obj(self.data, "topology")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise TopologyFormatError(
                f"schema_version is {quote(version)}; this nri-numa reads {SCHEMA_VERSION}")
        return Topology(
            cpus=tuple(self._cpu(c, f"cpus[{i}]") for i, c in enumerate(self._arr(d, "cpus"))),
            numa_nodes=tuple(self._node(n, f"numa_nodes[{i}]")
                             for i, n in enumerate(self._arr(d, "numa_nodes"))),
            isolcpus=self._list(d.get("isolcpus", ""), "isolcpus"),
            pci_devices=tuple(self._pci(p, f"pci_devices[{i}]")
                              for i, p in enumerate(self._arr(d, "pci_devices", required=False))),
            nics=tuple(self._nic(n, f"nics[{i}]")
                       for i, n in enumerate(self._arr(d, "nics", required=False))),
            gpus=tuple(self._gpu(g, f"gpus[{i}]")
                       for i, g in enumerate(self._arr(d, "gpus", required=False))),
            warnings=tuple(self._str(w, f"warnings[{i}]")
                           for i, w in enumerate(self._arr(d, "warnings", required=False))),
        )

    def _cpu(self, raw: Any, where: str) -> Cpu:
        c = self._obj(raw, where)
        return Cpu(
            id=self._id(c.get("id"), f"{where}.id"),
            numa=self._opt_id(c.get("numa"), f"{where}.numa"),
            online=self._bool(c.get("online", True), f"{where}.online"),
            core=self._opt_int(c.get("core"), f"{where}.core"),
            socket=self._opt_int(c.get("socket"), f"{where}.socket"),
            die=self._opt_int(c.get("die"), f"{where}.die"),
            l3=self._opt_int(c.get("l3"), f"{where}.l3"),
        )

    def _node(self, raw: Any, where: str) -> NumaNode:
        n = self._obj(raw, where)
        hugepages = {}
        for size, counts in self._obj(n.get("hugepages", {}), f"{where}.hugepages").items():
            w = f"{where}.hugepages.{clip(str(size))}"
            counts = self._obj(counts, w)
            hugepages[self._int(size, w)] = HugePages(self._int(counts.get("total"), f"{w}.total"),
                                                      self._int(counts.get("free"), f"{w}.free"))
        distances = {self._id(k, f"{where}.distances"):
                     self._int(v, f"{where}.distances.{clip(str(k))}")
                     for k, v in self._obj(n.get("distances", {}), f"{where}.distances").items()}
        return NumaNode(
            id=self._id(n.get("id"), f"{where}.id"),
            cpus=self._list(n.get("cpus", ""), f"{where}.cpus"),
            memory_bytes=self._int(n.get("memory_bytes"), f"{where}.memory_bytes"),
            hugepages=hugepages,
            distances=distances,
        )

    def _pci(self, raw: Any, where: str) -> PciDevice:
        p = self._obj(raw, where)
        return PciDevice(
            address=self._str(p.get("address"), f"{where}.address"),
            numa_node=self._opt_id(p.get("numa_node"), f"{where}.numa_node"),
            class_code=self._int(p.get("class"), f"{where}.class"),
            vendor=self._int(p.get("vendor"), f"{where}.vendor"),
            device=self._int(p.get("device"), f"{where}.device"),
            local_cpus=self._list(p.get("local_cpus", ""), f"{where}.local_cpus"),
            bridges=self._strs(p.get("bridges", []), f"{where}.bridges"),
            host_bridge=self._opt_str(p.get("host_bridge"), f"{where}.host_bridge"),
            physfn=self._opt_str(p.get("physfn"), f"{where}.physfn"),
            virtfns=self._strs(p.get("virtfns", []), f"{where}.virtfns"),
            driver=self._opt_str(p.get("driver"), f"{where}.driver"),
        )

    def _nic(self, raw: Any, where: str) -> Nic:
        n = self._obj(raw, where)
        return Nic(
            name=self._str(n.get("name"), f"{where}.name"),
            pci_address=self._opt_str(n.get("pci_address"), f"{where}.pci_address"),
            vfs=self._strs(n.get("vfs", []), f"{where}.vfs"),
            rdma=self._strs(n.get("rdma", []), f"{where}.rdma"),
        )

    def _gpu(self, raw: Any, where: str) -> Gpu:
        g = self._obj(raw, where)
        peers = self._obj(g.get("nvlink_peers", {}), f"{where}.nvlink_peers")
        pcie = self._obj(g.get("pcie", {}), f"{where}.pcie")
        for k, v in pcie.items():
            if v not in PCIE_LEVELS:
                raise TopologyFormatError(
                    f"{where}.pcie.{clip(str(k))} is {quote(v)}; expected one of "
                    f"{', '.join(PCIE_LEVELS)}")
        return Gpu(
            index=self._int(g.get("index"), f"{where}.index"),
            uuid=self._str(g.get("uuid"), f"{where}.uuid"),
            pci_address=self._str(g.get("pci_address"), f"{where}.pci_address"),
            numa_node=self._opt_id(g.get("numa_node"), f"{where}.numa_node"),
            minor=self._opt_int(g.get("minor"), f"{where}.minor"),
            name=self._str(g.get("name", ""), f"{where}.name"),
            nvswitch_links=self._int(g.get("nvswitch_links", 0), f"{where}.nvswitch_links"),
            nvlink_peers={str(k): self._int(v, f"{where}.nvlink_peers.{clip(str(k))}")
                          for k, v in peers.items()},
            pcie={str(k): v for k, v in pcie.items()},
        )

    # --- primitives ---------------------------------------------------------------------------

    @staticmethod
    def _obj(v: Any, where: str) -> dict:
        if not isinstance(v, dict):
            raise TopologyFormatError(f"{where} must be an object, not {type(v).__name__}")
        return v

    @staticmethod
    def _arr(d: dict, key: str, required: bool = True) -> list:
        if key not in d:
            if required:
                raise TopologyFormatError(f"{key} is missing")
            return []
        if not isinstance(d[key], list):
            raise TopologyFormatError(f"{key} must be a list, not {type(d[key]).__name__}")
        return d[key]

    @staticmethod
    def _int(v: Any, where: str) -> int:
        if isinstance(v, bool):
            raise TopologyFormatError(f"{where} must be an integer, not a boolean")
        if isinstance(v, int):
            return v
        if isinstance(v, str) and len(v) <= MAX_DIGITS:  # int() is slow on long digit runs
            try:
                return int(v, 0)
            except ValueError:
                pass
        raise TopologyFormatError(f"{where} must be an integer, not {quote(v)}")

    def _opt_int(self, v: Any, where: str) -> int | None:
        return None if v is None else self._int(v, where)

    def _id(self, v: Any, where: str) -> int:
        """A CPU or NUMA node id: the engine makes a bit of each, so 10**30 would cost."""
        value = self._int(v, where)
        if value > MAX_ID:
            raise TopologyFormatError(f"{where} is {quote(value)}; ids go up to {MAX_ID}")
        return value

    def _opt_id(self, v: Any, where: str) -> int | None:
        return None if v is None else self._id(v, where)

    @staticmethod
    def _bool(v: Any, where: str) -> bool:
        if not isinstance(v, bool):
            raise TopologyFormatError(f"{where} must be true or false, not {quote(v)}")
        return v

    @staticmethod
    def _str(v: Any, where: str) -> str:
        if not isinstance(v, str):
            raise TopologyFormatError(f"{where} must be a string, not {quote(v)}")
        return v

    def _opt_str(self, v: Any, where: str) -> str | None:
        return None if v is None else self._str(v, where)

    def _strs(self, v: Any, where: str) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise TopologyFormatError(f"{where} must be a list of strings")
        return tuple(self._str(s, f"{where}[{i}]") for i, s in enumerate(v))

    @staticmethod
    def _list(v: Any, where: str) -> frozenset[int]:
        if isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                       and 0 <= i <= MAX_ID for i in v):
            return frozenset(v)
        if not isinstance(v, str):
            raise TopologyFormatError(f"{where} must be a CPU list such as \"0-3,8\" (ids up to "
                                      f"{MAX_ID}), not {quote(v)}")
        try:
            return parse_list(v)
        except ValueError as e:
            raise TopologyFormatError(f"{where}: {e}") from None


"""The fake NVML's machine description (``fake-nvml.json``): its form, derived from a topology,
and read strictly. The format is documented in ``nri_numa.topology.fake_nvml``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nri_numa.topology.model import Topology
from nri_numa.topology.nvml import NVSWITCH_CLASS, PciId, format_pci_address, parse_pci_address
from nri_numa.topology.parts import PCIE_LEVELS, Gpu

DRIVER_VERSION = "550.54.15"  # what descriptions derived from a topology claim
# NVLink4 switches (HGX H100) are not on the host's PCI bus: switch links then name this.
NVSWITCH_PLACEHOLDER = "ffff:ff:1f.0"

# nvmlNvLinkDeviceType_t
_REMOTE_TYPES = {"gpu": 0x00, "npu": 0x01, "switch": 0x02, "unknown": 0xFF}


class FakeNvmlFormatError(ValueError):
    """A fake NVML description that cannot be used; the message names the field."""


# --- the description ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Link:
    remote: PciId
    remote_type: int
    active: bool


@dataclass(frozen=True, slots=True)
class FakeGpu:
    uuid: str
    name: str
    pci: PciId
    minor: int | None
    numa_node: int | None
    links: tuple[Link, ...]
    pcie: dict[PciId, int]  # other GPU → nvmlGpuTopologyLevel_t
    errors: dict[str, int]  # C symbol → return code


def description_from_topology(topology: Topology) -> dict:
    """The fake NVML description under which ``nvml.read_gpus`` gives back ``topology.gpus``.

    NVSwitch links go round-robin over the topology's NVSwitch PCI devices; direct links to a
    peer are its ``nvlink_peers`` count less what the shared NVSwitch fabric accounts for.
    NVML indexes come out dense (0, 1, …) in the topology's order. A topology whose peer
    counts fall short of what its NVSwitch links imply raises ValueError.
    """
    switches = [d.address for d in topology.pci_devices if d.class_code == NVSWITCH_CLASS]
    switches = switches or [NVSWITCH_PLACEHOLDER]
    by_address = {g.pci_address: g for g in topology.gpus}
    gpus = []
    for gpu in topology.gpus:
        links = [{"remote_pci": switches[i % len(switches)], "remote_type": "switch"}
                 for i in range(gpu.nvswitch_links)]
        for peer, count in sorted(gpu.nvlink_peers.items()):
            links += [{"remote_pci": peer, "remote_type": "gpu"}
                      for _ in range(_direct_links(gpu, by_address.get(peer), count))]
        gpus.append({"uuid": gpu.uuid, "name": gpu.name, "pci_address": gpu.pci_address,
                     "minor": gpu.minor, "numa_node": gpu.numa_node, "nvlinks": links,
                     "pcie": dict(sorted(gpu.pcie.items()))})
    for gpu in topology.gpus:  # a pair on one NVSwitch fabric cannot lack the fabric's links
        for other in topology.gpus:
            if other is not gpu and other.pci_address not in gpu.nvlink_peers:
                _direct_links(gpu, other, 0)
    return {"driver_version": DRIVER_VERSION, "gpus": gpus}


def _direct_links(gpu: Gpu, peer: Gpu | None, count: int) -> int:
    fabric = 0
    if peer is not None and gpu.nvswitch_links > 0 and peer.nvswitch_links > 0:
        fabric = min(gpu.nvswitch_links, peer.nvswitch_links)
    if count < fabric:
        raise ValueError(
            f"GPU {gpu.index} ({gpu.pci_address}) counts {count} NVLinks to "
            f"{peer.pci_address if peer else '?'}, fewer than the {fabric} their NVSwitch "
            "links give every pair; the topology contradicts itself")
    return count - fabric


class DescriptionReader:
    """Checks a description strictly, naming the path of the first bad field."""

    def __init__(self, nvml_module: Any, functions: frozenset[str]) -> None:
        self.functions = functions  # the C symbols the fake library answers
        self.nvml = nvml_module

    def read(self, raw: Any) -> tuple[str, int, frozenset[str], tuple[FakeGpu, ...]]:
        d = _obj(raw, "description")
        version = _str(d.get("driver_version", DRIVER_VERSION), "driver_version")
        init = d.get("init_error")
        init_code = self.nvml.NVML_SUCCESS if init is None else self._error(init, "init_error")
        missing = d.get("missing_functions", [])
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise FakeNvmlFormatError("missing_functions must be a list of NVML function names")
        if not isinstance(d.get("gpus"), list):
            raise FakeNvmlFormatError("gpus must be a list of GPU objects")
        gpus = tuple(self._gpu(g, f"gpus[{i}]") for i, g in enumerate(d["gpus"]))
        for name, values in (("pci_address", [format_pci_address(g.pci) for g in gpus]),
                             ("uuid", [g.uuid for g in gpus])):
            if twice := sorted({v for v in values if values.count(v) > 1}):
                raise FakeNvmlFormatError(f"gpus: {name} {twice[0]} appears more than once")
        for i, gpu in enumerate(gpus):
            if stray := sorted(gpu.pcie.keys() - {g.pci for g in gpus}):
                raise FakeNvmlFormatError(f"gpus[{i}].pcie: {format_pci_address(stray[0])} is "
                                          "not the address of a GPU in this description")
        return version, init_code, frozenset(missing), gpus

    def _gpu(self, raw: Any, where: str) -> FakeGpu:
        g = _obj(raw, where)
        links = g.get("nvlinks", [])
        if not isinstance(links, list):
            raise FakeNvmlFormatError(f"{where}.nvlinks must be a list")
        if len(links) > self.nvml.NVML_NVLINK_MAX_LINKS:
            raise FakeNvmlFormatError(f"{where}.nvlinks has {len(links)} links; this NVML has at "
                                      f"most {self.nvml.NVML_NVLINK_MAX_LINKS}")
        errors = _obj(g.get("errors", {}), f"{where}.errors")
        for symbol in errors:
            if symbol not in self.functions:
                raise FakeNvmlFormatError(f"{where}.errors: the fake has no NVML function {symbol!r}")
        return FakeGpu(
            uuid=_str(g.get("uuid"), f"{where}.uuid"),
            name=_str(g.get("name", ""), f"{where}.name"),
            pci=_pci(g.get("pci_address"), f"{where}.pci_address"),
            minor=_opt_int(g.get("minor"), f"{where}.minor"),
            numa_node=_opt_int(g.get("numa_node"), f"{where}.numa_node"),
            links=tuple(_link(link, f"{where}.nvlinks[{i}]") for i, link in enumerate(links)),
            pcie={_pci(k, f"{where}.pcie"): _level(v, f"{where}.pcie.{k}")
                  for k, v in _obj(g.get("pcie", {}), f"{where}.pcie").items()},
            errors={k: self._error(v, f"{where}.errors.{k}") for k, v in errors.items()},
        )

    def _error(self, name: Any, where: str) -> int:
        cls = getattr(self.nvml, f"NVMLError_{name}", None) if isinstance(name, str) else None
        if cls is None:
            raise FakeNvmlFormatError(f"{where} is {name!r}; expected the name of an NVML error "
                                      "such as DriverNotLoaded (pynvml's NVMLError_<name>)")
        return cls().value


def _link(raw: Any, where: str) -> Link:
    link = _obj(raw, where)
    kind, active = link.get("remote_type"), link.get("active", True)
    if kind not in _REMOTE_TYPES:
        raise FakeNvmlFormatError(f"{where}.remote_type is {kind!r}; expected one of "
                                  f"{', '.join(_REMOTE_TYPES)}")
    if not isinstance(active, bool):
        raise FakeNvmlFormatError(f"{where}.active must be true or false, not {active!r}")
    return Link(_pci(link.get("remote_pci"), f"{where}.remote_pci"), _REMOTE_TYPES[kind], active)


def _level(word: Any, where: str) -> int:
    if word not in PCIE_LEVELS:
        raise FakeNvmlFormatError(f"{where} is {word!r}; expected one of {', '.join(PCIE_LEVELS)}")
    return PCIE_LEVELS.index(word) * 10  # nvmlGpuTopologyLevel_t: 0, 10, … 50


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise FakeNvmlFormatError(f"{where} must be an object, not {type(v).__name__}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise FakeNvmlFormatError(f"{where} must be a string, not {v!r}")
    return v


def _opt_int(v: Any, where: str) -> int | None:
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return v
    raise FakeNvmlFormatError(f"{where} must be a non-negative integer or null, not {v!r}")


def _pci(v: Any, where: str) -> PciId:
    text = _str(v, where)
    try:
        return parse_pci_address(text)
    except ValueError as e:
        raise FakeNvmlFormatError(f"{where}: {e}") from None

"""A fake NVML for machines without a GPU, at the level of the C library.

The fake replaces ``pynvml.nvmlLib`` (the ``ctypes.CDLL`` of libnvidia-ml.so.1) with an object
whose methods carry the C symbols' names. The real nvidia-ml-py wrappers call them with the same
ctypes arguments they would pass to C, the methods fill those arguments and return NVML return
codes, and pynvml raises its real exception classes. So the real binding, its decoding and our
real adapter (``nri_numa.topology.nvml``) all run unchanged.

pynvml internals this relies on (checked against nvidia-ml-py 13.615.71):
- ``nvmlLib``: the loaded library, looked up per symbol with ``getattr``;
- ``_nvmlGetFunctionPointer_cache``: symbol → callable, cleared on install and restored after;
- ``_nvmlLib_refcount``: the init count, saved and restored;
- ``CDLL``: the name ``from ctypes import *`` put into pynvml; replaced so that the real
  library is never loaded while a fake is installed (and so that ``installed(None)`` makes
  ``nvmlInit`` raise ``NVMLError_LibraryNotFound``);
- a ``byref(x)`` argument holds ``x`` in ``._obj``: that is how out-parameters are filled.

The description (``fake-nvml.json`` in a generated sysfs tree)::

    {"driver_version": "550.54.15",
     "gpus": [                       # NVML index order
       {"uuid": "GPU-8c2b1f1e-…", "name": "NVIDIA H100 80GB HBM3",
        "pci_address": "0000:1b:00.0", "minor": 0,
        "numa_node": 0,              # answers nvmlDeviceGetMemoryAffinity
        "nvlinks": [{"remote_pci": "0000:c4:00.0", "remote_type": "switch"},
                    {"remote_pci": "0000:43:00.0", "remote_type": "gpu"}],
        "pcie": {"0000:43:00.0": "multiple"}}      # other GPU address → PCIE_LEVELS word
     ]}

Per GPU only ``uuid`` and ``pci_address`` are required. ``minor`` null means the call is not
supported; ``numa_node`` null an empty memory affinity. A link may say ``"active": false``;
``remote_type`` is gpu, switch, npu or unknown. A GPU pair missing from ``pcie`` answers
NotSupported. To simulate failures:
- ``"init_error": "DriverNotLoaded"`` (any pynvml ``NVMLError_<Name>``): nvmlInit fails so;
- ``"missing_functions": ["nvmlDeviceGetNvLinkRemoteDeviceType"]``: C symbols an older
  driver lacks (pynvml raises NVMLError_FunctionNotFound);
- per GPU, ``"errors": {"nvmlDeviceGetUUID": "Unknown"}``: that C call fails for that GPU.
A missing library is ``installed(None)``.
"""

from __future__ import annotations

import ctypes
import functools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.topology import nvml
from nri_numa.topology.model import PCIE_LEVELS, Gpu, PciDevice, Topology
from nri_numa.topology.nvml import NVSWITCH_CLASS, PciId, format_pci_address, parse_pci_address

DRIVER_VERSION = "550.54.15"  # what descriptions derived from a topology claim
# NVLink4 switches (HGX H100) are not on the host's PCI bus: switch links then name this.
NVSWITCH_PLACEHOLDER = "ffff:ff:1f.0"

# nvmlReturn_t values from nvml.h: C ABI, never renumbered.
_SUCCESS, _UNINITIALIZED, _INVALID_ARGUMENT, _NOT_SUPPORTED, _INSUFFICIENT_SIZE = 0, 1, 2, 3, 7
# nvmlNvLinkDeviceType_t
_REMOTE_TYPES = {"gpu": 0x00, "npu": 0x01, "switch": 0x02, "unknown": 0xFF}


class FakeNvmlFormatError(ValueError):
    """A fake NVML description that cannot be used; the message names the field."""


# --- the description ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _Link:
    remote: PciId
    remote_type: int
    active: bool


@dataclass(frozen=True)
class _FakeGpu:
    uuid: str
    name: str
    pci: PciId
    minor: int | None
    numa_node: int | None
    links: tuple[_Link, ...]
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


class _DescriptionReader:
    """Checks a description strictly, naming the path of the first bad field."""

    def __init__(self, nvml_module: Any) -> None:
        self.nvml = nvml_module

    def read(self, raw: Any) -> tuple[str, int, frozenset[str], tuple[_FakeGpu, ...]]:
        d = _obj(raw, "description")
        version = _str(d.get("driver_version", DRIVER_VERSION), "driver_version")
        init = d.get("init_error")
        init_code = _SUCCESS if init is None else self._error(init, "init_error")
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

    def _gpu(self, raw: Any, where: str) -> _FakeGpu:
        g = _obj(raw, where)
        links = g.get("nvlinks", [])
        if not isinstance(links, list):
            raise FakeNvmlFormatError(f"{where}.nvlinks must be a list")
        if len(links) > self.nvml.NVML_NVLINK_MAX_LINKS:
            raise FakeNvmlFormatError(f"{where}.nvlinks has {len(links)} links; this NVML has at "
                                      f"most {self.nvml.NVML_NVLINK_MAX_LINKS}")
        errors = _obj(g.get("errors", {}), f"{where}.errors")
        for symbol in errors:
            if not symbol.startswith("nvml") or not callable(getattr(FakeNvmlLibrary, symbol, None)):
                raise FakeNvmlFormatError(f"{where}.errors: the fake has no NVML function {symbol!r}")
        return _FakeGpu(
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


def _link(raw: Any, where: str) -> _Link:
    link = _obj(raw, where)
    kind, active = link.get("remote_type"), link.get("active", True)
    if kind not in _REMOTE_TYPES:
        raise FakeNvmlFormatError(f"{where}.remote_type is {kind!r}; expected one of "
                                  f"{', '.join(_REMOTE_TYPES)}")
    if not isinstance(active, bool):
        raise FakeNvmlFormatError(f"{where}.active must be true or false, not {active!r}")
    return _Link(_pci(link.get("remote_pci"), f"{where}.remote_pci"), _REMOTE_TYPES[kind], active)


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


# --- the library -------------------------------------------------------------------------------

class _Fail(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _c_function(method: Callable[..., None]) -> Callable[..., int]:
    """Turns a method that fills out-parameters (or raises _Fail) into an nvmlReturn_t."""
    @functools.wraps(method)
    def call(self: FakeNvmlLibrary, *args: Any) -> int:
        try:
            method(self, *args)
        except _Fail as failure:
            return failure.code
        return _SUCCESS
    return call


def _device_function(method: Callable[..., None]) -> Callable[..., int]:
    """A C function whose first argument is a device handle; the method gets the described GPU
    instead, once NVML's checks pass (initialised, a valid handle, no simulated error)."""
    def with_gpu(self: FakeNvmlLibrary, handle: Any, *args: Any) -> None:
        method(self, self._gpu(handle, method.__name__), *args)
    return _c_function(functools.wraps(method)(with_gpu))


def _out(ref: Any) -> Any:
    return ref._obj  # the object behind byref(): see the module docstring


def _int(v: Any) -> int:
    return v.value if hasattr(v, "value") else int(v)  # pynvml passes c_uint or plain ints


class FakeNvmlLibrary:
    """Stands in for libnvidia-ml.so.1; built from a description (see the module docstring)."""

    def __init__(self, description: dict) -> None:
        import pynvml

        (self.driver_version, self._init_code, self._missing,
         self._gpus) = _DescriptionReader(pynvml).read(description)
        self.sessions = 0  # nvmlInit calls not yet matched by nvmlShutdown

    def __getattribute__(self, name: str) -> Any:
        # pynvml looks symbols up with getattr; an older driver's library lacks some.
        if name.startswith("nvml") and name in object.__getattribute__(self, "_missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # --- helpers ---

    def _require_init(self) -> None:
        if self.sessions == 0:
            raise _Fail(_UNINITIALIZED)

    def _gpu(self, handle: Any, symbol: str) -> _FakeGpu:
        self._require_init()
        index = (ctypes.cast(handle, ctypes.c_void_p).value or 0) - 1
        if not 0 <= index < len(self._gpus):
            raise _Fail(_INVALID_ARGUMENT)
        return self._checked(self._gpus[index], symbol)

    @staticmethod
    def _checked(gpu: _FakeGpu, symbol: str) -> _FakeGpu:
        if symbol in gpu.errors:
            raise _Fail(gpu.errors[symbol])
        return gpu

    @staticmethod
    def _link(gpu: _FakeGpu, link: Any) -> _Link:
        links = gpu.links
        if not links:
            raise _Fail(_NOT_SUPPORTED)
        if not 0 <= _int(link) < len(links):
            raise _Fail(_INVALID_ARGUMENT)
        return links[_int(link)]

    @staticmethod
    def _put_string(buffer: Any, size: Any, text: str) -> None:
        data = text.encode()
        if len(data) + 1 > _int(size):
            raise _Fail(_INSUFFICIENT_SIZE)
        buffer.value = data

    @staticmethod
    def _put_pci(ref: Any, pci: PciId) -> None:
        info = _out(ref)
        domain, bus, device, function = pci
        info.busId = f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}".encode()
        info.busIdLegacy = f"{domain:04X}:{bus:02X}:{device:02X}.{function:X}".encode()
        info.domain, info.bus, info.device = domain, bus, device

    # --- the C functions ---

    @_c_function
    def nvmlInitWithFlags(self, flags: Any) -> None:
        if self._init_code != _SUCCESS:
            raise _Fail(self._init_code)
        self.sessions += 1

    @_c_function
    def nvmlShutdown(self) -> None:
        self._require_init()  # as NVML does for a shutdown without an init
        self.sessions -= 1

    @_c_function
    def nvmlSystemGetDriverVersion(self, buffer: Any, size: Any) -> None:
        self._require_init()
        self._put_string(buffer, size, self.driver_version)

    @_c_function
    def nvmlDeviceGetCount_v2(self, count: Any) -> None:
        self._require_init()
        _out(count).value = len(self._gpus)

    @_c_function
    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, handle: Any) -> None:
        self._require_init()
        if not 0 <= _int(index) < len(self._gpus):
            raise _Fail(_INVALID_ARGUMENT)
        self._checked(self._gpus[_int(index)], "nvmlDeviceGetHandleByIndex_v2")
        # A handle is an opaque pointer: index + 1 keeps it non-NULL.
        ctypes.c_void_p.from_buffer(_out(handle)).value = _int(index) + 1

    @_device_function
    def nvmlDeviceGetPciInfo_v3(self, gpu: _FakeGpu, info: Any) -> None:
        self._put_pci(info, gpu.pci)

    @_device_function
    def nvmlDeviceGetUUID(self, gpu: _FakeGpu, buffer: Any, size: Any) -> None:
        self._put_string(buffer, size, gpu.uuid)

    @_device_function
    def nvmlDeviceGetName(self, gpu: _FakeGpu, buffer: Any, size: Any) -> None:
        self._put_string(buffer, size, gpu.name)

    @_device_function
    def nvmlDeviceGetMinorNumber(self, gpu: _FakeGpu, minor: Any) -> None:
        if gpu.minor is None:
            raise _Fail(_NOT_SUPPORTED)
        _out(minor).value = gpu.minor

    @_device_function
    def nvmlDeviceGetNvLinkState(self, gpu: _FakeGpu, link: Any, active: Any) -> None:
        _out(active).value = int(self._link(gpu, link).active)

    @_device_function
    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, gpu: _FakeGpu, link: Any, info: Any) -> None:
        self._put_pci(info, self._link(gpu, link).remote)

    @_device_function
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: _FakeGpu, link: Any, kind: Any) -> None:
        _out(kind).value = self._link(gpu, link).remote_type

    @_device_function
    def nvmlDeviceGetTopologyCommonAncestor(self, gpu: _FakeGpu, second: Any,
                                            level: Any) -> None:
        other = self._gpu(second, "")
        if other is gpu:
            _out(level).value = 0  # NVML_TOPOLOGY_INTERNAL
        elif other.pci in gpu.pcie:
            _out(level).value = gpu.pcie[other.pci]
        else:
            raise _Fail(_NOT_SUPPORTED)

    @_device_function
    def nvmlDeviceGetMemoryAffinity(self, gpu: _FakeGpu, words: Any, node_set: Any,
                                    scope: Any) -> None:
        if gpu.numa_node is None:
            return
        if gpu.numa_node // 64 >= _int(words):
            raise _Fail(_INSUFFICIENT_SIZE)
        _out(node_set)[gpu.numa_node // 64] |= 1 << (gpu.numa_node % 64)


# --- plugging it in ----------------------------------------------------------------------------

_install_lock = threading.RLock()  # pynvml is process-wide: one fake at a time (nesting is fine)


def _no_library(name: str, *args: Any, **kwargs: Any) -> Any:
    raise OSError(f"{name}: not loaded while a fake NVML is installed")


@contextmanager
def installed(library: FakeNvmlLibrary | None) -> Iterator[FakeNvmlLibrary | None]:
    """Plug ``library`` into pynvml for the ``with`` block; ``None`` is "no NVML library".

    Everything pynvml held before is put back afterwards, also when the block raises.
    """
    import pynvml

    with _install_lock:
        saved = (pynvml.nvmlLib, pynvml.CDLL, pynvml._nvmlLib_refcount,
                 dict(pynvml._nvmlGetFunctionPointer_cache))
        try:
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlLib_refcount = 0
            pynvml.CDLL = _no_library
            pynvml.nvmlLib = library
            yield library
        finally:
            pynvml.nvmlLib, pynvml.CDLL, pynvml._nvmlLib_refcount, cache = saved
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlGetFunctionPointer_cache.update(cache)


def read_gpus_from_file(path: Path, pci_devices: tuple[PciDevice, ...],
                        warnings: list[str]) -> tuple[Gpu, ...]:
    """``nvml.read_gpus`` against the fake described in ``path``; a bad file is a warning."""
    try:
        library = FakeNvmlLibrary(json.loads(Path(path).read_text()))
    except OSError as e:
        warnings.append(f"{path}: cannot read the fake NVML description ({e.strerror}); "
                        "GPUs are not read")
        return ()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        warnings.append(f"{path}: the fake NVML description is not JSON ({e}); GPUs are not read")
        return ()
    except FakeNvmlFormatError as e:
        warnings.append(f"{path}: bad fake NVML description: {e}; GPUs are not read")
        return ()
    except ImportError:
        warnings.append("nvidia-ml-py (module pynvml) is not installed; GPUs are not read")
        return ()
    with installed(library):
        return nvml.read_gpus(pci_devices, warnings)

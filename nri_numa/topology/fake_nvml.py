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
from pathlib import Path
from typing import Any

from nri_numa.topology import nvml
from nri_numa.topology.nvml import PciId
from nri_numa.topology.parts import Gpu, PciDevice

from nri_numa.topology.fake_nvml_description import (  # noqa: F401  (part of this module's API)
    DRIVER_VERSION, NVSWITCH_PLACEHOLDER, DescriptionReader, FakeGpu, FakeNvmlFormatError, Link,
    description_from_topology)

# nvmlReturn_t values from nvml.h: C ABI, never renumbered.
_SUCCESS, _UNINITIALIZED, _INVALID_ARGUMENT, _NOT_SUPPORTED, _INSUFFICIENT_SIZE = 0, 1, 2, 3, 7

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
         self._gpus) = DescriptionReader(pynvml, _FUNCTIONS).read(description)
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

    def _gpu(self, handle: Any, symbol: str) -> FakeGpu:
        self._require_init()
        index = (ctypes.cast(handle, ctypes.c_void_p).value or 0) - 1
        if not 0 <= index < len(self._gpus):
            raise _Fail(_INVALID_ARGUMENT)
        return self._checked(self._gpus[index], symbol)

    @staticmethod
    def _checked(gpu: FakeGpu, symbol: str) -> FakeGpu:
        if symbol in gpu.errors:
            raise _Fail(gpu.errors[symbol])
        return gpu

    @staticmethod
    def _link(gpu: FakeGpu, link: Any) -> Link:
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
    def nvmlDeviceGetPciInfo_v3(self, gpu: FakeGpu, info: Any) -> None:
        self._put_pci(info, gpu.pci)

    @_device_function
    def nvmlDeviceGetUUID(self, gpu: FakeGpu, buffer: Any, size: Any) -> None:
        self._put_string(buffer, size, gpu.uuid)

    @_device_function
    def nvmlDeviceGetName(self, gpu: FakeGpu, buffer: Any, size: Any) -> None:
        self._put_string(buffer, size, gpu.name)

    @_device_function
    def nvmlDeviceGetMinorNumber(self, gpu: FakeGpu, minor: Any) -> None:
        if gpu.minor is None:
            raise _Fail(_NOT_SUPPORTED)
        _out(minor).value = gpu.minor

    @_device_function
    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: Any, active: Any) -> None:
        _out(active).value = int(self._link(gpu, link).active)

    @_device_function
    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, gpu: FakeGpu, link: Any, info: Any) -> None:
        self._put_pci(info, self._link(gpu, link).remote)

    @_device_function
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, gpu: FakeGpu, link: Any, kind: Any) -> None:
        _out(kind).value = self._link(gpu, link).remote_type

    @_device_function
    def nvmlDeviceGetTopologyCommonAncestor(self, gpu: FakeGpu, second: Any,
                                            level: Any) -> None:
        other = self._gpu(second, "")
        if other is gpu:
            _out(level).value = 0  # NVML_TOPOLOGY_INTERNAL
        elif other.pci in gpu.pcie:
            _out(level).value = gpu.pcie[other.pci]
        else:
            raise _Fail(_NOT_SUPPORTED)

    @_device_function
    def nvmlDeviceGetMemoryAffinity(self, gpu: FakeGpu, words: Any, node_set: Any,
                                    scope: Any) -> None:
        if gpu.numa_node is None:
            return
        if gpu.numa_node // 64 >= _int(words):
            raise _Fail(_INSUFFICIENT_SIZE)
        _out(node_set)[gpu.numa_node // 64] |= 1 << (gpu.numa_node % 64)


# --- plugging it in ----------------------------------------------------------------------------

_install_lock = threading.RLock()  # pynvml is process-wide: one fake at a time (nesting is fine)


_FUNCTIONS = frozenset(n for n in vars(FakeNvmlLibrary) if n.startswith("nvml"))


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

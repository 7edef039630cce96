"""GPUs from NVML, through nvidia-ml-py (module ``pynvml``).

NVML is optional: without the package, the library or the driver there are simply no GPUs and
one warning that says why. ``pynvml`` is imported inside ``read_gpus`` so that importing this
module costs nothing and never loads the binding.

NVML is trusted for what only it knows (UUID, minor, NVLink, PCIe distance between GPUs) and
not for locality: the GPU's NUMA node comes from the sysfs PCI device with the same address,
because ``nvmlDeviceGetNumaNodeId`` only answers where GPU memory is itself a NUMA node.

Every per-GPU call that fails becomes a warning naming the GPU and the call; what was read is
kept, and one broken GPU never hides the others. Functions missing from an older driver
(``NVMLError_FunctionNotFound``) or an older binding (AttributeError) mean "unknown".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from nri_numa.topology.parts import PCIE_LEVELS, Gpu, PciDevice

NVSWITCH_CLASS = 0x068000  # PCI class of an NVSwitch ("bridge, other")

PciId = tuple[int, int, int, int]  # domain, bus, device, function

# NVML writes "%08X:%02X:%02X.0", sysfs "%04x:%02x:%02x.%d"; both parse here.
_PCI_ADDRESS = re.compile(
    r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])")


def parse_pci_address(text: str) -> PciId:
    """``"00000000:1B:00.0"`` or ``"0000:1b:00.0"`` → ``(0, 0x1b, 0, 0)``."""
    match = _PCI_ADDRESS.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a PCI address such as 0000:1b:00.0")
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    if device > 0x1F:
        raise ValueError(f"{text!r} has device {device:#x}; PCI devices go up to 0x1f")
    return domain, bus, device, function


def format_pci_address(pci: PciId) -> str:
    """The sysfs form: lowercase, a 4-digit domain unless it needs more."""
    domain, bus, device, function = pci
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def read_gpus(pci_devices: tuple[PciDevice, ...], warnings: list[str]) -> tuple[Gpu, ...]:
    """The GPUs NVML sees, in NVML index order; problems are appended to ``warnings``."""
    try:
        import pynvml
    except ImportError:
        warnings.append("nvidia-ml-py (module pynvml) is not installed; GPUs are not read")
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        warnings.append(_init_failure(pynvml, error))
        return ()
    try:
        return _GpuReader(pynvml, pci_devices, warnings).read()
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as error:
            warnings.append(f"NVML nvmlShutdown failed: {error}")


def _init_failure(nvml: ModuleType, error: Exception) -> str:
    if isinstance(error, nvml.NVMLError_LibraryNotFound):
        why = "the NVML library (libnvidia-ml.so.1) is not installed"
    elif isinstance(error, nvml.NVMLError_DriverNotLoaded):
        why = "the NVIDIA kernel driver is not loaded"
    elif isinstance(error, nvml.NVMLError_NoPermission):
        why = "no permission to use NVML (check access to /dev/nvidiactl)"
    elif isinstance(error, nvml.NVMLError_LibRmVersionMismatch):
        why = ("the NVML library and the NVIDIA kernel module are different versions "
               "(a driver upgrade without a reboot, or a container with another driver's library)")
    else:
        why = f"NVML failed to start ({error})"
    return f"{why}; GPUs are not read"


@dataclass(frozen=True, slots=True)
class _Probe:
    """What NVML told about one GPU, before GPUs are related to each other."""

    index: int
    handle: Any
    pci: PciId
    address: str
    label: str  # how warnings name it
    numa_node: int | None
    uuid: str
    name: str
    minor: int | None
    links: tuple[tuple[PciId, str], ...]  # active NVLinks: remote end, and what it is


class _GpuReader:
    """One NVML session's worth of reading; ``nvml`` is the initialised pynvml module."""

    def __init__(self, nvml: ModuleType, pci_devices: tuple[PciDevice, ...],
                 warnings: list[str]) -> None:
        self.nvml = nvml
        self.warnings = warnings
        self.pci_by_id = _index_pci_devices(pci_devices)
        self.reported_missing: set[str] = set()
        # "This GPU cannot say": no news worth a warning, for the calls where it is normal.
        self.cannot_say = (nvml.NVMLError_NotSupported,)

    def read(self) -> tuple[Gpu, ...]:
        count = self._call("", "nvmlDeviceGetCount")
        if count is None:
            self.warnings.append("NVML cannot count the GPUs; GPUs are not read")
            return ()
        probes = [p for i in range(count) if (p := self._probe(i)) is not None]
        by_id = {p.pci: p for p in probes}
        switch_links = {p.index: sum(1 for remote, kind in p.links
                                     if self._end(kind, remote, by_id) == "switch")
                        for p in probes}
        return tuple(self._gpu(p, probes, by_id, switch_links) for p in probes)

    # --- one GPU ------------------------------------------------------------------------------

    def _probe(self, index: int) -> _Probe | None:
        label = f"GPU {index}"
        handle = self._call(label, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            self.warnings.append(f"{label}: skipped, NVML gives no handle for it")
            return None
        info = self._call(label, "nvmlDeviceGetPciInfo", handle)
        if info is None:
            self.warnings.append(f"{label}: skipped, its PCI address is unknown")
            return None
        try:
            pci = parse_pci_address(info.busId)
        except ValueError as error:
            self.warnings.append(f"{label}: skipped, NVML gave a bad PCI bus id: {error}")
            return None
        device = self.pci_by_id.get(pci)
        address = device.address if device is not None else format_pci_address(pci)
        label = f"GPU {index} ({address})"
        if device is None:
            self.warnings.append(
                f"{label}: no such PCI device in sysfs; its NUMA node is unknown")
        return _Probe(
            index, handle, pci, address, label,
            numa_node=device.numa_node if device is not None else None,
            uuid=self._call(label, "nvmlDeviceGetUUID", handle) or "",
            name=self._call(label, "nvmlDeviceGetName", handle) or "",
            minor=self._call(label, "nvmlDeviceGetMinorNumber", handle, quiet=self.cannot_say),
            links=self._active_links(label, handle),
        )

    def _active_links(self, label: str, handle: Any) -> tuple[tuple[PciId, str], ...]:
        links = []
        # The link count differs between GPUs and NVML versions: ask until NVML says "no more".
        stop = (self.nvml.NVMLError_NotSupported, self.nvml.NVMLError_InvalidArgument)
        for link in range(self.nvml.NVML_NVLINK_MAX_LINKS):
            state = self._call(label, "nvmlDeviceGetNvLinkState", handle, link,
                               quiet=stop)
            if state is None:
                break
            if state != self.nvml.NVML_FEATURE_ENABLED:
                continue
            remote = self._call(label, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            if remote is None:
                continue
            try:
                remote_pci = parse_pci_address(remote.busId)
            except ValueError as error:
                self.warnings.append(f"{label}: NVLink {link} ignored, bad remote: {error}")
                continue
            links.append((remote_pci, self._remote_type(label, handle, link)))
        return tuple(links)

    def _remote_type(self, label: str, handle: Any, link: int) -> str:
        kind = self._call(label, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link,
                          quiet=self.cannot_say)
        if kind == self.nvml.NVML_NVLINK_DEVICE_TYPE_GPU:
            return "gpu"
        if kind == self.nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            return "switch"
        if kind == self.nvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU:
            return "other"  # a POWER9 CPU: no path to another GPU
        return "unknown"  # unanswered or NVML_NVLINK_DEVICE_TYPE_UNKNOWN: sysfs decides later

    def _end(self, kind: str, remote: PciId, gpus: dict[PciId, _Probe]) -> str:
        """gpu, switch or other, for a link whose remote type NVML may not have told."""
        if kind != "unknown":
            return kind
        device = self.pci_by_id.get(remote)
        if device is not None and device.class_code == NVSWITCH_CLASS:
            return "switch"
        return "gpu" if remote in gpus else "other"

    # --- GPUs related -------------------------------------------------------------------------

    def _gpu(self, probe: _Probe, probes: list[_Probe], by_id: dict[PciId, _Probe],
             switch_links: dict[int, int]) -> Gpu:
        peers: Counter[str] = Counter()
        for remote, kind in probe.links:
            if self._end(kind, remote, by_id) == "gpu" and remote != probe.pci:
                peers[self._address(remote, by_id)] += 1
        mine = switch_links[probe.index]
        for other in probes:
            theirs = switch_links[other.index]
            if other is not probe and mine > 0 and theirs > 0:
                # An NVSwitch fabric joins every pair of its GPUs with the smaller link count.
                peers[other.address] += min(mine, theirs)
        pcie = {other.address: level for other in probes
                if other is not probe and (level := self._pcie(probe, other)) is not None}
        return Gpu(index=probe.index, uuid=probe.uuid, pci_address=probe.address,
                   numa_node=probe.numa_node, minor=probe.minor, name=probe.name,
                   nvswitch_links=mine, nvlink_peers=dict(peers), pcie=pcie)

    def _pcie(self, probe: _Probe, other: _Probe) -> str | None:
        value = self._call(probe.label, "nvmlDeviceGetTopologyCommonAncestor",
                           probe.handle, other.handle, quiet=self.cannot_say)
        if value is None:
            return None
        level, rest = divmod(value, 10)
        if rest or not 0 <= level < len(PCIE_LEVELS):
            self.warnings.append(f"{probe.label}: NVML gave PCIe level {value} towards "
                                 f"{other.address}, not one it documents; ignored")
            return None
        return PCIE_LEVELS[level]

    def _address(self, pci: PciId, gpus: dict[PciId, _Probe]) -> str:
        if pci in gpus:
            return gpus[pci].address
        device = self.pci_by_id.get(pci)
        return device.address if device is not None else format_pci_address(pci)

    # --- calling NVML -------------------------------------------------------------------------

    def _call(self, label: str, function: str, *args: Any,
              quiet: tuple[type[Exception], ...] = ()) -> Any:
        """pynvml.<function>(*args), or None (with a warning unless the error is quiet)."""
        wrapper = getattr(self.nvml, function, None)
        if wrapper is None:
            self._report_missing(function, "this nvidia-ml-py")
            return None
        try:
            return wrapper(*args)
        except self.nvml.NVMLError_FunctionNotFound:
            self._report_missing(function, "this NVIDIA driver's NVML")
        except quiet:
            pass
        except self.nvml.NVMLError as error:
            where = f"{label}: " if label else ""
            self.warnings.append(f"{where}NVML {function} failed: {error}")
        return None

    def _report_missing(self, function: str, where: str) -> None:
        if function not in self.reported_missing:
            self.reported_missing.add(function)
            self.warnings.append(f"{where} has no {function}; what it tells is unknown")


def _index_pci_devices(pci_devices: tuple[PciDevice, ...]) -> dict[PciId, PciDevice]:
    """PCI devices keyed by parsed address, so that NVML's and sysfs's spellings meet."""
    index = {}
    for device in pci_devices:
        try:
            index[parse_pci_address(device.address)] = device
        except ValueError:
            continue  # the sysfs reader already reported it; it cannot be a GPU's match anyway
    return index

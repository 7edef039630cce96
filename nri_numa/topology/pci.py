"""PCI functions from ``sys/bus/pci/devices`` under a root.

Each entry links to the function's directory under ``sys/devices/pci…``; the path of that
directory is the PCIe hierarchy (host bridge, root port, switch ports, device), so the bridges
come from the path itself and cost no reads. Each device costs one listing and a handful of
small reads.
"""

from __future__ import annotations

import os
import re

from nri_numa.topology.parts import PciDevice
from nri_numa.topology.sysfs_read import (PCI_ADDRESS, PathArg, link_basename, read_hex,
                                          read_int, read_list_or_mask, resolve_in_root)

_PCI_DEVICES = "sys/bus/pci/devices"
_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")
_VIRTFN = re.compile(r"virtfn(\d+)")


def read_pci_devices(root: PathArg, warnings: list[str], *,
                     only_node: int | None = None) -> tuple[PciDevice, ...]:
    """Every PCI function under ``root``, by address; problems go to ``warnings``.

    ``only_node``: the machine's NUMA node when it has exactly one. There, like hwloc, a device
    whose firmware says -1 everywhere up its path (typical of VMs) is local to that node: there
    is no other node it could be nearer to.
    """
    root = os.path.abspath(root)
    devices_dir = os.path.join(root, _PCI_DEVICES)
    try:
        names = sorted(os.listdir(devices_dir))
    except FileNotFoundError:
        return ()  # no PCI bus at all: SoCs, and trees gathered without it
    except OSError as e:
        warnings.append(f"cannot list {devices_dir}: {e.strerror or e}")
        return ()
    numa_memo: dict[str, int | None] = {}
    devices = []
    for name in names:
        address = name.lower()
        if not PCI_ADDRESS.fullmatch(address):
            warnings.append(f"{devices_dir}/{name} is not named like a PCI address; ignored")
            continue
        real = resolve_in_root(root, f"{devices_dir}/{name}", warnings)
        if real is None:
            continue
        device = _read_device(root, address, real, numa_memo, warnings, only_node)
        if device is not None:
            devices.append(device)
    return tuple(devices)


def _read_device(root: str, address: str, real: str, numa_memo: dict[str, int | None],
                 warnings: list[str], only_node: int | None) -> PciDevice | None:
    try:
        names = set(os.listdir(real))
    except OSError as e:
        warnings.append(f"PCI {address}: cannot list {real}: {e.strerror or e}; ignored")
        return None
    host_bridge, bridge_dirs = _hierarchy(root, real)
    return PciDevice(
        address=address,
        numa_node=_numa_node(real, bridge_dirs, numa_memo, warnings, only_node),
        class_code=_hex_or_zero(f"{real}/class", warnings),
        vendor=_hex_or_zero(f"{real}/vendor", warnings),
        device=_hex_or_zero(f"{real}/device", warnings),
        local_cpus=read_list_or_mask(real, "local_cpulist", "local_cpus", warnings) or frozenset(),
        bridges=tuple(os.path.basename(d) for d in bridge_dirs),
        host_bridge=host_bridge,
        physfn=_linked_address(f"{real}/physfn") if "physfn" in names else None,
        virtfns=_virtfns(real, names),
        driver=link_basename(f"{real}/driver") if "driver" in names else None,
    )


def _hierarchy(root: str, real: str) -> tuple[str | None, list[str]]:
    """(host bridge name, directories of the PCI functions between it and the device).

    The first ``pciDDDD:BB`` component is the host bridge the CPUs see. Behind an Intel VMD the
    path holds a second, nested ``pci1DDDD:BB`` domain; its VMD function stays in the bridges,
    since traffic to the device crosses it.
    """
    parts = os.path.relpath(real, root).split("/")
    start = next((i for i, p in enumerate(parts) if _HOST_BRIDGE.fullmatch(p)), None)
    host_bridge = parts[start] if start is not None else None
    first = start + 1 if start is not None else 0
    bridge_dirs = [os.path.join(root, *parts[: i + 1]) for i in range(first, len(parts) - 1)
                   if PCI_ADDRESS.fullmatch(parts[i])]
    return host_bridge, bridge_dirs


def _numa_node(real: str, bridge_dirs: list[str], memo: dict[str, int | None],
               warnings: list[str], only_node: int | None) -> int | None:
    """The device's node; where firmware gives -1, the nearest bridge's; else the machine's only
    node; else unknown (None).

    Never 0 by default on a machine with several nodes: a wrong node is worse than an unknown
    one for alignment decisions.
    """
    own = read_int(f"{real}/numa_node", warnings)
    if own is not None and own >= 0:
        return own
    for bridge in reversed(bridge_dirs):
        if bridge not in memo:
            # Problems with a bridge's own file are reported when the bridge itself is read.
            value = read_int(f"{bridge}/numa_node", [], required=False)
            memo[bridge] = value if value is not None and value >= 0 else None
        if memo[bridge] is not None:
            return memo[bridge]
    return only_node


def _hex_or_zero(path: str, warnings: list[str]) -> int:
    problems: list[str] = []
    value = read_hex(path, problems)
    warnings.extend(f"{p}; recorded as 0" for p in problems)
    return 0 if value is None else value


def _virtfns(real: str, names: set[str]) -> tuple[str, ...]:
    numbered = sorted((int(m[1]), n) for n in names if (m := _VIRTFN.fullmatch(n)))
    addresses = (_linked_address(f"{real}/{name}") for _, name in numbered)
    return tuple(a for a in addresses if a is not None)


def _linked_address(path: str) -> str | None:
    name = link_basename(path)
    return name.lower() if name is not None and PCI_ADDRESS.fullmatch(name.lower()) else None

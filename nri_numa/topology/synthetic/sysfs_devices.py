"""A Topology's PCI, network and RDMA devices and GPUs, written into a synthetic sysfs tree (and
fake NVML) as the kernel and the NVIDIA driver show them."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable

from nri_numa.topology.cpulist import format_list
from nri_numa.topology.discover import FAKE_NVML_FILE
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import PciDevice
from nri_numa.topology.synthetic.sysfs_tree import SysfsTree, kernel_mask

_INFINIBAND_CLASS = 0x0207
_PCI_BRIDGE_CLASS = 0x0604
_ARPHRD = {"ether": 1, "infiniband": 32}


# --- PCI, network and RDMA devices ----------------------------------------------------------------


def _device_path(d: PciDevice) -> str:
    if d.host_bridge is None:
        # Only flattened dumps (hwloc-gather-topology copies) lack the host bridge; the folder
        # then sits in sys/bus/pci/devices itself, as in those dumps.
        return f"sys/bus/pci/devices/{d.address}"
    return "/".join(("sys/devices", d.host_bridge, *d.bridges, d.address))


def _bus(address: str) -> int:
    return int(address.split(":")[1], 16)


def _bridge_buses(devices: Iterable[PciDevice]) -> dict[str, tuple[int, int]]:
    """Bridge address → (secondary, subordinate) bus: the bus right below it and the last
    bus anywhere below it."""
    secondary: dict[str, int] = {}
    subordinate: dict[str, int] = defaultdict(int)
    for d in devices:
        if d.bridges:
            secondary.setdefault(d.bridges[-1], _bus(d.address))
        for bridge in d.bridges:
            subordinate[bridge] = max(subordinate[bridge], _bus(d.address))
    return {b: (secondary[b], subordinate[b]) for b in secondary}


def _config_space(d: PciDevice, buses: tuple[int, int] | None) -> bytes:
    """The first 64 bytes of config space, which is what an unprivileged read gets. hwloc
    learns the PCI tree from the bus numbers of bridge headers (type 1), not from sysfs paths."""
    config = bytearray(64)
    config[0:4] = d.vendor.to_bytes(2, "little") + d.device.to_bytes(2, "little")
    config[9:12] = d.class_code.to_bytes(3, "little")  # prog-if, subclass, base class
    if d.class_code >> 8 == _PCI_BRIDGE_CLASS:
        config[0x0E] = 1
        config[0x18:0x1B] = bytes((_bus(d.address), *(buses or (0, 0))))
    return bytes(config)


def write_pci(out: SysfsTree, topology: Topology, width: int) -> None:
    paths = {d.address: _device_path(d) for d in topology.pci_devices}
    buses = _bridge_buses(topology.pci_devices)
    for d in topology.pci_devices:
        path = paths[d.address]
        out.raw(f"{path}/config", _config_space(d, buses.get(d.address)))
        out.file(f"{path}/class", f"0x{d.class_code:06x}")
        out.file(f"{path}/vendor", f"0x{d.vendor:04x}")
        out.file(f"{path}/device", f"0x{d.device:04x}")
        out.file(f"{path}/numa_node", -1 if d.numa_node is None else d.numa_node)
        out.file(f"{path}/local_cpulist", format_list(d.local_cpus))
        out.file(f"{path}/local_cpus", kernel_mask(d.local_cpus, width))
        if d.driver is not None:
            out.folder(f"sys/bus/pci/drivers/{d.driver}")
            out.link(f"{path}/driver", f"sys/bus/pci/drivers/{d.driver}")
        if d.virtfns:
            out.file(f"{path}/sriov_totalvfs", len(d.virtfns))
            out.file(f"{path}/sriov_numvfs", len(d.virtfns))
        for i, vf in enumerate(d.virtfns):
            out.link(f"{path}/virtfn{i}", paths.get(vf, f"sys/bus/pci/devices/{vf}"))
        if d.physfn is not None:
            out.link(f"{path}/physfn", paths.get(d.physfn, f"sys/bus/pci/devices/{d.physfn}"))
        if d.host_bridge is not None:
            out.link(f"sys/bus/pci/devices/{d.address}", path)


def write_netdevs(out: SysfsTree, topology: Topology) -> None:
    paths = {d.address: _device_path(d) for d in topology.pci_devices}
    classes = {d.address: d.class_code for d in topology.pci_devices}
    for ifindex, nic in enumerate(topology.nics, start=2):  # 1 is lo
        if nic.pci_address is None:
            folder = f"sys/devices/virtual/net/{nic.name}"
        else:
            folder = f"{paths[nic.pci_address]}/net/{nic.name}"
            out.link(f"{folder}/device", paths[nic.pci_address])
        infiniband = nic.pci_address is not None and classes[nic.pci_address] >> 8 == _INFINIBAND_CLASS
        out.file(f"{folder}/ifindex", ifindex)
        out.file(f"{folder}/type", _ARPHRD["infiniband" if infiniband else "ether"])
        out.file(f"{folder}/address", _link_address(ifindex, infiniband))
        out.link(f"sys/class/net/{nic.name}", folder)
    rdma = {(nic.pci_address, name) for nic in topology.nics if nic.pci_address for name in nic.rdma}
    for address, name in sorted(rdma):
        folder = f"{paths[address]}/infiniband/{name}"
        out.file(f"{folder}/node_type", "1: CA")
        out.link(f"{folder}/device", paths[address])
        out.link(f"sys/class/infiniband/{name}", folder)


def _link_address(ifindex: int, infiniband: bool) -> str:
    """A locally administered MAC, or a 20-byte IPoIB address (QPN, then the port GID)."""
    tail = [(ifindex >> 8) & 0xFF, ifindex & 0xFF]
    octets = ([0x00, 0x00, 0x10, 0x49, 0xFE, 0x80] + [0] * 6 + [0x02, 0x00, 0x00, 0xFF, 0xFE, 0x00] + tail
              if infiniband else [0x02, 0x00, 0x00, 0x00] + tail)
    return ":".join(f"{o:02x}" for o in octets)


# --- GPUs -----------------------------------------------------------------------------------------


def write_gpus(out: SysfsTree, topology: Topology) -> None:
    # Imported here: fake_nvml is needed only for trees with GPUs.
    from nri_numa.topology.fake_nvml_description import description_from_topology

    (out.root / FAKE_NVML_FILE).write_text(json.dumps(description_from_topology(topology)))
    for gpu in topology.gpus:
        # What the NVIDIA driver shows per GPU: the only minor ↔ PCI map without NVML.
        out.file(f"proc/driver/nvidia/gpus/{gpu.pci_address}/information", "\n".join((
            f"Model: \t\t {gpu.name or 'NVIDIA GPU'}",
            "IRQ:   \t\t 0",
            f"GPU UUID: \t {gpu.uuid}",
            "Video BIOS: \t ??.??.??.??.??",
            "Bus Type: \t PCIe",
            "DMA Size: \t 52 bits",
            "DMA Mask: \t 0xfffffffffffff",
            f"Bus Location: \t {gpu.pci_address}",
            f"Device Minor: \t {'?' if gpu.minor is None else gpu.minor}",
            "GPU Excluded:\t No",
        )))

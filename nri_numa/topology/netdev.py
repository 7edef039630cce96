"""Network interfaces backed by PCI functions, from ``sys/class/net`` and, live, netlink.

A netdev's sysfs directory sits below the device that owns it; the owning PCI function is the
last PCI address on that path. The ``device`` link alone is not enough: for virtio-net it names
``virtioN``, a child of the PCI function. Virtual netdevs (lo, veth, bridges) live under
``devices/virtual`` and are left out.

``/sys/class/net`` lists the netdevs of the network namespace that mounted sysfs, which need not
be ours; on the live host netlink adds the links of our own namespace whose parent is a PCI
function (recent kernels name it in IFLA_PARENT_DEV_NAME). Netlink is asked only when sysfs is
not our namespace's: importing pyroute2 loads ~370 modules (its cost: bench/README.md), and where
sysfs lists exactly our namespace's links (name, index and hardware address, checked with the
standard library) netlink has nothing to add.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

from nri_numa.topology.parts import Nic, PciDevice
from nri_numa.topology.sysfs_read import PCI_ADDRESS, PathArg, pci_address_of, resolve_in_root

_CLASS_NET = "sys/class/net"
_VIRTUAL = "devices/virtual/"
_SIOCGIFHWADDR = 0x8927  # linux/sockios.h
_ETHER_ADDRESS_TEXT = 17  # "aa:bb:cc:dd:ee:ff"


def read_nics(root: PathArg, pci_devices: tuple[PciDevice, ...], warnings: list[str], *,
              netlink: bool) -> tuple[Nic, ...]:
    """NICs on PCI functions, by name. ``netlink`` only for the live host (root ``/``)."""
    root = os.path.abspath(root)
    by_address = {d.address: d for d in pci_devices}
    nics: dict[str, Nic] = {}
    net_dir = os.path.join(root, _CLASS_NET)
    for name in _names(net_dir, warnings):
        function_dir = _pci_function_dir(root, f"{net_dir}/{name}", warnings)
        if function_dir is not None:
            nics[name] = _nic(name, function_dir, by_address, warnings)
    if netlink and not sysfs_is_this_namespace(net_dir):
        for name, address in _netlink_pci_links(warnings).items():
            if name not in nics and address in by_address:
                nics[name] = _nic(name, _device_dir(root, address, warnings), by_address,
                                  warnings)
    return tuple(sorted(nics.values(), key=lambda n: n.name))


def sysfs_is_this_namespace(net_dir: str) -> bool:
    """Whether ``net_dir`` lists exactly this process's network links: the same names, each with
    our index and, for Ethernet-sized addresses, our hardware address (a name and an index alone
    can repeat between namespaces: lo 1 and eth0 2 in a container and on its host)."""
    try:
        ours = socket.if_nameindex()
        listed = set(os.listdir(net_dir))
    except OSError:
        return False
    if listed != {name for _, name in ours}:
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            for index, name in ours:
                with open(f"{net_dir}/{name}/ifindex", encoding="ascii") as f:
                    if int(f.read()) != index:
                        return False
                with open(f"{net_dir}/{name}/address", encoding="ascii") as f:
                    written = f.read().strip().lower()
                if len(written) == _ETHER_ADDRESS_TEXT and written != _hardware_address(probe, name):
                    return False
    except (OSError, ValueError):
        return False
    return True


def _hardware_address(probe: socket.socket, name: str) -> str:
    """The link's hardware address as sysfs writes it, from SIOCGIFHWADDR (struct ifreq)."""
    request = struct.pack("16s16x", name.encode()[:15])
    reply = fcntl.ioctl(probe.fileno(), _SIOCGIFHWADDR, request)
    return ":".join(f"{b:02x}" for b in reply[18:24])  # after the name and sa_family


def _names(net_dir: str, warnings: list[str]) -> list[str]:
    try:
        return sorted(os.listdir(net_dir))
    except FileNotFoundError:
        return []
    except OSError as e:
        warnings.append(f"cannot list {net_dir}: {e.strerror or e}")
        return []


def _pci_function_dir(root: str, entry: str, warnings: list[str]) -> str | None:
    """The directory of the PCI function that owns the netdev at ``entry``, or None."""
    if _VIRTUAL in _link_text(entry):
        return None  # decided by the link's text: gathered trees often leave devices/virtual out
    real = resolve_in_root(root, entry, warnings)
    if real is None or os.path.relpath(real, root).startswith("sys/" + _VIRTUAL):
        return None
    if pci_address_of(os.path.relpath(real, root)) is None and os.path.lexists(f"{entry}/device"):
        # Old kernels made class/net entries real directories, with only a device link.
        real = resolve_in_root(root, f"{entry}/device", warnings)
        if real is None:
            return None
    return _cut_at_last_pci(real, root)


def _link_text(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # not a link: an old kernel's real directory
        return ""


def _cut_at_last_pci(real: str, root: str) -> str | None:
    parts = os.path.relpath(real, root).split("/")
    for i in range(len(parts) - 1, -1, -1):
        if PCI_ADDRESS.fullmatch(parts[i]):
            return os.path.join(root, *parts[: i + 1])
    return None


def _device_dir(root: str, address: str, warnings: list[str]) -> str:
    link = os.path.join(root, "sys/bus/pci/devices", address)
    return resolve_in_root(root, link, warnings) or link


def _nic(name: str, function_dir: str, by_address: dict[str, PciDevice],
         warnings: list[str]) -> Nic:
    address = os.path.basename(function_dir)
    device = by_address.get(address)
    return Nic(
        name=name,
        pci_address=address,
        vfs=device.virtfns if device is not None else (),
        rdma=_rdma_devices(function_dir, warnings),
    )


def _rdma_devices(function_dir: str, warnings: list[str]) -> tuple[str, ...]:
    path = f"{function_dir}/infiniband"
    try:
        return tuple(sorted(os.listdir(path)))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    except OSError as e:
        warnings.append(f"cannot list {path}: {e.strerror or e}")
        return ()


def _netlink_pci_links(warnings: list[str]) -> dict[str, str]:
    """This namespace's links whose parent device is a PCI function: name → address."""
    try:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            links = ipr.get_links()
    # pyroute2 fails in many ways (ImportError, OSError, NetlinkError, protocol errors); any of
    # them leaves sysfs as the only source, which is what the caller gets.
    except Exception as e:  # noqa: BLE001
        warnings.append(f"netlink link listing failed ({type(e).__name__}: {e}); "
                        f"using sysfs alone for network interfaces")
        return {}
    out = {}
    for link in links:
        name = link.get_attr("IFLA_IFNAME")
        parent = link.get_attr("IFLA_PARENT_DEV_NAME")
        if name and parent and link.get_attr("IFLA_PARENT_DEV_BUS_NAME") == "pci" \
                and PCI_ADDRESS.fullmatch(parent.lower()):
            out[name] = parent.lower()
    return out

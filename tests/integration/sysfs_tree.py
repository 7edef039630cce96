"""Small fake sysfs trees for the reader tests: a regular machine, PCI functions, netdevs.

Written the way the kernel lays them out (x86 numbering: SMT siblings are ``cpu`` and
``cpu + cores``), so that tests can damage one file and see what the reader makes of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nri_numa.topology.cpulist import format_list, format_mask

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def link(root: Path, relative: str, target: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@dataclass(frozen=True)
class Machine:
    sockets: int = 2
    cores_per_socket: int = 4
    threads: int = 2
    nodes_per_socket: int = 1
    cores_per_l3: int = 4
    offline: frozenset[int] = frozenset()
    memory_kib: int = 4 * 1024 * 1024

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def cpus(self) -> range:
        return range(self.cores * self.threads)

    @property
    def nodes(self) -> range:
        return range(self.sockets * self.nodes_per_socket)

    def socket_of(self, cpu: int) -> int:
        return cpu % self.cores // self.cores_per_socket

    def core_of(self, cpu: int) -> int:
        return cpu % self.cores  # the lowest sibling: threads are cpu, cpu + cores, ...

    def node_of(self, cpu: int) -> int:
        per_node = self.cores_per_socket // self.nodes_per_socket
        return self.socket_of(cpu) * self.nodes_per_socket + cpu % self.cores_per_socket // per_node

    def l3_of(self, cpu: int) -> int:
        core = self.core_of(cpu)
        return core - core % self.cores_per_l3

    def members(self, key: Callable[[int], int], cpu: int) -> frozenset[int]:
        """The online CPUs that share ``key`` with ``cpu``."""
        return frozenset(c for c in self.cpus if key(c) == key(cpu) and c not in self.offline)


def build_machine(root: Path, m: Machine) -> None:
    online = frozenset(m.cpus) - m.offline
    all_cpus = format_list(m.cpus)
    for name, value in (("possible", all_cpus), ("present", all_cpus),
                        ("online", format_list(online)), ("offline", format_list(m.offline)),
                        ("isolated", "")):
        write(root, f"{CPU}/{name}", value + "\n")
    for cpu in m.cpus:
        _build_cpu(root, m, cpu)
    nodes = format_list(m.nodes)
    write(root, f"{NODE}/online", nodes + "\n")
    write(root, f"{NODE}/possible", nodes + "\n")
    for node in m.nodes:
        _build_node(root, m, node, online)


def _build_cpu(root: Path, m: Machine, cpu: int) -> None:
    base = f"{CPU}/cpu{cpu}"
    link(root, f"{base}/node{m.node_of(cpu)}", f"../../node/node{m.node_of(cpu)}")
    if cpu:  # cpu0 cannot be unplugged on x86 and has no online file
        write(root, f"{base}/online", "0\n" if cpu in m.offline else "1\n")
    if cpu in m.offline:
        return  # the kernel removes topology/ with the CPU
    core = m.members(m.core_of, cpu)
    package = m.members(m.socket_of, cpu)
    # Only the files the reader looks for first; tests that need the older names write them.
    for name, value in (("core_cpus_list", format_list(core)),
                        ("die_cpus_list", format_list(package)),
                        ("package_cpus_list", format_list(package)),
                        ("physical_package_id", str(m.socket_of(cpu))),
                        ("die_id", "0"),
                        ("core_id", str(m.core_of(cpu) % m.cores_per_socket))):
        write(root, f"{base}/topology/{name}", value + "\n")
    caches = ((1, "Data", core), (1, "Instruction", core), (2, "Unified", core),
              (3, "Unified", m.members(m.l3_of, cpu)))
    for index, (level, kind, shared) in enumerate(caches):
        for name, value in (("level", str(level)), ("type", kind),
                            ("shared_cpu_list", format_list(shared))):
            write(root, f"{base}/cache/index{index}/{name}", value + "\n")


def _build_node(root: Path, m: Machine, node: int, online: frozenset[int]) -> None:
    base = f"{NODE}/node{node}"
    cpus = frozenset(c for c in online if m.node_of(c) == node)
    write(root, f"{base}/cpulist", format_list(cpus) + "\n")
    write(root, f"{base}/cpumap", format_mask(cpus) + "\n")
    write(root, f"{base}/meminfo",
          f"Node {node} MemTotal:       {m.memory_kib} kB\nNode {node} MemFree:  1024 kB\n"
          f"Node {node} HugePages_Total:     4\n")
    distances = " ".join("10" if other == node else
                         "12" if other // m.nodes_per_socket == node // m.nodes_per_socket else "21"
                         for other in m.nodes)
    write(root, f"{base}/distance", distances + "\n")
    for size, total, free in ((2048, 4, 3), (1048576, 1, 1)):
        hp = f"{base}/hugepages/hugepages-{size}kB"
        write(root, f"{hp}/nr_hugepages", f"{total}\n")
        write(root, f"{hp}/free_hugepages", f"{free}\n")
        write(root, f"{hp}/surplus_hugepages", "0\n")


@dataclass(frozen=True)
class Function:
    path: str  # below sys/devices, e.g. "pci0000:00/0000:00:01.0/0000:01:00.0"
    class_code: int = 0x020000
    vendor: int = 0x15B3
    device: int = 0x1017
    numa_node: int = 0
    local_cpus: str = "0-3"
    driver: str | None = "mlx5_core"

    @property
    def address(self) -> str:
        return self.path.rsplit("/", 1)[1]


def build_pci(root: Path, functions: list[Function]) -> None:
    for f in functions:
        base = f"sys/devices/{f.path}"
        for name, value in (("class", f"0x{f.class_code:06x}"), ("vendor", f"0x{f.vendor:04x}"),
                            ("device", f"0x{f.device:04x}"), ("numa_node", str(f.numa_node)),
                            ("local_cpulist", f.local_cpus)):
            write(root, f"{base}/{name}", value + "\n")
        if f.driver:
            write(root, f"sys/bus/pci/drivers/{f.driver}/.keep", "")
            up = "../" * (base.count("/") + 1)  # from the function's folder to the root
            link(root, f"{base}/driver", f"{up}sys/bus/pci/drivers/{f.driver}")
        link(root, f"sys/bus/pci/devices/{f.address}", f"../../../devices/{f.path}")


def add_sriov(root: Path, pf: Function, vfs: list[Function]) -> None:
    for n, vf in enumerate(vfs):
        link(root, f"sys/devices/{pf.path}/virtfn{n}", f"../{vf.address}")
        link(root, f"sys/devices/{vf.path}/physfn", f"../{pf.address}")


def add_netdev(root: Path, name: str, device_path: str) -> None:
    """A netdev below ``sys/devices/<device_path>``; ``virtual/net`` makes a virtual one."""
    write(root, f"sys/devices/{device_path}/net/{name}/ifindex", "2\n")
    link(root, f"sys/class/net/{name}", f"../../devices/{device_path}/net/{name}")

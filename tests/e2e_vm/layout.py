"""A multi-NUMA machine described as data (JSON), checked, and turned into QEMU's options.

    {"sockets": 2,
     "nodes": [{"id": 0, "socket": 0, "cores": 2, "threads_per_core": 2, "memory_mib": 1024, "hugepages_2m": 32},
               {"id": 1, "socket": 1, "cores": 0, "memory_mib": 512}],
     "distances": [[10, 21], [21, 10]],
     "pci": [{"kind": "nic", "node": 0}, {"kind": "nvme", "node": 1}]}

`cores` are the node's physical cores, each with `threads_per_core` CPUs (default 1); 0 makes a
CPU-less memory node. `distances` is the full SLIT in `nodes` order. `pci` devices sit behind a
PCIe expander bridge of their node (QEMU's pxb-pcie), so the guest's sysfs gives them that node.
Other keys are allowed and ignored.

What QEMU cannot describe is refused with one line per problem: one `threads_per_core` for all
nodes with CPUs (QEMU's -smp has one thread count) and the same number of cores in every socket.

CPU numbers: QEMU numbers CPUs socket by socket, core by core, thread by thread, and Linux keeps
that order, so a node's CPUs are one contiguous range and the threads of a core are neighbours.
Nodes take the cores of their socket in the order they are listed.

Standard library only: scripts/numa-vm runs this without the virtualenv."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PCI_KINDS = ("nic", "nvme")
LOCAL_DISTANCE = 10
MAX_DISTANCE = 254  # 255 means "unreachable" in the ACPI SLIT
MIN_NODE_MEMORY_MIB = 128
LAYOUTS_DIR = Path(__file__).resolve().parent / "layouts"
DEFAULT_LAYOUT = LAYOUTS_DIR / "snc2.json"


class LayoutError(ValueError):
    """A layout that cannot be used; `problems` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        super().__init__("\n".join(f"{source}: {p}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class Node:
    id: int
    socket: int
    cores: int
    threads_per_core: int
    memory_mib: int
    hugepages_2m: int
    cpus: tuple[int, ...]  # the guest's CPU numbers of this node, in order

    @property
    def siblings(self) -> list[tuple[int, ...]]:
        """The CPUs of each core, core by core."""
        t = self.threads_per_core
        return [self.cpus[i:i + t] for i in range(0, len(self.cpus), t)] if self.cpus else []


@dataclass(frozen=True)
class PciDevice:
    kind: str
    node: int
    index: int  # position in the layout's "pci" list


@dataclass(frozen=True)
class Layout:
    name: str
    sockets: int
    nodes: tuple[Node, ...]
    distances: tuple[tuple[int, ...], ...]  # in `nodes` order
    pci: tuple[PciDevice, ...]

    @property
    def threads_per_core(self) -> int:
        return next((n.threads_per_core for n in self.nodes if n.cores), 1)

    @property
    def cores_per_socket(self) -> int:
        return sum(n.cores for n in self.nodes if n.socket == 0)

    @property
    def cpu_count(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    @property
    def memory_mib(self) -> int:
        return sum(n.memory_mib for n in self.nodes)

    def node(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def distance(self, a: int, b: int) -> int:
        ids = [n.id for n in self.nodes]
        return self.distances[ids.index(a)][ids.index(b)]

    def summary(self) -> str:
        with_cpus = sum(1 for n in self.nodes if n.cores)
        return (f"{self.sockets} sockets, {len(self.nodes)} NUMA nodes ({with_cpus} with CPUs), "
                f"{self.cpu_count} CPUs, {self.memory_mib} MiB, "
                f"{len(self.pci)} PCI device(s)")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(node: dict[str, object], key: str, where: str, problems: list[str], default: int | None,
           minimum: int) -> int:
    value = node.get(key, default)
    if value is None:
        problems.append(f"{where}.{key}: missing")
        return minimum
    if not _int(value) or value < minimum:  # type: ignore[operator]
        problems.append(f"{where}.{key}: must be an integer >= {minimum} (got {json.dumps(value)})")
        return minimum
    return value  # type: ignore[return-value]


def parse_layout(data: object, name: str = "layout") -> Layout:
    """The checked layout; LayoutError with every problem found otherwise."""
    problems: list[str] = []
    if not isinstance(data, dict):
        raise LayoutError(name, ["must be a JSON object with sockets, nodes and distances"])
    sockets = data.get("sockets")
    if not _int(sockets) or sockets < 1:  # type: ignore[operator]
        problems.append(f"sockets: must be an integer >= 1 (got {json.dumps(sockets)})")
        sockets = 0
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise LayoutError(name, [*problems, "nodes: must be a non-empty list of objects"])

    fields = []
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            problems.append(f"{where}: must be an object")
            continue
        node_id = _field(raw, "id", where, problems, None, 0)
        socket = _field(raw, "socket", where, problems, None, 0)
        if sockets and socket >= sockets:
            problems.append(f"{where}.socket: {socket} is not below sockets ({sockets})")
        cores = _field(raw, "cores", where, problems, None, 0)
        threads = _field(raw, "threads_per_core", where, problems, 1, 1)
        memory = _field(raw, "memory_mib", where, problems, None, MIN_NODE_MEMORY_MIB)
        hugepages = _field(raw, "hugepages_2m", where, problems, 0, 0)
        if hugepages * 2 > memory // 2:
            problems.append(f"{where}.hugepages_2m: {hugepages} pages ({hugepages * 2} MiB) is more than half "
                            f"of the node's {memory} MiB")
        fields.append((node_id, socket, cores, threads, memory, hugepages))

    ids = [f[0] for f in fields]
    if len(fields) == len(raw_nodes) and sorted(ids) != list(range(len(ids))):
        problems.append(f"nodes: ids must be 0..{len(ids) - 1}, each once (got {ids})")
    with_cpus = [f for f in fields if f[2] > 0]
    if fields and not with_cpus:
        problems.append("nodes: at least one node needs cores")
    if len({f[3] for f in with_cpus}) > 1:
        problems.append("nodes: every node with cores needs the same threads_per_core "
                        f"(QEMU has one thread count; got {sorted({f[3] for f in with_cpus})})")
    cores_by_socket = {s: sum(f[2] for f in fields if f[1] == s) for s in range(sockets)}
    if sockets and len(set(cores_by_socket.values())) > 1:
        listed = ", ".join(f"socket {s}: {c}" for s, c in cores_by_socket.items())
        problems.append(f"nodes: every socket needs the same number of cores (QEMU's -smp; got {listed})")

    n = len(raw_nodes)
    distances = data.get("distances")
    if not isinstance(distances, list) or len(distances) != n or not all(
            isinstance(row, list) and len(row) == n and all(_int(d) for d in row) for row in distances):
        problems.append(f"distances: must be a {n}x{n} matrix of integers in nodes order")
        distances = [[LOCAL_DISTANCE if i == j else 20 for j in range(n)] for i in range(n)]
    for i, row in enumerate(distances):
        for j, d in enumerate(row):
            if i == j and d != LOCAL_DISTANCE:
                problems.append(f"distances[{i}][{i}]: a node's distance to itself must be {LOCAL_DISTANCE} (got {d})")
            elif i != j and not LOCAL_DISTANCE < d <= MAX_DISTANCE:
                problems.append(f"distances[{i}][{j}]: must be {LOCAL_DISTANCE + 1}..{MAX_DISTANCE} (got {d})")

    raw_pci = data.get("pci", [])
    pci = []
    if not isinstance(raw_pci, list):
        problems.append("pci: must be a list of {\"kind\": ..., \"node\": ...}")
        raw_pci = []
    for i, raw in enumerate(raw_pci):
        if not isinstance(raw, dict):
            problems.append(f"pci[{i}]: must be an object")
            continue
        kind, node = raw.get("kind"), raw.get("node")
        if kind not in PCI_KINDS:
            problems.append(f"pci[{i}].kind: must be one of {', '.join(PCI_KINDS)} (got {json.dumps(kind)})")
        if not _int(node) or node not in ids:
            problems.append(f"pci[{i}].node: must be one of the node ids {ids} (got {json.dumps(node)})")
        pci.append(PciDevice(str(kind), node if _int(node) else -1, i))  # type: ignore[arg-type]

    if problems:
        raise LayoutError(name, problems)
    return Layout(name, sockets, _number_cpus(fields, sockets), tuple(tuple(r) for r in distances), tuple(pci))


def _number_cpus(fields: list[tuple[int, int, int, int, int, int]], sockets: int) -> tuple[Node, ...]:
    threads = next((f[3] for f in fields if f[2]), 1)
    per_socket = sum(f[2] for f in fields if f[1] == 0)
    next_core = dict.fromkeys(range(sockets), 0)
    nodes = []
    for node_id, socket, cores, _, memory, hugepages in fields:
        first = (socket * per_socket + next_core[socket]) * threads
        next_core[socket] += cores
        cpus = tuple(range(first, first + cores * threads))
        nodes.append(Node(node_id, socket, cores, threads if cores else 0, memory, hugepages, cpus))
    return tuple(nodes)


def resolve_path(given: str) -> Path:
    """A layout file, or the name of one in tests/e2e_vm/layouts ("snc2")."""
    path = Path(given)
    if path.is_file():
        return path
    shipped = LAYOUTS_DIR / f"{given}.json"
    return shipped if shipped.is_file() else path


def load_layout(given: str | Path) -> Layout:
    path = resolve_path(str(given))
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise LayoutError(str(path), [f"cannot read it: {exc.strerror}"]) from None
    except json.JSONDecodeError as exc:
        raise LayoutError(str(path), [f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from None
    return parse_layout(data, path.stem if path.parent == LAYOUTS_DIR else str(path))


# -- QEMU ------------------------------------------------------------------------------------

MANAGEMENT_MAC = "52:54:00:4e:00:01"  # the guest's systemd-networkd matches it (scripts/vm-deps)
# The layout's NICs are modern-only virtio-net functions (1af4:1041); the management NIC on the
# root bus stays transitional (1af4:1000), so the two are different kinds to ask for.
LAYOUT_NIC_RESOURCE = "pci/1af4:1041"
FIRST_EXPANDER_BUS = 16
BUSES_PER_EXPANDER = 16


def qemu_topology_args(layout: Layout) -> list[str]:
    """-smp, -m, the memory backends, the nodes, their CPUs and the distances."""
    args = ["-smp", f"{layout.cpu_count},sockets={layout.sockets},cores={layout.cores_per_socket},"
                    f"threads={layout.threads_per_core}",
            "-m", f"{layout.memory_mib}M"]
    for node in layout.nodes:
        args += ["-object", f"memory-backend-ram,id=mem{node.id},size={node.memory_mib}M"]
        spec = f"node,nodeid={node.id},memdev=mem{node.id}"
        if node.cpus:
            spec += f",cpus={node.cpus[0]}-{node.cpus[-1]}"
        args += ["-numa", spec]
    for a in layout.nodes:
        for b in layout.nodes:
            if a.id != b.id:
                args += ["-numa", f"dist,src={a.id},dst={b.id},val={layout.distance(a.id, b.id)}"]
    return args


def qemu_pci_args(layout: Layout, disk_of: dict[int, Path]) -> list[str]:
    """One PCIe expander bridge per node that has devices, a root port per device behind it.
    `disk_of` maps an NVMe's index in the layout to its backing file."""
    args: list[str] = []
    nodes_with_devices = sorted({d.node for d in layout.pci})
    for k, node in enumerate(nodes_with_devices):
        args += ["-device", f"pxb-pcie,id=pxb{node},bus_nr={FIRST_EXPANDER_BUS + k * BUSES_PER_EXPANDER},"
                            f"numa_node={node},bus=pcie.0"]
    for device in layout.pci:
        port = f"rp{device.index}"
        args += ["-device", f"pcie-root-port,id={port},bus=pxb{device.node},chassis={device.index + 1}"]
        if device.kind == "nic":
            args += ["-netdev", f"user,id=nic{device.index},restrict=on",
                     "-device", f"virtio-net-pci,netdev=nic{device.index},bus={port},disable-legacy=on,"
                                f"mac=52:54:00:4e:01:{device.index:02x}"]
        else:
            args += ["-drive", f"if=none,id=nvme{device.index},file={disk_of[device.index]},format=raw",
                     "-device", f"nvme,bus={port},serial=nri-numa-{device.index},drive=nvme{device.index}"]
    return args

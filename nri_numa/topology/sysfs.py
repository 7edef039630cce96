"""CPUs and NUMA nodes from ``sys/devices/system/{cpu,node}`` under a root.

Groups (core, die, package, L3) are read once per group rather than once per CPU: the first CPU
of a group names all its members, so a 1024-CPU machine costs a few hundred small reads. Every
group is cut down to the online CPUs, because the kernel drops offline CPUs from its masks and
hand-edited trees do not always do so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nri_numa.topology.cpulist import format_list
from nri_numa.topology.parts import Cpu, HugePages, NumaNode
from nri_numa.topology.sysfs_read import (PathArg, read_cpu_list, read_cpu_mask, read_int,
                                          read_list_or_mask, read_text)

_CPU_DIR = "sys/devices/system/cpu"
_NODE_DIR = "sys/devices/system/node"
_CPU_NAME = re.compile(r"cpu(\d+)")
_NODE_NAME = re.compile(r"node(\d+)")
_INDEX_NAME = re.compile(r"index\d+")
_HUGEPAGES_NAME = re.compile(r"hugepages-(\d+)kB")
_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")
_LOCAL_DISTANCE = 10

# Newest names first: older kernels have only the later names, the oldest only the masks.
_CORE_FILES = ("core_cpus_list", "core_cpus", "thread_siblings_list", "thread_siblings")
_DIE_FILES = ("die_cpus_list", "die_cpus")
_PACKAGE_FILES = ("package_cpus_list", "package_cpus", "core_siblings_list", "core_siblings")
_SHARED_FILES = ("shared_cpu_list", "shared_cpu_map")

_Members = tuple[frozenset[int], str]  # a group's CPUs and the file that listed them


@dataclass(frozen=True, slots=True)
class _CpuDir:
    """What one listing of ``cpuN/`` tells, so that nothing below has to probe for files."""

    id: int
    path: str
    has_topology: bool
    has_online_file: bool
    node_link: int | None  # M of the cpuN/nodeM link: the node of an offline CPU


def read_cpus_and_nodes(root: PathArg, warnings: list[str]
                        ) -> tuple[tuple[Cpu, ...], tuple[NumaNode, ...], frozenset[int]]:
    """(cpus, numa_nodes, isolcpus) of the machine under ``root``; problems go to ``warnings``."""
    root = os.fspath(root)
    cpu_root = os.path.join(root, _CPU_DIR)
    cpu_dirs = _scan_cpu_dirs(cpu_root, warnings)
    online = _online_cpus(cpu_root, cpu_dirs, warnings)
    isolcpus = read_cpu_list(f"{cpu_root}/isolated", warnings, required=False) or frozenset()
    nodes, numa_kernel = _read_nodes(root, cpu_dirs, online, warnings)
    cpus = _build_cpus(cpu_dirs, online, nodes, numa_kernel, warnings)
    return cpus, nodes, isolcpus


# --- which CPUs exist and which are online -------------------------------------------------------

def _scan_cpu_dirs(cpu_root: str, warnings: list[str]) -> dict[int, _CpuDir]:
    found: dict[int, _CpuDir] = {}
    for entry in _listing(cpu_root, warnings, required=True):
        match = _CPU_NAME.fullmatch(entry.name)
        if match and _is_dir(entry):
            found[int(match[1])] = _scan_one_cpu(int(match[1]), entry.path, warnings)
    possible = read_cpu_list(f"{cpu_root}/possible", warnings, required=False)
    if possible is not None and not set(found) <= possible:
        extra = set(found) - possible
        warnings.append(f"{cpu_root} has directories for CPUs {format_list(extra)}, which "
                        f"are not in possible ({format_list(possible)}); they are ignored")
        found = {i: d for i, d in found.items() if i in possible}
    return found


def _scan_one_cpu(cpu: int, path: str, warnings: list[str]) -> _CpuDir:
    has_topology = has_online_file = False
    node_link = None
    for entry in _listing(path, warnings, required=True):
        if entry.name == "topology":
            has_topology = _is_dir(entry)
        elif entry.name == "online":
            has_online_file = True
        else:
            match = _NODE_NAME.fullmatch(entry.name)
            if match:  # the link may dangle (its node offline): its name is all we need
                node_link = int(match[1])
    return _CpuDir(cpu, path, has_topology, has_online_file, node_link)


def _online_cpus(cpu_root: str, cpu_dirs: dict[int, _CpuDir],
                 warnings: list[str]) -> frozenset[int]:
    listed = read_cpu_list(f"{cpu_root}/online", warnings, required=False)
    if listed is not None:
        return listed & cpu_dirs.keys()
    # Very old kernels have no cpu/online: each hot-pluggable CPU says so itself, and a CPU
    # without an online file cannot be unplugged, so it is online.
    online = set()
    for cpu, d in cpu_dirs.items():
        state = read_int(f"{d.path}/online", warnings) if d.has_online_file else 1
        if state is None:
            state = 1 if d.has_topology else 0
            warnings.append(f"taking CPU {cpu} as {'online' if state else 'offline'}, "
                            f"since it {'has' if state else 'lacks'} a topology/ directory")
        if state:
            online.add(cpu)
    return frozenset(online)


# --- NUMA nodes --------------------------------------------------------------------------------

def _read_nodes(root: str, cpu_dirs: dict[int, _CpuDir], online: frozenset[int],
                warnings: list[str]) -> tuple[tuple[NumaNode, ...], bool]:
    """The online nodes, and whether the kernel knows NUMA at all (has nodeN directories)."""
    node_root = os.path.join(root, _NODE_DIR)
    node_dirs: dict[int, str] = {}
    for entry in _listing(node_root, warnings, required=False):
        match = _NODE_NAME.fullmatch(entry.name)
        if match and _is_dir(entry):
            node_dirs[int(match[1])] = entry.path
    if not node_dirs:
        return (_single_node(root, online, warnings),), False
    node_online = read_cpu_list(f"{node_root}/online", warnings, required=False)
    # The kernel writes one distance column per online node, in ascending node order.
    columns = sorted(node_online if node_online is not None else node_dirs)
    ids = sorted(node_dirs.keys() & node_online if node_online is not None else node_dirs)
    linked = _cpus_by_node_link(cpu_dirs, online)
    nodes = [_read_node(i, node_dirs[i], columns, online, linked.get(i, frozenset()), warnings)
             for i in ids]
    return _without_shared_cpus(nodes, warnings), True


def _read_node(node: int, path: str, columns: list[int], online: frozenset[int],
               linked_cpus: frozenset[int], warnings: list[str]) -> NumaNode:
    cpus = read_list_or_mask(path, "cpulist", "cpumap", warnings)
    if cpus is None:
        cpus = linked_cpus
        warnings.append(f"node {node}: CPUs taken from the cpuN/node{node} links instead: "
                        f"{format_list(cpus) or 'none'}")
    return NumaNode(
        id=node,
        cpus=cpus & online,
        memory_bytes=_node_memory(f"{path}/meminfo", warnings),
        hugepages=_hugepages(f"{path}/hugepages", warnings),
        distances=_distances(node, f"{path}/distance", columns, warnings),
    )


def _cpus_by_node_link(cpu_dirs: dict[int, _CpuDir], online: frozenset[int]
                       ) -> dict[int, frozenset[int]]:
    by_node: dict[int, set[int]] = {}
    for cpu in online:
        link = cpu_dirs[cpu].node_link
        if link is not None:
            by_node.setdefault(link, set()).add(cpu)
    return {n: frozenset(c) for n, c in by_node.items()}


def _without_shared_cpus(nodes: list[NumaNode], warnings: list[str]) -> tuple[NumaNode, ...]:
    """Each CPU in one node only: the lowest-numbered node that lists it keeps it."""
    taken: set[int] = set()
    out = []
    for n in nodes:
        shared = n.cpus & taken
        if shared:
            warnings.append(f"node {n.id} lists CPUs {format_list(shared)}, which a lower node "
                            f"also lists; they stay with the lower node")
            n = NumaNode(n.id, n.cpus - shared, n.memory_bytes, n.hugepages, n.distances)
        taken |= n.cpus
        out.append(n)
    return tuple(out)


def _node_memory(path: str, warnings: list[str]) -> int:
    text = read_text(path, warnings)
    if text is None:
        return 0
    match = _MEMTOTAL.search(text)
    if match is None:
        warnings.append(f"{path} has no MemTotal line; memory taken as 0")
        return 0
    return int(match[1]) * 1024


def _hugepages(path: str, warnings: list[str]) -> dict[int, HugePages]:
    out = {}
    for entry in _listing(path, warnings, required=False):
        match = _HUGEPAGES_NAME.fullmatch(entry.name)
        if not match:
            continue
        # Only these two files by name: others (demote, mode 0200) cannot be read even by root.
        total = read_int(f"{entry.path}/nr_hugepages", warnings)
        free = read_int(f"{entry.path}/free_hugepages", warnings)
        if total is not None and free is not None:
            out[int(match[1])] = HugePages(total, free)
    return out


def _distances(node: int, path: str, columns: list[int], warnings: list[str]) -> dict[int, int]:
    text = read_text(path, warnings)
    if text is None:
        return {}
    try:
        # split(), not split(" "): the row starts with a space when node 0 is offline.
        row = [int(word) for word in text.split()]
    except ValueError:
        warnings.append(f"{path}: expected distances such as '10 21', found {text[:60]!r}")
        return {}
    if len(row) != len(columns):
        warnings.append(f"{path} has {len(row)} entries, but there is one column per online "
                        f"node ({format_list(columns)}); node {node} gets no distances")
        return {}
    return dict(zip(columns, row))


def _single_node(root: str, online: frozenset[int], warnings: list[str]) -> NumaNode:
    """A kernel without NUMA support has no node/ directory: the machine is one node 0."""
    warnings.append(f"{os.path.join(root, _NODE_DIR)} has no nodeN directories (a kernel "
                    f"without NUMA?); treating the machine as one NUMA node 0")
    meminfo_path = os.path.join(root, "proc/meminfo")
    match = _MEMTOTAL.search(read_text(meminfo_path, warnings, required=False) or "")
    if match is None:
        warnings.append(f"no MemTotal in {meminfo_path}; memory of node 0 taken as 0")
    return NumaNode(
        id=0,
        cpus=online,
        memory_bytes=int(match[1]) * 1024 if match else 0,
        hugepages=_hugepages(os.path.join(root, "sys/kernel/mm/hugepages"), warnings),
        distances={0: _LOCAL_DISTANCE},
    )


# --- CPUs and their groups ---------------------------------------------------------------------

def _build_cpus(cpu_dirs: dict[int, _CpuDir], online: frozenset[int],
                nodes: tuple[NumaNode, ...], numa_kernel: bool,
                warnings: list[str]) -> tuple[Cpu, ...]:
    no_topology = sorted(c for c in online if not cpu_dirs[c].has_topology)
    if no_topology:
        warnings.append(f"online CPUs {format_list(no_topology)} have no topology/ directory; "
                        f"they get a core, die or package only where another CPU's lists name "
                        f"them, else a core of their own")
    topo = {c: f"{cpu_dirs[c].path}/topology" for c in online}
    core = _groups("core", online, lambda c: _first_set(topo[c], _CORE_FILES, warnings),
                   warnings)
    die = _groups("die", online, lambda c: _first_set(topo[c], _DIE_FILES, warnings), warnings)
    package = _groups("package", online,
                      lambda c: _first_set(topo[c], _PACKAGE_FILES, warnings), warnings)
    l3 = _groups("L3", online, lambda c: _l3_members(f"{cpu_dirs[c].path}/cache", warnings),
                 warnings)
    socket = _socket_ids(package, topo, online - set(no_topology), warnings)
    node_of = _node_of_online_cpus(nodes, online, warnings)
    # Without NUMA support every CPU, offline ones too, is on the one node; with it, an offline
    # CPU that has no nodeM link is on an unknown node.
    offline_default = None if numa_kernel else nodes[0].id

    cpus = []
    for cpu in sorted(cpu_dirs):
        if cpu not in online:
            link = cpu_dirs[cpu].node_link
            cpus.append(Cpu(cpu, link if link is not None else offline_default, online=False))
            continue
        cpus.append(Cpu(
            id=cpu,
            numa=node_of.get(cpu),
            core=min(core[cpu]) if cpu in core else cpu,
            socket=socket.get(cpu),
            die=min(die[cpu]) if cpu in die else None,
            l3=min(l3[cpu]) if cpu in l3 else None,
        ))
    return tuple(cpus)


def _groups(kind: str, cpus: frozenset[int],
            members_of: Callable[[int], _Members | None],
            warnings: list[str]) -> dict[int, frozenset[int]]:
    """CPU → its group, asking ``members_of`` only for CPUs no earlier group has claimed."""
    group_of: dict[int, frozenset[int]] = {}
    for cpu in sorted(cpus):
        if cpu in group_of:
            continue
        found = members_of(cpu)
        if found is None:
            continue
        members, source = found[0] & cpus, found[1]
        if cpu not in members:
            warnings.append(f"{source} leaves out CPU {cpu} itself "
                            f"({format_list(found[0]) or 'empty'}); it gets a {kind} of its own")
            members = frozenset({cpu})
        claimed = {m for m in members if m in group_of}
        if claimed:
            warnings.append(f"{source} lists CPUs {format_list(claimed)}, which already belong "
                            f"to another {kind}; the {kind} of CPU {cpu} leaves them out")
            members = members - claimed
        for m in members:
            group_of[m] = members
    return group_of


def _first_set(directory: str, names: Iterable[str], warnings: list[str]) -> _Members | None:
    """The first of ``names`` that reads as a CPU set (``*_list`` as a list, others as masks)."""
    for name in names:
        path = f"{directory}/{name}"
        read = read_cpu_list if name.endswith("_list") else read_cpu_mask
        value = read(path, warnings, required=False)
        if value is not None:
            return value, path
    return None


def _l3_members(cache_dir: str, warnings: list[str]) -> _Members | None:
    """The CPUs sharing this CPU's unified level-3 cache, or None when it has none."""
    for entry in _listing(cache_dir, warnings, required=False):
        if not _INDEX_NAME.fullmatch(entry.name):
            continue
        index = entry.path
        if read_text(f"{index}/level", warnings, required=False) != "3":
            continue
        if read_text(f"{index}/type", warnings, required=False) != "Unified":
            continue
        # Keyed on the member list: the cache id is missing on older kernels and many ARM boxes.
        found = _first_set(index, _SHARED_FILES, warnings)
        if found is None:
            warnings.append(f"{index} is a unified L3 but has no readable shared_cpu_list")
        return found
    return None


def _socket_ids(package: dict[int, frozenset[int]], topo: dict[int, str],
                with_topology: frozenset[int], warnings: list[str]) -> dict[int, int]:
    """physical_package_id where the kernel knows it (>= 0), else the package's lowest CPU."""
    socket: dict[int, int] = {}
    for cpu in sorted(with_topology):
        if cpu in socket:
            continue
        members = package.get(cpu, frozenset({cpu}))
        package_id = read_int(f"{topo[cpu]}/physical_package_id", warnings)
        value = package_id if package_id is not None and package_id >= 0 else min(members)
        for m in members:
            socket[m] = value
    return socket


def _node_of_online_cpus(nodes: tuple[NumaNode, ...], online: frozenset[int],
                         warnings: list[str]) -> dict[int, int]:
    node_of = {cpu: n.id for n in nodes for cpu in n.cpus}
    homeless = online - node_of.keys()
    if homeless:
        warnings.append(f"online CPUs {format_list(homeless)} are in no online NUMA node's "
                        f"cpulist; their NUMA node is unknown")
    return node_of


# --- directory listings --------------------------------------------------------------------------

def _listing(path: str, warnings: list[str], *, required: bool) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        if required:
            warnings.append(f"{path} is missing or not a directory")
        return []
    except (OSError, ValueError) as e:
        warnings.append(f"cannot list {path}: {e}")
        return []


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False

"""lstopo's XML, reduced to what the topology model can be compared with.

hwloc writes CPU sets as comma-separated 32-bit hex words, most significant first, and shortens
zero words ("0x0", or nothing at all between two commas). I/O objects (bridges, PCI devices, OS
devices) have no CPU set of their own: their locality is that of the nearest normal ancestor.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}
_MEMORY_TYPES = {"NUMANode", "MemCache"}
# hwloc_obj_osdev_type_e in hwloc 2.x
_OSDEV_NETWORK = "2"
_OSDEV_OPENFABRICS = "3"


@dataclass(frozen=True)
class PciSeen:
    class_id: int  # class and subclass, without the programming interface: 0x0200
    vendor: int
    device: int
    parent_cpus: frozenset[int]  # CPUs of the normal object hwloc hangs it under
    first_in_tree: str  # the first function below its host bridge: hwloc locates by that one


@dataclass
class HwlocView:
    online: frozenset[int] = frozenset()
    nodes: dict[int, frozenset[int]] = field(default_factory=dict)  # os_index → cpuset
    memory: dict[int, int] = field(default_factory=dict)  # os_index → bytes, where shown
    packages: list[frozenset[int]] = field(default_factory=list)
    cores: list[frozenset[int]] = field(default_factory=list)
    l3: list[frozenset[int]] = field(default_factory=list)
    pci: dict[str, PciSeen] = field(default_factory=dict)  # busid →
    netdevs: dict[str, str] = field(default_factory=dict)  # name → PCI busid
    rdma: dict[str, str] = field(default_factory=dict)  # name → PCI busid
    distances: dict[int, dict[int, int]] = field(default_factory=dict)  # SLIT, by os_index


def run_lstopo(lstopo: str, args: list[str], extra_env: dict[str, str]) -> HwlocView:
    """lstopo with ``args`` and ``--of xml -``, with no HWLOC_* setting but ``extra_env``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    env.update(extra_env)
    done = subprocess.run([lstopo, *args, "--of", "xml", "-"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return parse(done.stdout)


def run_lstopo_on_tree(lstopo: str, tree: Path, extra_env: dict[str, str]) -> HwlocView:
    # -x86: no CPUID, so hwloc reads the tree alone, as we do.
    return run_lstopo(lstopo, ["--input", str(tree), "--whole-io", "--disallowed"],
                      {"HWLOC_COMPONENTS": "-x86", **extra_env})


def parse_bitmap(text: str) -> frozenset[int]:
    value = 0
    for word in text.split(","):
        value = value << 32 | int(word or "0", 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def parse(text: str) -> HwlocView:
    view = HwlocView()
    root = ET.fromstring(text)
    machine = root.find("object")
    assert machine is not None and machine.get("type") == "Machine"
    view.online = parse_bitmap(machine.get("cpuset"))
    _walk(machine, machine, "", view)
    for matrix in root.findall("distances2"):
        if matrix.get("type") == "NUMANode" and matrix.get("name") == "NUMALatency":
            view.distances = _distance_matrix(matrix)
    return view


def _walk(obj: ET.Element, normal_parent: ET.Element, tree_first: str, view: HwlocView) -> None:
    kind = obj.get("type")
    cpus = parse_bitmap(obj.get("cpuset")) if obj.get("cpuset") else frozenset()
    if kind == "NUMANode":
        view.nodes[int(obj.get("os_index"))] = cpus
        if obj.get("local_memory") is not None:
            view.memory[int(obj.get("os_index"))] = int(obj.get("local_memory"))
    elif kind == "Package":
        view.packages.append(cpus)
    elif kind == "Core":
        view.cores.append(cpus)
    elif kind == "L3Cache":
        view.l3.append(cpus)
    busid = obj.get("pci_busid")
    if busid is not None:
        view.pci[busid] = _pci_seen(obj, normal_parent, tree_first or busid)
    for child in obj.findall("object"):
        if child.get("type") == "OSDev" and busid is not None:
            _record_osdev(child, busid, view)
    if kind not in _IO_TYPES and kind not in _MEMORY_TYPES:
        normal_parent = obj
    if kind == "Bridge" and obj.get("bridge_type", "").startswith("0-"):
        # A host bridge has no bus id: hwloc locates all below it by its first function.
        tree_first = next((c.get("pci_busid") for c in obj.findall("object")
                           if c.get("pci_busid")), "")
    for child in obj.findall("object"):
        _walk(child, normal_parent, tree_first or busid or "", view)


def _pci_seen(obj: ET.Element, normal_parent: ET.Element, first: str) -> PciSeen:
    # pci_type: "0200 [8086:1521] [1028:0000] 01" = class, [vendor:device], [subsystem], rev
    words = obj.get("pci_type", "0 [0:0]").split()
    vendor, device = words[1].strip("[]").split(":")
    return PciSeen(int(words[0], 16), int(vendor, 16), int(device, 16),
                   parse_bitmap(normal_parent.get("cpuset")), first)


def _record_osdev(osdev: ET.Element, busid: str, view: HwlocView) -> None:
    if osdev.get("osdev_type") == _OSDEV_NETWORK:
        view.netdevs[osdev.get("name")] = busid
    elif osdev.get("osdev_type") == _OSDEV_OPENFABRICS:
        view.rdma[osdev.get("name")] = busid


def _distance_matrix(matrix: ET.Element) -> dict[int, dict[int, int]]:
    ids = [int(w) for chunk in matrix.findall("indexes") for w in chunk.text.split()]
    values = [int(w) for chunk in matrix.findall("u64values") for w in chunk.text.split()]
    assert len(values) == len(ids) ** 2
    return {a: dict(zip(ids, values[i * len(ids):(i + 1) * len(ids)])) for i, a in enumerate(ids)}

"""A 1024-CPU machine: discovery stays fast because it reads each group's files once.

2 sockets x 256 cores x 2 threads, 4 NUMA nodes per socket, one L3 per 8 cores, 64 PCI
functions (32 root ports with a NIC each). The read counts are the exact statement of the
design; the time it takes is measured by `python -m bench.bench_discovery`, not here.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from nri_numa.topology import netdev, pci, sysfs, sysfs_read
from tests.integration.sysfs_tree import (Function, Machine, add_netdev, build_machine,
                                          build_pci)
from tests.tmpfs import fast_tmp

BIG = Machine(sockets=2, cores_per_socket=256, threads=2, nodes_per_socket=4, cores_per_l3=8)
PORTS = [Function(f"pci0000:{b:02x}/0000:{b:02x}:01.0", class_code=0x060400, driver="pcieport")
         for b in range(0, 0x40, 2)]
NICS = [Function(f"{port.path}/0000:{b + 1:02x}:00.0") for b, port in zip(range(0, 0x40, 2), PORTS)]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    with fast_tmp(tmp_path_factory.mktemp("big")) as root:
        build_machine(root, BIG)
        build_pci(root, PORTS + NICS)
        for i, nic in enumerate(NICS):
            add_netdev(root, f"ens{i}", nic.path)
        yield root


def discover(root: Path) -> tuple[tuple, tuple, tuple, tuple, list[str]]:
    warnings: list[str] = []
    cpus, nodes, _ = sysfs.read_cpus_and_nodes(root, warnings)
    devices = pci.read_pci_devices(root, warnings)
    nics = netdev.read_nics(root, devices, warnings, netlink=False)
    return cpus, nodes, devices, nics, warnings


def test_the_big_machine_is_read_right(big):
    cpus, nodes, devices, nics, warnings = discover(big)
    assert warnings == []
    assert len(cpus) == 1024 and len(nodes) == 8 and len(devices) == 64 and len(nics) == 32
    assert len({c.core for c in cpus}) == 512
    assert len({c.l3 for c in cpus}) == 64
    assert {c.socket for c in cpus} == {0, 1}
    assert all(len(n.cpus) == 128 for n in nodes)
    assert cpus[700].core == 700 - 512 and cpus[700].numa == BIG.node_of(700)


def test_each_group_file_is_read_once(big, monkeypatch):
    opened: Counter[str] = Counter()
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened[os.fspath(path)] += 1
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sysfs_read.os, "open", counting_open)
    discover(big)
    by_name = Counter(os.path.basename(p) for p in opened)
    assert max(opened.values()) == 1  # no file read twice
    assert by_name["core_cpus_list"] == 512  # once per core, not per CPU
    assert by_name["package_cpus_list"] == by_name["die_cpus_list"] == 2
    assert by_name["physical_package_id"] == 2
    assert by_name["shared_cpu_list"] == 64  # once per L3
    assert by_name["cpulist"] == by_name["meminfo"] == by_name["distance"] == 8
    assert sum(by_name.values()) < 2000

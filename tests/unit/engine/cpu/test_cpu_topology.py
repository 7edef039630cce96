"""cpu_topology / CPUTopology: records, counters, derived sizes, from_topology, bad input."""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.cpu import CPUTopologyError, cpu_hints, cpu_topology, take_cpus
from nri_numa.engine.cpu.topology import CPUInfo, CPUTopology
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from nri_numa.topology.synthetic.presets import PRESETS, preset_topology

from .kubelet_fixtures import (
    DUAL_SOCKET_HT,
    DUAL_SOCKET_MULTI_NUMA_HT,
    MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT,
    QUAD_SOCKET_FOUR_WAY_HT,
    UNCORE_SINGLE_SOCKET_SMT,
    cpus,
)


@pytest.mark.parametrize("topo, counts, per_unit, numa_first", [
    # (cpus, cores, sockets, NUMA nodes, uncore caches), (per core, per socket, per uncore)
    (DUAL_SOCKET_HT, (12, 6, 2, 2, 2), (2, 6, 6), True),
    (DUAL_SOCKET_MULTI_NUMA_HT, (80, 40, 2, 4, 2), (2, 40, 40), False),
    (MULTI_SOCKET_DUAL_SOCKET_PER_NUMA_HT, (80, 40, 4, 2, 4), (2, 20, 20), True),
    (QUAD_SOCKET_FOUR_WAY_HT, (288, 72, 4, 4, 4), (4, 72, 72), True),
    (UNCORE_SINGLE_SOCKET_SMT, (16, 8, 1, 1, 2), (2, 16, 8), True),
])
def test_counters(topo, counts, per_unit, numa_first):
    assert (topo.num_cpus, topo.num_cores, topo.num_sockets, topo.num_numa_nodes,
            topo.num_uncore_caches) == counts
    assert (topo.cpus_per_core, topo.cpus_per_socket, topo.cpus_per_uncore) == per_unit
    assert topo.numa_first is numa_first


def test_lookups_on_the_dual_xeon():
    topo = DUAL_SOCKET_MULTI_NUMA_HT
    assert topo.numa_ids == (0, 1, 2, 3)
    assert topo.cpus_in_numa_nodes([1]) == cpus("10-19,50-59")
    assert topo.cpus_in_sockets([1]) == cpus("20-39,60-79")
    assert topo.sockets_of_numa_nodes([1, 2]) == {0, 1}
    assert topo.siblings({3, 44}) == {3, 4, 43, 44}
    assert topo.cpus_in_cores([7]) == {7, 47}
    assert topo.sockets_of_numa[3] == (1,) and topo.numas_of_socket[0] == (0, 1)


def test_missing_uncore_falls_back_to_the_socket():
    """The kubelet's discovery aligns by socket when no uncore cache is reported."""
    topo = cpu_topology([{"cpu": 0, "core": 0, "socket": 3, "numa": 0},
                         {"cpu": 1, "core": 1, "socket": 3, "numa": 0, "uncore_cache": None},
                         {"cpu": 2, "core": 2, "socket": 5, "numa": 1, "uncore_cache": 9}])
    assert dict(topo.uncore_cpus) == {3: 0b011, 9: 0b100}


def test_record_order_does_not_matter():
    records = [{"cpu": c, "core": c % 4, "socket": 0, "numa": 0} for c in range(8)]
    a, b = cpu_topology(records), cpu_topology(reversed(records))
    assert a.cpus == b.cpus and dict(a.core_cpus) == dict(b.core_cpus)


@pytest.mark.parametrize("records, message", [
    ([], "no CPUs: a CPU topology needs at least one record"),
    ([{"cpu": 0, "core": 0, "socket": 0}], "record 0 (cpu 0): numa is missing"),
    ([{"cpu": 0, "core": None, "socket": 0, "numa": 0}], "record 0 (cpu 0): core is missing"),
    ([{"cpu": -1, "core": 0, "socket": 0, "numa": 0}],
     "record 0: cpu must be a non-negative integer, not -1"),
    ([{"cpu": 0, "core": "0", "socket": 0, "numa": 0}],
     "record 0 (cpu 0): core must be a non-negative integer, not '0'"),
    ([{"cpu": 0, "core": 0, "socket": True, "numa": 0}],
     "record 0 (cpu 0): socket must be a non-negative integer, not True"),
    ([{"cpu": 0, "core": 0, "socket": 0, "numa": 0, "uncore_cache": 1.0}],
     "record 0 (cpu 0): uncore_cache must be a non-negative integer, not 1.0"),
    ([{"cpu": 0, "core": 0, "socket": 0, "numa": 0}, {"cpu": 0, "core": 1, "socket": 0, "numa": 0}],
     "record 1: cpu 0 already given by record 0"),
    ([{"cpu": 0, "core": 0, "socket": 0, "numa": 0}, {"cpu": 1, "core": 0, "socket": 1, "numa": 1}],
     "core 0 has cpu 0 on socket 0 / NUMA node 0 and cpu 1 on socket 1 / NUMA node 1;"
     " core ids must be unique machine-wide"),
    (["cpu0"], "record 0 must be a mapping, not str"),
])
def test_bad_records(records, message):
    with pytest.raises(CPUTopologyError) as err:
        cpu_topology(records)
    assert str(err.value) == message


def test_from_topology_uses_online_cpus_and_l3():
    model = Topology(
        cpus=(Cpu(0, numa=0, core=0, socket=0, l3=0), Cpu(1, numa=0, core=1, socket=0, l3=0),
              Cpu(2, numa=1, core=2, socket=1, l3=2), Cpu(3, numa=1, online=False),
              Cpu(4, numa=None, core=4, socket=1, l3=None)),
        numa_nodes=(NumaNode(0, frozenset({0, 1}), 1 << 30),
                    NumaNode(1, frozenset({2}), 1 << 30)),
    )
    topo = CPUTopology.from_topology(model)
    assert topo.cpu_ids() == {0, 1, 2, 4}
    assert topo.numa_of_cpu[4] == 0  # no NUMA node reported: node 0
    assert dict(topo.uncore_cpus) == {0: 0b00011, 1: 0b10000, 2: 0b00100}  # CPU 4: socket 1


def test_from_topology_names_a_cpu_without_a_core():
    model = Topology(cpus=(Cpu(0, numa=0, core=0, socket=0), Cpu(5, numa=0, core=None, socket=0)),
                     numa_nodes=(NumaNode(0, frozenset({0, 5}), 1 << 30),))
    with pytest.raises(CPUTopologyError, match=r"record 1 \(cpu 5\): core is missing"):
        CPUTopology.from_topology(model)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_machine(name):
    """Each synthetic machine's online CPUs make a CPU topology whose NUMA nodes and L3 groups
    match the model, and on which one CPU can be placed and hinted."""
    model = preset_topology(name)
    topo = CPUTopology.from_topology(model)
    assert topo.cpu_ids() == model.online_cpus
    for node in model.numa_nodes:
        if node.cpus:
            assert topo.cpus_in_numa_nodes([node.id]) == node.cpus
    for cpu in model.cpus:
        if cpu.online and cpu.l3 is not None:
            assert topo.uncore_cpus[cpu.l3] >> cpu.id & 1
    assert len(take_cpus(topo, topo.cpu_ids(), 1)) == 1
    hints = cpu_hints(topo, topo.cpu_ids(), set(), 1)
    assert any(h.preferred and len(h.affinity) == 1 for h in hints)


def test_the_maps_are_those_of_grouping_each_relation():
    rng = random.Random(16)
    for _ in range(50):
        infos = tuple(CPUInfo(cpu, rng.randrange(12), rng.randrange(3), rng.randrange(4),
                              rng.randrange(5)) for cpu in rng.sample(range(96), 40))
        topo = CPUTopology(infos)
        assert topo.cpus == tuple(sorted(infos, key=lambda c: c.cpu))
        assert topo.all_cpus == sum(1 << c.cpu for c in infos)
        for unit in ("core", "socket", "numa", "uncore"):
            masks = getattr(topo, f"{unit}_cpus")
            assert list(masks) == sorted({getattr(c, unit) for c in infos})
            assert all(mask == sum(1 << c.cpu for c in infos if getattr(c, unit) == key)
                       for key, mask in masks.items())
        for name, (key, member) in {"sockets_of_numa": ("numa", "socket"),
                                    "numas_of_socket": ("socket", "numa"),
                                    "cores_of_socket": ("socket", "core"),
                                    "cores_of_numa": ("numa", "core"),
                                    "uncores_of_numa": ("numa", "uncore")}.items():
            grouped = {}
            for c in infos:
                grouped.setdefault(getattr(c, key), set()).add(getattr(c, member))
            expected = {k: tuple(sorted(v)) for k, v in sorted(grouped.items())}
            assert list(getattr(topo, name).items()) == list(expected.items()), name

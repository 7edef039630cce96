"""CPUTopology.from_topology builds the CPUs of a topology in one pass: the same CPU topology,
and the same errors, as ``cpu_topology`` reading them record by record; and CPUTopology derives
its maps in one pass over the CPUs, the same maps as grouping them one relation at a time."""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.cpu import CPUTopologyError, cpu_topology
from nri_numa.engine.cpu.topology import CPUInfo, CPUTopology, _records
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, NumaNode
from nri_numa.topology.synthetic.presets import PRESETS, preset_topology

MAPS = ("all_cpus", "core_cpus", "socket_cpus", "numa_cpus", "uncore_cpus", "sockets_of_numa",
        "numas_of_socket", "cores_of_socket", "cores_of_numa", "uncores_of_numa", "numa_of_cpu",
        "core_of_cpu")


def _shape(topo: CPUTopology) -> tuple:
    """Everything a CPUTopology holds (it compares by identity)."""
    return (topo.cpus, *(getattr(topo, name) for name in MAPS))


def _outcome(build) -> tuple[str, object]:
    try:
        return "value", _shape(build())
    except CPUTopologyError as e:
        return "error", str(e)


def _both_ways(topology: Topology) -> tuple[tuple, tuple]:
    return (_outcome(lambda: CPUTopology.from_topology(topology)),
            _outcome(lambda: cpu_topology(_records(topology))))


def _machine(*cpus: Cpu) -> Topology:
    return Topology(cpus=cpus, numa_nodes=(NumaNode(0, frozenset(), 1 << 30),))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_machine_alike_both_ways(name):
    fast, records = _both_ways(preset_topology(name))
    assert fast[0] == "value" and fast == records


class _Id(int):
    """An int that is not exactly int: cpu_topology takes it, the one-pass reader leaves it."""


@pytest.mark.parametrize("odd", [
    {"core": None}, {"socket": None}, {"numa": None}, {"l3": None}, {"core": -1},
    {"socket": -2}, {"numa": -1}, {"l3": -1}, {"id": -1}, {"core": True}, {"numa": False},
    {"l3": True}, {"core": 2.0}, {"socket": "0"}, {"id": 0}, {"core": 3}, {"socket": 1},
    {"online": False}, {"core": _Id(2)}, {"id": _Id(9)},
])
def test_an_odd_cpu_gives_what_cpu_topology_gives(odd):
    plain = {"id": 2, "numa": 0, "core": 2, "socket": 0, "l3": 0}
    topology = _machine(Cpu(0, 0, core=0, socket=0, l3=0), Cpu(1, 0, core=0, socket=0, l3=0),
                        Cpu(**{**plain, **odd}), Cpu(3, 0, core=2, socket=0, l3=0))
    fast, records = _both_ways(topology)
    assert fast == records


def test_no_online_cpu_gives_what_cpu_topology_gives():
    fast, records = _both_ways(_machine(Cpu(0, 0, online=False)))
    assert fast == records == ("error", "no CPUs: a CPU topology needs at least one record")


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

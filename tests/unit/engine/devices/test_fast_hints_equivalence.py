"""The faster device hints give exactly the plain walk's hints.

``plain_generate_hints`` is the rule as the kubelet states it (§6 of
docs/kubelet-algorithms.md): walk every mask in kubelet order, count the devices that touch it.
The engine's version counts once per node (or per distinct device mask) and reads the counts of
every mask from a table. Compared on seeded random resources: devices on one node, on several,
on nodes the machine list leaves out, without nodes; unhealthy and unknown ids; reusable
devices; sparse node ids.
"""

from __future__ import annotations

import random

import pytest

from nri_numa.engine.bitmask import bits, iterate_masks, mask_of
from nri_numa.engine.devices import Device, Resource
from nri_numa.engine.devices.hints import device_hints, generate_hints
from nri_numa.engine.hints import Hint

SEEDS = range(60)


def plain_generate_hints(resource: Resource, available, reusable, request: int,
                         numa_nodes) -> list[Hint]:
    every_device = [mask_of(d.numa_nodes) for d in resource.devices]
    available_masks = [mask_of(resource.numa_nodes_of(d)) for d in available]
    placed = [m for m in (mask_of(resource.numa_nodes_of(d)) for d in reusable) if m]
    min_affinity = len(numa_nodes)
    fitting = []
    for mask in iterate_masks(numa_nodes):
        size = mask.bit_count()
        if size < min_affinity and sum(1 for m in every_device if m & mask) >= request:
            min_affinity = size
        if any(not m & mask for m in placed):
            continue
        if len(placed) + sum(1 for m in available_masks if m & mask) >= request:
            fitting.append(mask)
    return [Hint(bits(mask), mask.bit_count() == min_affinity) for mask in fitting]


def random_case(rng: random.Random):
    numa_nodes = sorted(rng.sample(range(10), rng.randint(1, 6)))
    spread = rng.random() < 0.3  # some devices on several nodes
    devices = []
    for i in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.1:
            nodes = frozenset()
        elif kind < 0.2:
            nodes = frozenset({rng.randrange(12)})  # maybe a node the list leaves out
        elif spread and kind < 0.5:
            nodes = frozenset(rng.sample(numa_nodes, rng.randint(1, len(numa_nodes))))
        else:
            nodes = frozenset({rng.choice(numa_nodes)})
        devices.append(Device(f"dev{i}", nodes, healthy=rng.random() < 0.9))
    resource = Resource("example.com/dev", tuple(devices))
    ids = [d.id for d in devices] + ["unknown"]
    available = frozenset(rng.sample(ids, rng.randint(0, len(ids))))
    reusable = frozenset(rng.sample(ids, rng.choice([0, 0, 1, 2])))
    request = rng.randint(0, len(devices) + 1)
    return resource, available, reusable, request, numa_nodes


@pytest.mark.parametrize("seed", SEEDS)
def test_hints_match_the_plain_walk(seed):
    rng = random.Random(seed)
    for _ in range(30):
        resource, available, reusable, request, numa_nodes = random_case(rng)
        assert (generate_hints(resource, available, reusable, request, numa_nodes)
                == plain_generate_hints(resource, available, reusable, request, numa_nodes))


@pytest.mark.parametrize("seed", SEEDS[:20])
def test_container_hints_match_with_the_plain_walk(seed, monkeypatch):
    rng = random.Random(seed)
    cases = [random_case(rng) for _ in range(30)]

    def run():
        return [device_hints(resource, request, numa_nodes, allocated_to_others=available,
                             reusable=reusable)
                for resource, available, reusable, request, numa_nodes in cases]

    fast = run()
    monkeypatch.setattr("nri_numa.engine.devices.hints.generate_hints", plain_generate_hints)
    assert fast == run()

"""The faster CPU accumulator gives exactly the choices of the plain one it replaced, and the
CPU hints those of the plain walk over every mask.

``_PlainAccumulator`` is the straightforward form of the kubelet's accumulator: every ordering
sorted by (free CPUs, id), the free units filtered out of those orderings, the remaining CPUs
listed in full before any is taken. The engine's accumulator skips work it can prove does not
change the answer; these tests compare the two on many seeded random machines, free sets and
requests, for every strategy and option the static policy has.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

import pytest

from nri_numa.engine.bitmask import bits, iterate_masks
from nri_numa.engine.cpu import (CPUAllocationError, accumulator, checked_mask, cpu_hints,
                                 cpu_hints_for_masks, cpu_topology, distributed, set_of, take,
                                 take_cpus)
from nri_numa.engine.cpu.accumulator import PACKED, SPREAD, CPUAccumulator
from nri_numa.engine.cpu.packed import take_packed
from nri_numa.engine.cpu.take import take_cpu_mask
from nri_numa.engine.cpu.topology import CPUTopology, bits_of
from nri_numa.engine.hints import Hint

SEEDS = range(40)


class _PlainAccumulator(CPUAccumulator):
    __slots__ = ()

    def _sorted(self, ids: Iterable[int], masks: Mapping[int, int], within: int = -1) -> list[int]:
        free = self.free
        present = [i for i in ids if free & within & masks[i]]
        return sorted(present, key=lambda i: ((free & masks[i]).bit_count(), i))

    def core_order(self) -> list[int]:
        topo = self.topo
        if topo.numa_first:
            return [c for s in self.socket_order()
                    for c in self._sorted(topo.cores_of_socket[s], topo.core_cpus)]
        return [c for n in self.numa_order()
                for c in self._sorted(topo.cores_of_numa[n], topo.core_cpus)]

    def free_cores(self) -> list[int]:
        masks = self.topo.core_cpus
        return [c for c in self.core_order() if self.free_in(masks[c]) == self.topo.cpus_per_core]

    def _take_whole(self, ids: list[int], masks: Mapping[int, int]) -> None:
        for i in ids:
            unit = masks[i]
            if self.needs_at_least(unit.bit_count()) and self.free & unit == unit:
                self.take(unit)

    def take_full_numa_nodes(self) -> None:
        self._take_whole(self.free_numa_nodes(), self.topo.numa_cpus)

    def take_full_sockets(self) -> None:
        self._take_whole(self.free_sockets(), self.topo.socket_cpus)

    def take_full_cores(self) -> None:
        self._take_whole(self.free_cores(), self.topo.core_cpus)

    def take_remaining(self, strategy: str) -> None:
        order = self.packed_cpu_order() if strategy == PACKED else self.spread_cpu_order()
        for cpu in order:
            self.take(1 << cpu)
            if self.satisfied():
                return


def random_machine(rng: random.Random) -> CPUTopology:
    """Sockets holding NUMA nodes or NUMA nodes holding sockets, cores of one to three threads
    (mixed on some machines), optional uncore caches, scattered CPU and core ids."""
    sockets, nodes = rng.randint(1, 4), rng.randint(1, 4)
    if nodes >= sockets:
        regions = [(n * sockets // nodes, n) for n in range(nodes)]
    else:
        regions = [(s, s * nodes // sockets) for s in range(sockets)]
    threads = [rng.choice([1, 2]) for _ in range(2)] + [rng.randint(1, 3)]
    cores = [(socket, numa, rng.choice(threads))
             for socket, numa in regions for _ in range(rng.randint(1, 5))]
    cpu_ids = rng.sample(range(4 * sum(t for *_, t in cores)), sum(t for *_, t in cores))
    uncore_size = rng.choice([None, 1, 2, 3])
    records, next_cpu = [], iter(cpu_ids)
    core_ids = rng.sample(range(1000), len(cores))
    for index, (socket, numa, count) in enumerate(cores):
        uncore = None if uncore_size is None else 100 * socket + index // uncore_size
        for _ in range(count):
            records.append({"cpu": next(next_cpu), "core": core_ids[index], "socket": socket,
                            "numa": numa, "uncore_cache": uncore})
    return cpu_topology(records)


def random_free(rng: random.Random, topo: CPUTopology) -> int:
    density = rng.choice([0.3, 0.6, 0.9, 1.0])
    extra = 1 << (topo.all_cpus.bit_length() + 3)  # a CPU the machine does not have
    free = sum(1 << c for c in topo.cpu_ids() if rng.random() < density)
    return free | (extra if rng.random() < 0.2 else 0)


def outcome(take, *args) -> tuple[str, object]:
    """The answer, or the error's kind and message."""
    try:
        return "ok", take(*args)
    except CPUAllocationError as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize("seed", SEEDS)
def test_orderings_and_free_units_match_the_plain_accumulator(seed):
    rng = random.Random(seed)
    for _ in range(10):
        topo = random_machine(rng)
        free = random_free(rng, topo)
        fast, plain = CPUAccumulator(topo, free, 0), _PlainAccumulator(topo, free, 0)
        for name in ("numa_order", "socket_order", "core_order", "uncore_order",
                     "packed_cpu_order", "spread_cpu_order", "free_numa_nodes", "free_sockets",
                     "free_cores", "free_uncores"):
            assert getattr(fast, name)() == getattr(plain, name)(), name


def use_the_plain_accumulator(monkeypatch) -> None:
    """The takes from here on run on ``_PlainAccumulator`` (``new_accumulator`` makes one)."""
    monkeypatch.setattr(accumulator, "CPUAccumulator", _PlainAccumulator)
    one_cpu = cpu_topology([{"cpu": 0, "core": 0, "socket": 0, "numa": 0}])
    assert type(accumulator.new_accumulator(one_cpu, 1, 1)) is _PlainAccumulator


@pytest.mark.parametrize("seed", SEEDS)
def test_packed_and_spread_takes_match_the_plain_accumulator(seed, monkeypatch):
    rng = random.Random(seed)
    cases = []
    for _ in range(10):
        topo = random_machine(rng)
        free = random_free(rng, topo)
        counts = sorted({0, 1, 2, 3, rng.randint(0, topo.num_cpus + 1), free.bit_count()})
        cases += [(topo, free, count, strategy, uncore) for count in counts
                  for strategy in (PACKED, SPREAD) for uncore in (False, True)]
    fast = [outcome(take_packed, *args) for args in cases]
    use_the_plain_accumulator(monkeypatch)
    assert [outcome(take_packed, *args) for args in cases] == fast


@pytest.mark.parametrize("seed", SEEDS[:15])
def test_distributed_takes_match_with_the_plain_accumulator(seed, monkeypatch):
    rng = random.Random(seed)
    cases = []
    for _ in range(8):
        topo = random_machine(rng)
        free = random_free(rng, topo)
        group = rng.choice([1, topo.cpus_per_core])
        cases += [(topo, free, count, group) for count in {1, 2, 4, rng.randint(1, topo.num_cpus)}]

    def run() -> list[tuple[str, object]]:
        return [outcome(distributed.take_distributed, topo, free, count, group, PACKED)
                for topo, free, count, group in cases]

    fast = run()
    use_the_plain_accumulator(monkeypatch)
    assert fast == run()


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_the_mask_entry_point_answers_like_take_cpus(seed):
    rng = random.Random(seed)
    for _ in range(10):
        topo = random_machine(rng)
        free = random_free(rng, topo)
        count = rng.randint(0, free.bit_count())
        options = rng.choice([{}, {"spread_across_cores": True},
                              {"distribute_across_numa": True, "cpu_group_size": 1},
                              {"align_by_uncore_cache": True}])
        expected = outcome(lambda: take_cpus(topo, frozenset(bits_of(free)), count, **options))
        got = outcome(lambda: set_of(take_cpu_mask(topo, free, count, **options)))
        assert got == expected


def test_the_mask_entry_point_checks_its_options_like_take_cpus():
    topo = cpu_topology([{"cpu": 0, "core": 0, "socket": 0, "numa": 0}])
    for bad in ({"spread_across_cores": True, "distribute_across_numa": True},
                {"cpu_group_size": 0}):
        with pytest.raises(ValueError) as mask_error:
            take_cpu_mask(topo, 1, 1, **bad)
        with pytest.raises(ValueError) as set_error:
            take_cpus(topo, {0}, 1, **bad)
        assert str(mask_error.value) == str(set_error.value)
    with pytest.raises(ValueError, match="non-negative integer"):
        take.take_cpu_mask(topo, 1, -1)


@pytest.mark.parametrize("seed", range(5))
def test_set_of_reads_every_bit(seed):
    rng = random.Random(seed)
    for _ in range(500):
        mask = rng.getrandbits(rng.randint(0, 1100)) & rng.getrandbits(1100)
        assert set_of(mask) == frozenset(bits_of(mask))
        assert checked_mask(set_of(mask), "cpus") == mask


def plain_cpu_hints(topo: CPUTopology, available: int, reusable: int, request: int,
                    align_by_socket: bool) -> list[Hint]:
    """§4.9 as written: every mask of the nodes with CPUs, in kubelet order."""
    nodes = topo.numa_ids
    held = reusable & topo.all_cpus
    sizes = sorted((topo.numa_cpus[n].bit_count() for n in nodes), reverse=True)
    min_affinity = next((k for k in range(1, len(nodes) + 1) if sum(sizes[:k]) >= request),
                        len(nodes))
    per_socket = topo.num_numa_nodes // topo.num_sockets
    min_sockets = -(-min_affinity // per_socket) if align_by_socket and per_socket else 0
    hints = []
    for ids in iterate_masks(nodes):
        cpus = sum(topo.numa_cpus[n] for n in bits(ids))
        if held & ~cpus or (available & cpus).bit_count() + held.bit_count() < request:
            continue
        sockets = {s for n in bits(ids) for s in topo.sockets_of_numa[n]}
        aligned = bool(min_sockets) and len(sockets) == min_sockets
        preferred = ids.bit_count() == min_affinity or aligned
        hints.append(Hint(bits(ids), preferred))
    return hints


@pytest.mark.parametrize("seed", SEEDS[:20])
def test_cpu_hints_match_the_plain_walk(seed):
    rng = random.Random(seed)
    for _ in range(10):
        topo = random_machine(rng)
        available = random_free(rng, topo)
        reusable = 0 if rng.random() < 0.6 else random_free(rng, topo) & rng.getrandbits(64)
        request = rng.randint(1, topo.num_cpus + 1)
        for align in (False, True):
            expected = plain_cpu_hints(topo, available, reusable, request, align)
            assert cpu_hints_for_masks(topo, available, reusable, request,
                                       align_by_socket=align) == expected
            assert cpu_hints(topo, set_of(available), set_of(reusable), request,
                             align_by_socket=align) == expected

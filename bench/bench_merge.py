"""Times the engine's hint merge against the kubelet-style cross-product merge.

Run from the repository root:  .venv/bin/python -m bench.bench_merge [--quick]

Hint lists are made the way the kubelet's providers make them (``realistic_case``): a machine
with some CPUs, memory, hugepages, GPUs and NICs already in use, a container asking for some of
each, and for every resource every NUMA mask whose free capacity covers the request, preferred when
it has the fewest nodes any mask of the whole machine would need. Four providers: cpu, memory
(memory and hugepages-1Gi), GPUs, NICs. 64 nodes cannot be enumerated (2**64 masks), so that
scenario uses the bounded generation docs/merge-algorithm.md recommends (``seeded_case``).

For every scenario it prints p50/p99 of the engine's merge, and where the baseline can run, the
baseline's on the same cases and the ratio of the medians; it stops with an error if any answer
differs. The baseline costs the product of the list lengths (up to 255**5 at 8 nodes), so it
runs only on cases whose product is at most ``BASELINE_MAX_COMBINATIONS``, at most
``BASELINE_CASES`` of them (at 8 nodes drawn from the same generator until that many are found),
twice each; the output says how many.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from bench.baseline_merge import baseline_merge
from nri_numa.engine import Hint, merge_hints
from nri_numa.engine.bitmask import bits, iterate_masks

BASELINE_MAX_COMBINATIONS = 150_000
BASELINE_CASES = 8
POLICIES = ("best-effort", "restricted", "single-numa-node")
KUBELET_8_NODE_DISTANCES = (
    (10, 11, 12, 12, 30, 30, 30, 30), (11, 10, 12, 12, 30, 30, 30, 30),
    (12, 12, 10, 11, 30, 30, 30, 30), (12, 12, 11, 10, 30, 30, 30, 30),
    (30, 30, 30, 30, 10, 11, 12, 12), (30, 30, 30, 30, 11, 10, 12, 12),
    (30, 30, 30, 30, 12, 12, 10, 11), (30, 30, 30, 30, 12, 12, 13, 10),
)
GIB = 1 << 30


@dataclass(frozen=True)
class Case:
    policy: str
    nodes: tuple[int, ...]
    providers: tuple[dict[str, list[Hint] | None] | None, ...]
    distances: tuple[tuple[int, ...], ...]
    options: dict[str, str]

    def combinations(self) -> int:
        product = 1
        for provider in self.providers:
            for hints in (provider or {}).values():
                product *= max(1, len(hints or ()))
        return product


@dataclass(frozen=True)
class Resource:
    """One resource on every node: what the whole machine has, and what is free now."""
    total: tuple[int, ...]
    free: tuple[int, ...]
    request: int


def socket_distances(count: int, per_socket: int = 4) -> tuple[tuple[int, ...], ...]:
    """SLIT-like table: 10 on the node, 12 within a socket, 20 to the next socket, 30 beyond."""
    def distance(a: int, b: int) -> int:
        if a == b:
            return 10
        hops = abs(a // per_socket - b // per_socket)
        return 12 if hops == 0 else (20 if hops == 1 else 30)
    return tuple(tuple(distance(a, b) for b in range(count)) for a in range(count))


def random_resources(rng: random.Random, count: int) -> dict[str, Resource]:
    """A partly used machine and a container's request for every resource (0: not asked for)."""
    def resource(per_node: Callable[[], int], request_max: int, unit: int = 1) -> Resource:
        total = tuple(per_node() * unit for _ in range(count))
        free = tuple(rng.randint(0, t // unit) * unit for t in total)
        return Resource(total, free, rng.randint(0, request_max) * unit)
    return {
        "cpu": resource(lambda: 16, max(1, count * 5)),
        "memory": resource(lambda: 64, max(1, count * 20), GIB),
        "hugepages-1Gi": resource(lambda: 8, max(1, count * 2), GIB),
        "nvidia.com/gpu": resource(lambda: rng.choice((0, 1, 2)), 4),
        "example.com/nic": resource(lambda: rng.choice((0, 1)), 2),
    }


@lru_cache(maxsize=None)
def _hint(mask: int, preferred: bool) -> Hint:
    # Cases share their Hint values: building 65,535 of them per resource is most of a 16-node case.
    return Hint(frozenset(bits(mask)), preferred)


def full_hints(masks: Sequence[int], wanted: Sequence[Resource], nodes: int) -> list[Hint] | None:
    """Every mask whose free capacity covers every request, as the kubelet's providers list them:
    preferred when it has the fewest nodes any mask of the whole machine would need."""
    wanted = [r for r in wanted if r.request]
    if not wanted:
        return None
    totals = [_mask_sums(r.total, nodes) for r in wanted]
    frees = [_mask_sums(r.free, nodes) for r in wanted]
    requests = [r.request for r in wanted]
    fits = [m for m in masks if all(t[m] >= q for t, q in zip(totals, requests))]
    if not fits:
        return []
    fewest = min(m.bit_count() for m in fits)
    return [_hint(m, m.bit_count() == fewest) for m in masks if all(f[m] >= q for f, q in zip(frees, requests))]


def seeded_hints(wanted: Sequence[Resource], distances: Sequence[Sequence[int]]) -> list[Hint] | None:
    """Bounded generation: from every node, the nearest nodes until every request fits; plus the
    whole machine. At most n + 1 hints instead of 2**n - 1 (docs/merge-algorithm.md)."""
    wanted = [r for r in wanted if r.request]
    if not wanted:
        return None
    count = len(distances)
    grown_total = [_grow(seed, [r.total for r in wanted], wanted, distances) for seed in range(count)]
    grown_free = [_grow(seed, [r.free for r in wanted], wanted, distances) for seed in range(count)]
    fewest = min((m.bit_count() for m in grown_total if m), default=0)
    if not fewest:
        return []
    masks = list(dict.fromkeys(m for m in grown_free if m))
    hints = [_hint(m, m.bit_count() == fewest) for m in masks]
    everything = (1 << count) - 1
    if everything not in masks and all(sum(r.free) >= r.request for r in wanted):
        hints.append(_hint(everything, count == fewest))
    return hints


def realistic_case(rng: random.Random, count: int, policy: str, closest: bool) -> Case:
    resources = random_resources(rng, count)
    masks = list(iterate_masks(range(count)))
    return _case(policy, count, resources, lambda wanted: full_hints(masks, wanted, count), closest)


def seeded_case(rng: random.Random, count: int, policy: str, closest: bool) -> Case:
    resources = random_resources(rng, count)
    distances = socket_distances(count)
    return _case(policy, count, resources, lambda wanted: seeded_hints(wanted, distances), closest)


def _case(policy: str, count: int, resources: dict[str, Resource],
          hints: Callable[[Sequence[Resource]], list[Hint] | None], closest: bool) -> Case:
    memory_hints = hints([resources["memory"], resources["hugepages-1Gi"]])
    if memory_hints is None:
        memory = None
    elif not memory_hints:
        memory = {}  # the memory manager reports "no mask fits" as no preference
    else:
        # ... and gives every requested resource the same masks.
        memory = {name: memory_hints for name in ("memory", "hugepages-1Gi") if resources[name].request}
    providers = ({"cpu": hints([resources["cpu"]])}, memory,
                 {"nvidia.com/gpu": hints([resources["nvidia.com/gpu"]])},
                 {"example.com/nic": hints([resources["example.com/nic"]])})
    distances = KUBELET_8_NODE_DISTANCES if count == 8 else socket_distances(count)
    options = {"prefer-closest-numa-nodes": "true" if closest else "false"}
    if count > 8:
        options["max-allowable-numa-nodes"] = str(count)
    return Case(policy, tuple(range(count)), providers, distances, options)


def _mask_sums(per_node: Sequence[int], nodes: int) -> list[int]:
    sums = [0] * (1 << nodes)
    for m in range(1, 1 << nodes):
        low = m & -m
        sums[m] = sums[m ^ low] + per_node[low.bit_length() - 1]
    return sums


def _grow(seed: int, per_node: Sequence[Sequence[int]], wanted: Sequence[Resource],
          distances: Sequence[Sequence[int]]) -> int:
    mask, have = 0, [0] * len(wanted)
    for node in sorted(range(len(distances)), key=lambda n: (distances[seed][n], n)):
        if all(h >= r.request for h, r in zip(have, wanted)):
            break
        mask |= 1 << node
        have = [h + values[node] for h, values in zip(have, per_node)]
    return mask if all(h >= r.request for h, r in zip(have, wanted)) else 0


def run(case: Case, merge: Callable[..., tuple[Hint, bool]]) -> tuple[tuple[Hint, bool], float]:
    start = time.perf_counter()
    answer = merge(case.policy, case.nodes, case.providers, distances=case.distances, options=case.options)
    return answer, time.perf_counter() - start


def timed(cases: Sequence[Case], merge: Callable[..., tuple[Hint, bool]],
          repeats: int) -> tuple[list[tuple[Hint, bool]], list[float], list[float]]:
    """Answers, each case's fastest run, and every run, in seconds.

    The fastest of ``repeats`` runs is what the case costs; the others add what the scheduler of a
    shared machine adds. The collector is paused while timing: collections triggered by the case
    generator's garbage are not the merge's cost.
    """
    answers, best, every = [], [], []
    gc.collect()
    gc.disable()
    try:
        for case in cases:
            runs = [run(case, merge) for _ in range(repeats)]
            answers.append(runs[0][0])
            best.append(min(t for _, t in runs))
            every.extend(t for _, t in runs)
    finally:
        gc.enable()
    return answers, best, every


def percentiles(seconds: Sequence[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds (nearest rank)."""
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1e3, p99 * 1e3


def bench(name: str, cases: Sequence[Case], repeats: int, baseline: Sequence[Case] = ()) -> bool:
    """Prints the engine's p50/p99 on ``cases`` and, on ``baseline`` cases, both merges' p50/p99 and
    the ratio of their medians; returns False if the two merges ever disagree."""
    _, best, every = timed(cases, merge_hints, repeats)
    sizes = [c.combinations() for c in cases]
    print(f"\n{name}: {len(cases)} cases, best of {repeats} runs each; combinations per case: "
          f"median {statistics.median(sizes):,.0f}, max {max(sizes):,}")
    _line("engine merge", best, every)
    if not baseline:
        return True
    fast_answers, fast_best, fast_every = timed(baseline, merge_hints, repeats)
    base_answers, base_best, base_every = timed(baseline, baseline_merge, 2)
    for i, (fast, base) in enumerate(zip(fast_answers, base_answers)):
        if fast != base:
            print(f"  MISMATCH on baseline case {i}: engine {fast}, baseline {base}")
    sizes = [c.combinations() for c in baseline]
    print(f"  on {len(baseline)} of these cases with at most {BASELINE_MAX_COMBINATIONS:,} combinations "
          f"(median {statistics.median(sizes):,.0f}); the baseline runs twice per case:")
    _line("engine merge", fast_best, fast_every)
    _line("baseline", base_best, base_every)
    ratio = percentiles(base_best)[0] / percentiles(fast_best)[0]
    print(f"  baseline / engine, ratio of the medians: {ratio:,.1f}x")
    return fast_answers == base_answers


def _line(label: str, best: Sequence[float], every: Sequence[float]) -> None:
    p50, p99 = percentiles(best)
    print(f"  {label:<13} p50 {p50:9.3f} ms   p99 {p99:9.3f} ms   (p99 of every run {percentiles(every)[1]:.3f} ms)")


def small_cases(make: Callable[[], Case], wanted: int, attempts: int) -> list[Case]:
    """Up to ``wanted`` cases the baseline can afford, drawn from the same generator."""
    found: list[Case] = []
    for _ in range(attempts):
        if len(found) == wanted:
            break
        case = make()
        if case.combinations() <= BASELINE_MAX_COMBINATIONS:
            found.append(case)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases, for a smoke run")
    args = parser.parse_args(argv)
    rng = random.Random(20240611)
    scale = 4 if args.quick else 1
    draws = itertools.count()

    def draw(make: Callable[..., Case], count: int) -> Case:
        i = next(draws)
        return make(rng, count, POLICIES[i % 3], i // 3 % 2 == 1)

    def cases(make: Callable[..., Case], count: int, number: int) -> list[Case]:
        return [draw(make, count) for _ in range(max(2, number // scale))]

    two = cases(realistic_case, 2, 200)
    ok = bench("2 NUMA nodes, 4 providers, every mask", two, 5, baseline=two)
    eight = cases(realistic_case, 8, 200)
    ok &= bench("8 NUMA nodes, 4 providers, every mask", eight, 5,
                baseline=small_cases(lambda: draw(realistic_case, 8), BASELINE_CASES, 3000))
    print("\n(no baseline from here: 16 nodes give lists of up to 65,535 hints, up to 65,535**5"
          " combinations; 64 nodes cannot even be listed, so their hints are seeded)")
    ok &= bench("16 NUMA nodes, 4 providers, every mask", cases(realistic_case, 16, 6), 2)
    ok &= bench("16 NUMA nodes, 4 providers, seeded", cases(seeded_case, 16, 200), 5)
    ok &= bench("64 NUMA nodes, 4 providers, seeded", cases(seeded_case, 64, 200), 5)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

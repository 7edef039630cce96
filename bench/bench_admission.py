"""Times one admission (``admit``) on a machine already half full, as the node agent does it.

Run from the repository root:  .venv/bin/python -m bench.bench_admission [--quick]

For each scenario the engine context is built once, then the machine is filled, pod by pod and
committing each admitted one, until about half of its allocatable CPUs are exclusive: a seeded mix
of Guaranteed pods (whole CPUs, memory, and where the machine has them hugepages-1Gi and GPUs;
some with a sidecar) and Burstable ones. Fresh pods drawn from the same mix are then admitted
against that snapshot, which is never changed: every sample is one ``admit(ctx, allocs, pod)``,
the decision and the allocations it would commit, timed with ``time.perf_counter_ns`` while the
collector is paused. A warm-up pass over the first pods comes first, so caches are as warm as in
a daemon that has admitted pods before.

Targets (p99 of one admission):
  1. 2 NUMA nodes / 128 CPUs, static CPU + Static memory, single-numa-node: 0.5 ms
  2. 8 NUMA nodes (amd-epyc-2s-nps4 with 1 GiB hugepages; CPU, memory, hugepages-1Gi, GPUs),
     best-effort and restricted: 2 ms
  3. 64 NUMA nodes / 1024 CPUs (numa64-1024), static CPU + Static memory, single-numa-node and
     best-effort: 20 ms

Each fresh pod is admitted REPEATS times. p50, p99 and max are over every run; "p99 best" keeps
each pod's fastest run, which filters out the scheduler preempting the process on a busy host
while keeping the spread between pods. The verdict uses "p99 best"; on a host with idle cores the
two agree. Exits with status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nri_numa.engine.admit import admit
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import GPU_RESOURCE, EngineContext
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.request import PodRequest
from nri_numa.topology.model import Topology
from nri_numa.topology.synthetic import MachineSpec, build_topology, preset_topology
from nri_numa.topology.synthetic.presets import PRESETS
from nri_numa.topology.synthetic.spec import GIB, MemorySpec

REPEATS = 5
WARM_UP = 20  # admissions before timing starts
FILL_SHARE = 0.5  # of the allocatable CPUs, held exclusively before timing
GUARANTEED_SHARE = 0.7
HUGEPAGE_1G_KIB = 1 << 20


@dataclass(frozen=True)
class PodMix:
    """What the pods of a scenario ask for; sizes are drawn uniformly up to these."""

    max_cpus: int
    gib_per_cpu: int
    max_hugepages_gib: int = 0  # 0: no pod asks for hugepages-1Gi
    max_gpus: int = 0  # 0: no pod asks for GPUs
    device_share: float = 0.3  # of the Guaranteed pods, how many ask for hugepages / GPUs


@dataclass(frozen=True)
class Scenario:
    name: str
    machine: str  # for the header
    topology: Topology
    config: Mapping[str, Any]  # KubeletConfiguration keys
    mix: PodMix
    target_ms: float
    pods: int  # fresh pods timed; each REPEATS times


@dataclass(frozen=True)
class Result:
    every_ns: tuple[int, ...]
    best_ns: tuple[int, ...]  # each pod's fastest run
    admitted: int
    refused: int


def _config(policy: str, reserved_cpus: str) -> dict[str, Any]:
    return {"topologyManagerPolicy": policy, "topologyManagerScope": "container",
            "cpuManagerPolicy": "static", "reservedSystemCPUs": reserved_cpus,
            "memoryManagerPolicy": "Static",
            "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}


def _epyc_with_1g_hugepages() -> Topology:
    # The preset as shipped has 2 MiB pages only; give every node 16 one-GiB pages instead.
    spec = PRESETS["amd-epyc-2s-nps4"].spec
    return build_topology(replace(spec, memory=MemorySpec(128 * GIB, hugepages={HUGEPAGE_1G_KIB: 16})))


def scenarios(scale: int) -> list[Scenario]:
    two = build_topology(MachineSpec(name="bench-2n-128", sockets=2, nodes_per_socket=1,
                                     cores_per_node=32, memory=MemorySpec(256 * GIB)))
    epyc = _epyc_with_1g_hugepages()
    numa64 = preset_topology("numa64-1024")
    two_mix = PodMix(max_cpus=16, gib_per_cpu=4)
    epyc_mix = PodMix(max_cpus=12, gib_per_cpu=4, max_hugepages_gib=4, max_gpus=2)
    numa64_mix = PodMix(max_cpus=16, gib_per_cpu=1)
    return [
        Scenario("1. 2 NUMA / 128 CPUs, single-numa-node", "2 sockets x 1 node x 32 cores x 2 "
                 "threads, 256 GiB per node", two, _config("single-numa-node", "0,64"), two_mix, 0.5,
                 600 // scale),
        Scenario("2a. 8 NUMA, 4 providers, best-effort", "amd-epyc-2s-nps4 (8 nodes x 16 cores x 2 "
                 "threads, 8 A100) with 16 x 1 GiB hugepages per node", epyc,
                 _config("best-effort", "0,128"), epyc_mix, 2.0, 300 // scale),
        Scenario("2b. 8 NUMA, 4 providers, restricted", "same machine as 2a", epyc,
                 _config("restricted", "0,128"), epyc_mix, 2.0, 300 // scale),
        Scenario("3a. 64 NUMA / 1024 CPUs, single-numa-node", "numa64-1024 (8 sockets x 8 nodes x 8 "
                 "cores x 2 threads, 32 GiB per node)", numa64, _config("single-numa-node", "0,512"),
                 numa64_mix, 20.0, 150 // scale),
        Scenario("3b. 64 NUMA / 1024 CPUs, best-effort", "same machine as 3a", numa64,
                 _config("best-effort", "0,512"), numa64_mix, 20.0, 150 // scale),
    ]


def draw_pod(rng: random.Random, mix: PodMix, name: str) -> PodRequest:
    """A Guaranteed pod (limits only, so requests equal them) or a Burstable one."""
    if rng.random() >= GUARANTEED_SHARE:
        main = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
        return _pod(name, [("main", main)])
    cpus = rng.randint(1, mix.max_cpus)
    limits = {"cpu": str(cpus), "memory": f"{cpus * mix.gib_per_cpu}Gi"}
    if mix.max_hugepages_gib and rng.random() < mix.device_share:
        limits["hugepages-1Gi"] = f"{rng.randint(1, mix.max_hugepages_gib)}Gi"
    if mix.max_gpus and rng.random() < mix.device_share:
        limits[GPU_RESOURCE] = str(rng.randint(1, mix.max_gpus))
    containers = [("main", {"limits": limits})]
    if rng.random() < 0.25:
        containers.append(("sidecar", {"limits": {"cpu": "250m", "memory": "256Mi"}}))
    return _pod(name, containers)


def _pod(name: str, containers: Sequence[tuple[str, dict[str, Any]]]) -> PodRequest:
    return pod_from_manifest({"metadata": {"name": name, "namespace": "bench"}, "spec": {
        "containers": [{"name": n, "resources": r} for n, r in containers]}})


def fill(ctx: EngineContext, rng: random.Random, mix: PodMix) -> tuple[Allocations, int]:
    """The machine with about FILL_SHARE of its allocatable CPUs held; and how many pods it has."""
    allocs = ctx.empty_allocations()
    goal = FILL_SHARE * len(ctx.topology.online_cpus - ctx.reserved_cpus)
    for i in range(20 * len(ctx.topology.online_cpus)):  # a bound: a full machine refuses all
        if len(allocs.exclusive_cpus()) >= goal:
            break
        result = admit(ctx, allocs, draw_pod(rng, mix, f"filler-{i}"))
        if result.decision.admitted:
            allocs = result.allocations
    ctx.check(allocs)
    return allocs, len(allocs.pods)


def time_admissions(ctx: EngineContext, allocs: Allocations, pods: Sequence[PodRequest]) -> Result:
    for pod in pods[:WARM_UP]:
        admit(ctx, allocs, pod)
    every: list[int] = []
    best: list[int] = []
    admitted = 0
    gc.collect()
    gc.disable()
    try:
        for pod in pods:
            runs = []
            for _ in range(REPEATS):
                start = time.perf_counter_ns()
                result = admit(ctx, allocs, pod)
                runs.append(time.perf_counter_ns() - start)
            every.extend(runs)
            best.append(min(runs))
            admitted += result.decision.admitted
    finally:
        gc.enable()
    return Result(tuple(every), tuple(best), admitted, len(pods) - admitted)


def percentile_ms(values_ns: Sequence[int], share: float) -> float:
    """Nearest-rank percentile, in milliseconds."""
    ordered = sorted(values_ns)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] / 1e6


def run_scenario(scenario: Scenario, seed: int) -> bool:
    rng = random.Random(seed)
    ctx = EngineContext.build(scenario.topology, config_from_mapping(scenario.config))
    allocs, filled = fill(ctx, rng, scenario.mix)
    pods = [draw_pod(rng, scenario.mix, f"fresh-{i}") for i in range(scenario.pods)]
    result = time_admissions(ctx, allocs, pods)
    _report(scenario, ctx, allocs, filled, result)
    return percentile_ms(result.best_ns, 0.99) <= scenario.target_ms


def _report(scenario: Scenario, ctx: EngineContext, allocs: Allocations, filled: int,
            result: Result) -> None:
    cfg = scenario.config
    allocatable = len(ctx.topology.online_cpus - ctx.reserved_cpus)
    every, best = result.every_ns, result.best_ns
    p99_best = percentile_ms(best, 0.99)
    verdict = "PASS" if p99_best <= scenario.target_ms else "FAIL"
    print(f"\n{scenario.name}")
    print(f"  machine: {scenario.machine}; {len(ctx.numa_ids)} NUMA nodes, "
          f"{len(ctx.topology.online_cpus)} CPUs, {len(ctx.topology.gpus)} GPUs")
    print(f"  config: {cfg['topologyManagerPolicy']}, scope {cfg['topologyManagerScope']}, cpu "
          f"{cfg['cpuManagerPolicy']} (reserved {cfg['reservedSystemCPUs']}), memory "
          f"{cfg['memoryManagerPolicy']}")
    print(f"  snapshot: {filled} pods, {len(allocs.exclusive_cpus())} of {allocatable} allocatable "
          f"CPUs exclusive")
    print(f"  samples: {len(best)} fresh pods x {REPEATS} runs = {len(every)} "
          f"({result.admitted} pods admitted, {result.refused} refused), after {WARM_UP} warm-up")
    print(f"  one admission: p50 {percentile_ms(every, 0.5):8.3f} ms   p99 "
          f"{percentile_ms(every, 0.99):8.3f} ms   max {max(every) / 1e6:8.3f} ms")
    print(f"  p99 best {p99_best:.3f} ms   target p99 <= {scenario.target_ms} ms   {verdict}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer pods, for a smoke run")
    parser.add_argument("--only", help="run only the scenarios whose name starts with this (e.g. 3)")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    ok = True
    for seed, scenario in enumerate(scenarios(5 if args.quick else 1)):
        if args.only and not scenario.name.startswith(args.only):
            continue
        ok &= run_scenario(scenario, seed)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

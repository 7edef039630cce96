"""Times GPU set selection (``gpu_select.select_gpus``) on 8 and 16 GPUs.

Run from the repository root:  .venv/bin/python -m bench.bench_devices [--quick]

Targets: p99 at most 5 ms with 8 available GPUs (exact search) and at most 50 ms with 16
(swap search). Every machine is asked for every size from 1 to all of its GPUs, with and without
a must-include GPU, several times; the timing covers the whole call, score matrix included.

Machines, built here from facts (no test code):
* 8 GPUs, DGX-1 Volta: the hybrid cube-mesh of direct NVLinks (1 or 2 per pair), PCIe switch
  pairs, two sockets: no two GPUs are interchangeable.
* 8 GPUs, DGX H100: 18 NVSwitch links each, 4 per NUMA node.
* 16 GPUs, HGX-2 style: 6 NVSwitch links each, PCIe pairs / quads / halves.
* 16 GPUs, random: pair scores drawn from NVLink counts 0-4 and every PCIe level (seeded).

Prints wall-clock and CPU time (``time.process_time``) per call. Targets are judged on CPU time:
on a shared or loaded machine the wall clock also counts the time the process waited for a CPU,
which is the scheduler's cost, not the search's (the table prints the load average). Exits with
status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

from nri_numa.engine.devices.gpu_select import select_gpus
from nri_numa.topology.parts import Gpu

TARGETS_MS = {8: 5.0, 16: 50.0}

DGX1_NVLINKS = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2,
                (2, 3): 2, (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2,
                (5, 7): 1, (6, 7): 2}


def _address(i: int) -> str:
    return f"0000:{0x10 + i:02x}:00.0"


def _machine(n: int, nodes: Callable[[int], int], level: Callable[[int, int], str],
             links: Callable[[int, int], int], nvswitch: int = 0) -> list[Gpu]:
    return [Gpu(index=i, uuid=f"GPU-{i}", pci_address=_address(i), numa_node=nodes(i),
                nvswitch_links=nvswitch,
                nvlink_peers={_address(j): links(i, j) for j in range(n)
                              if j != i and links(i, j)},
                pcie={_address(j): level(i, j) for j in range(n) if j != i})
            for i in range(n)]


def dgx1_volta() -> list[Gpu]:
    def level(i: int, j: int) -> str:
        if i // 2 == j // 2:
            return "single"
        return "hostbridge" if i // 4 == j // 4 else "system"

    return _machine(8, lambda i: i // 4, level,
                    lambda i, j: DGX1_NVLINKS.get((min(i, j), max(i, j)), 0))


def dgx_h100() -> list[Gpu]:
    return _machine(8, lambda i: i // 4, lambda i, j: "node" if i // 4 == j // 4 else "system",
                    lambda i, j: 0, nvswitch=18)


def hgx2() -> list[Gpu]:
    def level(i: int, j: int) -> str:
        if i // 2 == j // 2:
            return "single"
        if i // 4 == j // 4:
            return "multiple"
        return "hostbridge" if i // 8 == j // 8 else "system"

    return _machine(16, lambda i: i // 8, level, lambda i, j: 0, nvswitch=6)


def random16(seed: int) -> list[Gpu]:
    rng = random.Random(seed)
    levels = ["single", "multiple", "hostbridge", "node", "system"]
    pair_level = {(i, j): rng.choice(levels) for i in range(16) for j in range(i + 1, 16)}
    pair_links = {(i, j): rng.choice([0, 0, 1, 2, 4]) for i in range(16) for j in range(i + 1, 16)}
    return _machine(16, lambda i: i // 8, lambda i, j: pair_level[min(i, j), max(i, j)],
                    lambda i, j: pair_links[min(i, j), max(i, j)])


def time_machine(gpus: list[Gpu], repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds per select_gpus call, over every size, with and without a
    must-include GPU."""
    wall, cpu = [], []
    for size in range(1, len(gpus) + 1):
        for must in ((), (gpus[-1].pci_address,)):
            for _ in range(repeats):
                start, start_cpu = time.perf_counter(), time.process_time()
                select_gpus(gpus, size, must)
                wall.append((time.perf_counter() - start) * 1000)
                cpu.append((time.process_time() - start_cpu) * 1000)
    return wall, cpu


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else 10
    machines = [("DGX-1 Volta (cube mesh)", dgx1_volta()), ("DGX H100 (NVSwitch)", dgx_h100()),
                ("HGX-2 style (NVSwitch)", hgx2()),
                *[(f"random scores, seed {s}", random16(s)) for s in range(1 if args.quick else 3)]]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'machine':26} {'GPUs':>4} {'calls':>5} {'wall p50':>9} {'wall p99':>9} "
          f"{'CPU p50':>8} {'CPU p99':>8} {'target':>7}  (ms)")
    missed = False
    gc.disable()  # collector pauses are not the search's cost
    try:
        for name, gpus in machines:
            wall, cpu = time_machine(gpus, repeats)
            target = TARGETS_MS[len(gpus)]
            over = percentile(cpu, 0.99) > target
            missed |= over
            print(f"{name:26} {len(gpus):>4} {len(wall):>5} {statistics.median(wall):>9.2f} "
                  f"{percentile(wall, 0.99):>9.2f} {statistics.median(cpu):>8.2f} "
                  f"{percentile(cpu, 0.99):>8.2f} {target:>7.1f}" + ("  MISSED" if over else ""))
    finally:
        gc.enable()
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Discovery time on the 1024-CPU synthetic machine (preset numa64-1024).

Writes the preset's sysfs tree once, then times ``discover(root)`` five times and prints the
median, min and max against the target. The tree goes to tmpfs (/dev/shm) where there is one:
the real /sys lives in memory, so a disk-backed folder would time the disk instead. Exit status
0 on PASS, 1 on FAIL or when the tree does not read back as the machine that was written.

    python bench/bench_discovery.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run from a checkout without installing: the package sits next to bench/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nri_numa.topology import discover  # noqa: E402
from nri_numa.topology.synthetic import preset_topology, write_tree  # noqa: E402

PRESET = "numa64-1024"
RUNS = 5
TARGET_MS = 300.0


def scratch_parent() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def main() -> int:
    topology = preset_topology(PRESET)
    parent = scratch_parent()
    with tempfile.TemporaryDirectory(prefix="nri-numa-bench-", dir=parent) as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        write_tree(topology, root)
        write_s = time.perf_counter() - started
        times_ms = []
        found = None
        for _ in range(RUNS):
            started = time.perf_counter()
            found = discover(root)
            times_ms.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times_ms)
    passed = median <= TARGET_MS
    print(f"discover() on {PRESET}: {len(topology.cpus)} CPUs, {len(topology.numa_nodes)} NUMA nodes "
          f"(tree written under {parent or tempfile.gettempdir()} in {write_s:.1f} s)")
    print(f"  median {median:.1f} ms, min {min(times_ms):.1f} ms, max {max(times_ms):.1f} ms "
          f"over {RUNS} runs; target <= {TARGET_MS:.0f} ms: {'PASS' if passed else 'FAIL'}")
    if found is None or found.warnings or found.without_warnings() != topology:
        print("  but the tree did not read back as the machine written: "
              f"{list(found.warnings) if found else 'no result'}")
        return 1
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

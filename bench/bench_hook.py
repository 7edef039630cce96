"""Wall time of one OCI hook process, as a runtime sees it: fork, exec, run, exit.

Run from the repository root:
    .venv/bin/python -m bench.bench_hook [--runs N] [--preset NAME] [--containers N]

Six series, interleaved round by round so that the load of the moment weighs on all alike:

* ``python -c pass`` and ``python -I -S -c pass``: the interpreter's own start, with and without
  ``site`` (the floor of any Python client), the venv's interpreter by its path (a ``python3``
  on PATH may be a shim: pyenv's costs 100 ms);
* the C client (``nri-numa-hook-client``, built here by ``python -m nri_numa.hook.c_client``;
  left out, saying so, where no C compiler exists) with ``nri-numa hook-daemon`` running;
* the Python client (``python -I -S nri_numa/hook/client.py``, what the shipped hooks.d files
  and runc example run) with the same daemon running;
* the installed ``nri-numa hook`` with the same daemon running (argparse, then the same wire);
* the Python client with no daemon: it execs ``nri-numa hook``, which runs the stage in process.

The clients find the daemon as the shipped hooks make them, by ``NRI_NUMA_HOOK_SOCKET``.

Each hook run is ``createRuntime`` of a new container asking for one exclusive CPU, then its
``poststop``, on a fake host (tests/integration/hook/fake_host.py: a cgroup v1 tree and a /proc on
tmpfs), so the figure is the hook's own cost, not runc's, and the bench needs neither root nor a
runtime. Each ledger already holds ``--containers`` placed containers (half exclusive, half
shared, the shared ones moved by every run) on a synthetic preset given with ``--topology``, as
the hook's installation would. Targets (issue 24): createRuntime p50 with the daemon ≤ 15 ms
through the C client (left out where it could not be built) and ≤ 30 ms through the Python
client; ≤ 300 ms in process, the fallback without a daemon.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nri_numa.hook import c_client
from nri_numa.hook.client import SOCKET_ENV, SOCKET_NAME
from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle

TARGET_C_CLIENT_MS = 15.0
TARGET_PYTHON_CLIENT_MS = 30.0
TARGET_IN_PROCESS_MS = 300.0
REPO = Path(__file__).resolve().parents[1]
PYTHON_CLIENT = REPO / "nri_numa" / "hook" / "client.py"


@dataclass(frozen=True)
class Run:
    wall_ms: float
    cpu_ms: float  # the child's user + system time


def timed(command: list[str], stdin: bytes = b"", env: dict[str, str] | None = None) -> Run:
    # Runs are sequential, so the children's rusage grows by exactly this child's.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, input=stdin, capture_output=True, cwd=REPO, env=env)
    wall = (time.perf_counter() - started) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} … failed: {done.stderr.decode().strip()}")
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
    return Run(wall, cpu)


@dataclass
class Bench:
    """One fake host and state folder; its hook runs place and release containers there."""

    host: FakeHost
    common: list[str]  # the hook's options for this folder
    state: Path
    next_pid: int

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, SOCKET_ENV: str(self.state / SOCKET_NAME)}

    def cycle(self, command: list[str]) -> tuple[Run, Run]:
        """createRuntime of a new container with one exclusive CPU, then its poststop."""
        pid = self.next_pid
        self.next_pid += 1
        cid = f"c{pid}"
        bundle = write_bundle(self.host.base, cid, 1)
        self.host.start(pid, f"/pods/{cid}")
        create = timed([*command, "createRuntime", *self.common], oci_state(cid, pid, bundle),
                       self.env)
        self.host.stop(pid)
        stop = timed([*command, "poststop", *self.common], oci_state(cid, None, self.host.base),
                     self.env)
        return create, stop

    def place_background(self, command: list[str], count: int) -> None:
        for i in range(count):
            pid = self.next_pid + 50_000 + i
            cid = f"bg{pid}"
            bundle = write_bundle(self.host.base, cid, 1 if i % 2 == 0 else 0)
            self.host.start(pid, f"/pods/{cid}")
            timed([*command, "createRuntime", *self.common], oci_state(cid, pid, bundle),
                  self.env)


def make_bench(base: Path, topology, config: Path, topo_file: Path, first_pid: int) -> Bench:
    host = FakeHost(base / "host", 1, topology.online_cpus)
    state = base / "state"
    common = ["--state-dir", str(state), "--config", str(config), "--topology", str(topo_file),
              "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc),
              "--timeout", "30"]
    return Bench(host, common, state, first_pid)


def start_daemon(hook: Path, served: list[str], state: Path) -> subprocess.Popen:
    """``nri-numa hook-daemon`` on the bench's state folder, once its socket is there."""
    daemon = subprocess.Popen([str(hook), "hook-daemon", *served], cwd=REPO)
    deadline = time.monotonic() + 30
    while not (state / "hook.sock").exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            raise SystemExit("the hook daemon did not start")
        time.sleep(0.05)
    return daemon


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.9 * (len(ordered) - 1))]


def row(name: str, runs: list[Run], floor: float) -> str:
    walls = [r.wall_ms for r in runs]
    p50 = statistics.median(walls)
    cpu = statistics.median(r.cpu_ms for r in runs)
    return (f"| {name} | {p50:.1f} | {p90(walls):.1f} | {cpu:.1f} | {p50 / floor:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="rounds, at least 30 (default 40)")
    parser.add_argument("--preset", default="dgx-h100", help="the machine (default dgx-h100)")
    parser.add_argument("--containers", type=int, default=40,
                        help="containers already placed in each ledger (default 40)")
    args = parser.parse_args()
    if args.runs < 30:
        parser.error("--runs must be at least 30")
    hook = Path(sys.executable).with_name("nri-numa")
    if not os.access(hook, os.X_OK):
        print(f"{hook} is missing: install the package (scripts/setup)", file=sys.stderr)
        return 1
    python = sys.executable
    client = [python, "-I", "-S", str(PYTHON_CLIENT)]
    old = [str(hook), "hook"]
    topology = preset_topology(args.preset)
    scratch = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="nri-numa-bench-hook-", dir=scratch) as tmp:
        base = Path(tmp)
        config = base / "config.json"
        config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                                      "topologyManagerPolicy": "single-numa-node"}))
        topo_file = topology_file(base, topology)
        compiled = None
        if c_client.find_compiler() is not None:
            compiled = [str(c_client.build(base / c_client.BINARY_NAME, python))]
        served = make_bench(base / "served", topology, config, topo_file, 10_000)
        alone = make_bench(base / "alone", topology, config, topo_file, 200_000)
        daemon = start_daemon(hook, served.common[:6], served.state)
        try:
            served.place_background(client, args.containers)
            alone.place_background(client, args.containers)
            series: dict[str, Callable[[], tuple[Run, Run] | Run]] = {
                "python -c pass": lambda: timed([python, "-c", "pass"]),
                "python -I -S -c pass": lambda: timed([python, "-I", "-S", "-c", "pass"]),
                "C client, daemon": lambda: served.cycle(compiled),
                "Python client, daemon": lambda: served.cycle(client),
                "nri-numa hook, daemon": lambda: served.cycle(old),
                "Python client, no daemon (in process)": lambda: alone.cycle(client),
            }
            if compiled is None:
                del series["C client, daemon"]
                print("no C compiler: the C client's series is left out", file=sys.stderr)
            results: dict[str, list] = {name: [] for name in series}
            names = list(series)
            for i in range(args.runs):
                for name in names[i % len(names):] + names[:i % len(names)]:  # rotate the order
                    results[name].append(series[name]())
        finally:
            daemon.terminate()
            daemon.wait(10)
    load_after = os.getloadavg()
    floor = statistics.median(r.wall_ms for r in results["python -I -S -c pass"])
    print(f"nri-numa hook process wall time on {args.preset} ({len(topology.cpus)} CPUs), "
          f"{args.containers} containers already placed in each ledger, fake cgroup v1 tree on "
          f"{scratch or tempfile.gettempdir()}, CPUs here: {os.cpu_count()}, {args.runs} rounds "
          "interleaved")
    print("| series | p50 ms | p90 ms | CPU p50 ms | p50 / `-I -S -c pass` |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        if isinstance(runs[0], Run):
            print(row(name, runs, floor))
            continue
        print(row(f"{name}: createRuntime", [c for c, _ in runs], floor))
        print(row(f"{name}: poststop", [s for _, s in runs], floor))
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)} (wall times grow with it; the CPU times "
          "much less)")
    verdicts = []
    targets = {"C client, daemon": TARGET_C_CLIENT_MS,
               "Python client, daemon": TARGET_PYTHON_CLIENT_MS,
               "Python client, no daemon (in process)": TARGET_IN_PROCESS_MS}
    for name, target in targets.items():
        if name not in results:  # no C compiler
            continue
        p50 = statistics.median(c.wall_ms for c, _ in results[name])
        passed = p50 <= target
        verdicts.append(passed)
        print(f"target: {name}: createRuntime p50 {p50:.1f} <= {target:.0f} ms: "
              f"{'PASS' if passed else 'FAIL'}")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())

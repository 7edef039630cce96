"""What the NRI plugin adds to container start-up.

Run from the repository root:
    .venv/bin/python -m bench.bench_nri_plugin [--part create|pods|all] [--calls N]
        [--running N[,N...]] [--rounds N] [--preset NAME] [--pods N]

(a) ``create``: the latency of CreateContainer as containerd sees it: from the request's frames
    written to the reply read, by a runtime peer on one thread (bench/wire_runtime.py) in this
    process, while the plugin runs as `nri-numa run` in a process of its own, connected over a
    unix socket. The plugin places the container, logs it to a file, writes its checkpoint and
    answers with the adjustment and the updates of the shared containers. The machine is a
    synthetic 2-socket, 5120-CPU node by default (``--preset``: big-5120, built here so that 2000
    containers fit, or any preset of nri_numa.topology.synthetic) under the packaging example's
    configuration, with ``--running`` containers placed (a seeded mix of Guaranteed, Burstable
    and BestEffort pods, Kubernetes-sized messages); ``--running`` takes a list of sizes
    (default 40,400,2000) so that growth with the ledger's size shows in one run. Each timed creation is followed, untimed, by the stop and
    removal of the oldest container, so the count stays put. Each round measures, on the same
    requests: the baseline, a plugin process whose handlers answer at once with nothing (the
    wire, framing and protobuf on both sides: bench/empty_plugin.py); `nri-numa run` with its
    state folder on disk (``--disk-dir``) and on tmpfs (``--tmpfs-dir``); and the handler alone,
    called directly in this process (no wire), with its state write (the event's journal record,
    now and then a new snapshot) timed on its own and the CreateContainer handler's CPU time
    (this thread's). For the plugin processes it also
    prints their CPU time per cycle (one creation, one stop, one removal, from /proc) and their
    resident memory idle (connected, nothing placed) and with the size's containers placed.
    Targets, on the median of the rounds of `nri-numa run`: p50 <= 2 ms, p99 <= 10 ms.
(b) ``pods``: pod start time (RunPodSandbox -> CreateContainer -> StartContainer, through CRI)
    on private containerd 1.7.24 and 2.1.9 (tests/e2e harness; root), with the plugin
    (`nri-numa run`, a real process) connected and without it, in blocks of five pods ordered
    with, without, without, with ... so that drift cancels; the first pod after each switch is
    not timed (the agent is a new process at each connect: its start-up is not a pod's). Every
    pod is Guaranteed with one CPU and is removed before the next. Target: median with the
    plugin <= +5 % of without.

Prints medians, p99 and ratios with PASS/FAIL; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message

from bench.wire_runtime import WireRuntime
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.daemon import plugin_store
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.persistence import StateFile
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.topology.model import Topology
from nri_numa.topology.synthetic import preset_topology
from nri_numa.topology.synthetic.build import build_topology
from nri_numa.topology.synthetic.spec import DistanceSpec, MachineSpec, MemorySpec
from tests import nri_messages as msg

REPO = Path(__file__).resolve().parents[1]
P50_TARGET_MS, P99_TARGET_MS = 2.0, 10.0
POD_START_TARGET = 0.05  # +5 %
CONFIG = {  # packaging/nri-numa.conf.example, without the pod-override switch
    "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "container",
    "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true"},
    "cpuManagerPolicy": "static", "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
    "reservedSystemCPUs": "0,1", "memoryManagerPolicy": "Static",
    "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}],
}
GIB = 1 << 30
CONNECT_TIMEOUT = 60.0  # a plugin process starting on a loaded machine
BIG_MACHINE = "big-5120"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def bench_topology(name: str) -> Topology:
    """The machine: big-5120 (2 sockets of 1280 two-thread cores, 2 TiB a node: room for 2000
    of the mix's containers), or a preset by name."""
    if name == BIG_MACHINE:
        return build_topology(MachineSpec(
            name=BIG_MACHINE, sockets=2, nodes_per_socket=1, cores_per_node=1280,
            distances=DistanceSpec(remote=21), memory=MemorySpec(2048 * GIB)))
    return preset_topology(name)


def process_cpu_seconds(pid: int) -> float:
    """User + system time of process ``pid`` so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- (a) CreateContainer through the wire ------------------------------------------------------


def kubernetes_container(rng: random.Random, i: int) -> tuple[api.PodSandbox, api.Container]:
    """Pod ``i`` with one container, sized and shaped like a kubelet's (labels, env, mounts)."""
    qos = rng.choices(["guaranteed", "burstable", "besteffort"], weights=[35, 40, 25])[0]
    uid = f"{i:08x}-6d2b-4a53-9d53-3b8c1f2e9a71"
    sandbox = msg.pod(f"web-{i}", qos, uid=uid)
    sandbox.id = f"{i:064x}"
    if qos == "guaranteed":
        cpus = rng.choice([2, 2, 4, 6])  # whole cores: full-pcpus-only on 2 threads a core
        c = msg.guaranteed(sandbox, "app", cpus, memory=rng.choice([1, 2, 4]) * GIB,
                           cid=f"{i:063x}c", state=api.CONTAINER_CREATED)
    else:
        millis = rng.choice([100, 250, 500, 1000]) if qos == "burstable" else 0
        c = msg.container(sandbox, "app", cpu=millis, memory=GIB if millis else 0,
                          cid=f"{i:063x}c", state=api.CONTAINER_CREATED)
    c.args.extend(["/app/server", "--port=8080", "--workers=4"])
    c.env.extend(f"SERVICE_{k}_PORT=tcp://10.96.{k}.{i % 200}:8080" for k in range(30))
    for k in range(6):
        c.mounts.add(destination=f"/var/run/secrets/vol{k}", type="bind",
                     source=f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~secret/vol{k}",
                     options=["rbind", "rprivate", "ro"])
    c.annotations.update({"io.kubernetes.container.hash": f"{i:08x}",
                          "io.kubernetes.container.restartCount": "0"})
    return sandbox, c


Call = Callable[[str, Message, type[Message]], tuple[Message, float]]
"""One call to the plugin: method, request, reply type -> reply, seconds it took."""


def over_the_wire(runtime: WireRuntime) -> Call:
    def call(method: str, request: Message, reply_type: type[Message]) -> tuple[Message, float]:
        payload, elapsed = runtime.call(method, request.SerializeToString())
        return reply_type.FromString(payload), elapsed
    return call


def in_process(plugin: NumaPlugin) -> Call:
    """The handlers called directly: no wire, no thread."""
    handlers: dict[str, Callable[[Message], Message | None]] = {
        "CreateContainer": plugin.create_container, "StopContainer": plugin.stop_container,
        "StateChange": plugin.state_change}

    def call(method: str, request: Message, reply_type: type[Message]) -> tuple[Message, float]:
        began = time.perf_counter()
        reply = handlers[method](request)
        return reply or reply_type(), time.perf_counter() - began
    return call


def drive(call: Call, args: argparse.Namespace, *, collector: bool = False,
          on_placed: Callable[[], None] | None = None) -> tuple[list[float], int]:
    """``--running`` containers created, then ``--calls`` timed creations, each followed by the
    removal of the oldest container: the creations' times in ms and how many got a cpuset.
    ``on_placed`` runs once the ``--running`` containers are in, before the timed calls.
    Python's collector is off in this process while timing, unless it is the plugin's
    (``collector``): the runtime's side must not add its own pauses."""
    rng = random.Random(args.seed)
    running: deque[tuple[api.PodSandbox, api.Container]] = deque()
    for i in range(args.running):
        running.append(kubernetes_container(rng, i))
        call("CreateContainer", msg.create(*running[-1]), api.CreateContainerResponse)
    if on_placed is not None:
        on_placed()
    samples, placed = [], 0
    if not collector:
        gc.disable()
    try:
        for i in range(args.running, args.running + args.calls):
            sandbox, c = kubernetes_container(rng, i)
            reply, elapsed = call("CreateContainer", msg.create(sandbox, c),
                                  api.CreateContainerResponse)
            samples.append(elapsed * 1000)
            placed += bool(reply.adjust.linux.resources.cpu.cpus)
            running.append((sandbox, c))
            old_sandbox, old = running.popleft()
            call("StopContainer", api.StopContainerRequest(pod=old_sandbox, container=old),
                 api.StopContainerResponse)
            call("StateChange", msg.event(api.REMOVE_CONTAINER, old_sandbox, old), api.Empty)
    finally:
        gc.enable()
    return samples, placed


@dataclass(frozen=True)
class Figures:
    p50: float
    p99: float
    max: float
    write_p50: float | None = None  # the checkpoint write alone, where it could be timed
    write_p99: float | None = None
    cpu_ms: float | None = None  # handler: CPU of one creation (p50); process: of one cycle
    rss_idle_mb: float | None = None  # the plugin process, connected, nothing placed
    rss_mb: float | None = None  # the plugin process with the size's containers placed

    @classmethod
    def of(cls, samples: list[float], writes: list[float] | None = None, *,
           cpu_ms: float | None = None, rss_idle_mb: float | None = None,
           rss_mb: float | None = None) -> Figures:
        write = (statistics.median(writes), percentile(writes, 0.99)) if writes else (None, None)
        return cls(statistics.median(samples), percentile(samples, 0.99), max(samples),
                   *write, cpu_ms, rss_idle_mb, rss_mb)

    def line(self) -> str:
        text = f"p50 {self.p50:5.2f} ms  p99 {self.p99:5.2f} ms  max {self.max:6.2f} ms"
        if self.cpu_ms is not None:
            text += f"  CPU {self.cpu_ms:5.2f} ms"
        if self.rss_mb is not None:
            text += f"  RSS idle {self.rss_idle_mb:5.1f} MB, placed {self.rss_mb:5.1f} MB"
        if self.write_p50 is not None:
            text += (f"  (checkpoint write p50 {self.write_p50:.2f} ms  "
                     f"p99 {self.write_p99:.2f} ms)")
        return text


def plugin_process(kind: str, folder: Path, sock: Path, args: argparse.Namespace) -> list[str]:
    """The command line of the plugin process: the baseline, or `nri-numa run` as deployed."""
    if kind == "empty":
        return [sys.executable, "-m", "bench.empty_plugin", str(sock)]
    topology, config = folder / "topology.json", folder / "config.json"
    topology.write_text(bench_topology(args.preset).to_json())
    config.write_text(json.dumps(CONFIG))
    return [sys.executable, "-m", "nri_numa", "run", "--nri-socket", str(sock),
            "--config", str(config), "--topology", str(topology),
            "--state-dir", str(folder / "state"), "--log-file", str(folder / "plugin.log")]


def wait_or_kill(child: subprocess.Popen) -> None:
    """Wait for a child sent SIGTERM; SIGKILL it once 10 s pass without an exit."""
    try:
        child.wait(10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def measure_process(kind: str, folder: Path, args: argparse.Namespace) -> Figures:
    """CreateContainer through the wire to a plugin process of its own."""
    runtime = WireRuntime(folder / "nri.sock")
    with open(folder / "process.out", "wb") as out:
        child = subprocess.Popen(plugin_process(kind, folder, runtime.path, args), cwd=REPO,
                                 stdout=out, stderr=subprocess.STDOUT)
    probes: dict[str, float] = {}

    def before_timing() -> None:
        probes["rss"] = process_rss_mb(child.pid)
        probes["cpu"] = process_cpu_seconds(child.pid)
    try:
        runtime.accept(CONNECT_TIMEOUT)
        runtime.handshake()
        rss_idle = process_rss_mb(child.pid)
        samples, placed = drive(over_the_wire(runtime), args, on_placed=before_timing)
        cycle_cpu_ms = (process_cpu_seconds(child.pid) - probes["cpu"]) * 1000 / len(samples)
    except Exception:
        print((folder / "process.out").read_text()[-2000:], file=sys.stderr)
        raise
    finally:
        child.terminate()
        runtime.close()
        wait_or_kill(child)
    if kind != "empty" and placed != len(samples):
        raise RuntimeError(f"nri-numa gave a cpuset to {placed} of {len(samples)} containers")
    return Figures.of(samples, cpu_ms=cycle_cpu_ms, rss_idle_mb=rss_idle, rss_mb=probes["rss"])


def measure_handler(folder: Path, args: argparse.Namespace) -> Figures:
    """The handlers called in this process, with the same store, log and requests."""
    handler = logging.FileHandler(folder / "plugin.log")  # the daemon logs each decision
    logging.getLogger().addHandler(handler)
    try:
        topology = bench_topology(args.preset)
        store = plugin_store(folder / "state", topology)  # as `nri-numa run` makes it
        plugin = NumaPlugin(topology, config_from_mapping(CONFIG), store)
        # The state's write: the event's journal record, or now and then a new snapshot.
        writes = timed_saves(plugin._state_file)  # noqa: SLF001 - timed where it happens
        cpu = timed_creations(plugin)
        samples, _ = drive(in_process(plugin), args, collector=True)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    return Figures.of(samples, writes[args.running:],
                      cpu_ms=statistics.median(cpu[args.running:]))


def timed_creations(plugin: NumaPlugin) -> list[float]:
    """Wraps the plugin's CreateContainer handler to collect its CPU time (ms, this thread's:
    the wall time of a loaded machine's other work is not the handler's)."""
    samples: list[float] = []
    create = plugin.create_container

    def timed(request: Message) -> Message | None:
        began = time.thread_time()
        reply = create(request)
        samples.append((time.thread_time() - began) * 1000)
        return reply

    plugin.create_container = timed  # type: ignore[method-assign]
    return samples


def timed_saves(store: StateFile) -> list[float]:
    """Wraps the plugin's state save to collect how long each checkpoint write takes (ms)."""
    samples: list[float] = []
    save = store.save

    def timed(payload: object) -> None:
        began = time.perf_counter()
        save(payload)
        samples.append((time.perf_counter() - began) * 1000)

    store.save = timed  # type: ignore[method-assign]
    return samples


def bench_create(args: argparse.Namespace) -> bool:
    """Each size of ``--running`` in turn (the same requests for all: one seed)."""
    ok = True
    for size in args.running:
        ok &= bench_create_size(argparse.Namespace(**{**vars(args), "running": size}))
    return ok


def bench_create_size(args: argparse.Namespace) -> bool:
    """Rounds of baseline, disk, tmpfs and handler alone: the host's load drifts, and all see
    the same drift. The verdict is on the median of the rounds' figures."""
    disk, tmpfs = Path(args.disk_dir), Path(args.tmpfs_dir)
    variants: list[tuple[str, Path, Callable[[Path], Figures]]] = [
        ("baseline: empty plugin process", tmpfs, lambda f: measure_process("empty", f, args)),
        (f"nri-numa run, state on disk ({disk})", disk,
         lambda f: measure_process("nri-numa", f, args)),
        (f"nri-numa run, state on tmpfs ({tmpfs})", tmpfs,
         lambda f: measure_process("nri-numa", f, args)),
        ("handler alone, in process, tmpfs", tmpfs, lambda f: measure_handler(f, args)),
    ]
    print(f"CreateContainer, request written -> reply read, {args.preset}, {args.running} "
          f"containers running, {args.calls} calls a round, {args.rounds} rounds:")
    runs: dict[str, list[Figures]] = {label: [] for label, _, _ in variants}
    for n in range(args.rounds):
        for label, base, measure in variants:
            with tempfile.TemporaryDirectory(prefix="nri-bench-", dir=base) as folder:
                runs[label].append(measure(Path(folder)))
            print(f"  round {n + 1}  {label:<42} {runs[label][-1].line()}", flush=True)
    ok = True
    for label, done in runs.items():
        p50 = statistics.median(r.p50 for r in done)
        p99 = statistics.median(r.p99 for r in done)
        extra = ""
        if done[0].cpu_ms is not None:
            extra += f"  CPU {statistics.median(r.cpu_ms for r in done):5.2f} ms"
        if done[0].rss_mb is not None:
            extra += (f"  RSS idle {statistics.median(r.rss_idle_mb for r in done):5.1f} MB,"
                      f" placed {statistics.median(r.rss_mb for r in done):5.1f} MB")
        verdict = ""
        if label.startswith("nri-numa run"):
            passed = p50 <= P50_TARGET_MS and p99 <= P99_TARGET_MS
            ok &= passed
            verdict = (f"  targets p50 <= {P50_TARGET_MS:g} ms, p99 <= {P99_TARGET_MS:g} ms: "
                       f"{'PASS' if passed else 'FAIL'}")
        print(f"median of the rounds  {label:<42} p50 {p50:5.2f} ms  p99 {p99:5.2f} ms{extra}"
              f"{verdict}")
    return ok


# --- (b) pod start on real containerd -----------------------------------------------------


def bench_pods(args: argparse.Namespace) -> bool:
    from bench.pod_start import measure_pod_starts  # needs root and the e2e runtimes

    ok = True
    for version, with_plugin, without in measure_pod_starts(args.pods, args.block):
        med_with, med_without = statistics.median(with_plugin), statistics.median(without)
        ratio = med_with / med_without - 1
        low, high = median_ratio_interval(with_plugin, without)
        # A shared 2-CPU VM moves one pod-start median by several per cent: the verdict is
        # taken on the 95 % interval of the ratio, and says so when the noise is wider than
        # the target instead of calling a coin toss.
        if high <= POD_START_TARGET:
            verdict = "PASS"
        elif low > POD_START_TARGET:
            verdict = "FAIL"
        else:
            verdict = "INCONCLUSIVE (noise wider than the target: more --pods, a quieter machine)"
        ok &= verdict != "FAIL"
        print(f"pod start on containerd {version} ({len(with_plugin)} pods each way): with the "
              f"plugin median {med_with:.1f} ms p99 {percentile(with_plugin, 0.99):.1f} ms; "
              f"without median {med_without:.1f} ms p99 {percentile(without, 0.99):.1f} ms; "
              f"median ratio {ratio:+.1%} (95 % interval {low:+.1%} to {high:+.1%})  "
              f"target <= +{POD_START_TARGET:.0%}: {verdict}")
    return ok


def median_ratio_interval(a: list[float], b: list[float], resamples: int = 2000,
                          seed: int = 0) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of median(a)/median(b) - 1 over bootstrap resamples
    of each side (seeded: the same samples give the same interval)."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(a, k=len(a)))
                    / statistics.median(rng.choices(b, k=len(b))) - 1
                    for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def sizes(text: str) -> tuple[int, ...]:
    """``40,400,2000`` -> (40, 400, 2000); argparse turns the ValueError into one line."""
    counts = tuple(int(part) for part in text.split(","))
    if not counts or any(n < 0 for n in counts):
        raise ValueError(text)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("create", "pods", "all"), default="all")
    parser.add_argument("--calls", type=int, default=600, help="timed calls a round (>= 500)")
    parser.add_argument("--running", type=sizes, default=(40, 400, 2000),
                        help="containers placed while timing, one size or several: 40,400,2000")
    parser.add_argument("--rounds", type=int, default=3, help="disk and tmpfs runs, alternated")
    parser.add_argument("--preset", default=BIG_MACHINE,
                        help=f"synthetic machine: {BIG_MACHINE} (default) or a preset's name")
    parser.add_argument("--disk-dir", default="/var/tmp", help="a folder on disk")
    parser.add_argument("--tmpfs-dir", default="/dev/shm", help="a folder on tmpfs")
    parser.add_argument("--pods", type=int, default=20, help="timed pods each way and version")
    parser.add_argument("--block", type=int, default=5, help="pods in a row with one setting")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.calls < 500:
        parser.error("--calls must be at least 500 for a meaningful p99")
    logging.getLogger().setLevel(logging.INFO)
    runs: list[Callable[[], bool]] = []
    if args.part in ("create", "all"):
        runs.append(lambda: bench_create(args))
    if args.part in ("pods", "all"):
        runs.append(lambda: bench_pods(args))
    results = [run() for run in runs]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

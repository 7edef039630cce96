"""What the NRI plugin adds to container start-up.

Run from the repository root:
    .venv/bin/python -m bench.bench_nri_plugin [--part create|pods|all] [--calls N]
        [--running N] [--rounds N] [--preset NAME] [--pods N]

(a) ``create``: the latency of CreateContainer as the runtime sees it, through the real wire
    layer: the tests' fake runtime (its own framing code) calls the real plugin handlers
    (``NumaPlugin``) served by ``NriSession`` over a unix socket bound in a folder. The plugin
    places the container, logs it to a file, writes its checkpoint as `nri-numa run` does and
    answers with the adjustment and the updates of the shared containers. The machine is a synthetic 2-socket, 96-CPU node (``--preset``)
    under the packaging example's configuration, with ``--running`` containers placed (a seeded
    mix of Guaranteed, Burstable and BestEffort pods, Kubernetes-sized messages). Each timed
    creation is followed, untimed, by the stop and removal of the oldest container, so the count
    stays put. Rounds alternate the state folder on disk (``--disk-dir``) and on tmpfs.
    Targets: p50 <= 2 ms, p99 <= 10 ms, on the median of the rounds.
(b) ``pods``: pod start time (RunPodSandbox -> CreateContainer -> StartContainer, through CRI)
    on private containerd 1.7.24 and 2.1.9 (tests/e2e harness; root), with the plugin
    (`nri-numa run`, a real process) connected and without it, in blocks of five pods ordered
    with, without, without, with ... so that drift cancels. Every pod is Guaranteed with one CPU
    and is removed before the next. Target: median with the plugin <= +5 % of without.

Prints medians, p99 and ratios with PASS/FAIL; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import logging
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nri_numa.engine.config import config_from_mapping
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import NriSession
from nri_numa.nri.daemon import plugin_store
from nri_numa.state.checkpoint import CheckpointStore
from nri_numa.topology.synthetic import preset_topology
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FakeRuntime

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


class WiredPlugin:
    """The plugin served by NriSession on one end of a unix socket, the fake runtime on the
    other, registered, configured and synchronized."""

    def __init__(self, folder: Path, state_dir: Path, preset: str) -> None:
        topology = preset_topology(preset)
        self.store = plugin_store(state_dir, topology)  # as `nri-numa run` makes it
        self.plugin = NumaPlugin(topology, config_from_mapping(CONFIG), self.store)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(folder / "nri.sock"))
        listener.listen(1)
        self.session = NriSession.connect(str(folder / "nri.sock"))
        self.runner = threading.Thread(target=self.session.run, args=(self.plugin, "bench", "90"),
                                       name="bench-session", daemon=True)
        self.runner.start()
        conn, _ = listener.accept()
        listener.close()
        self.runtime = FakeRuntime(conn).start()
        if not self.runtime.registered.wait(5):
            raise RuntimeError("the plugin did not register")
        self.runtime.configure()
        self.runtime.synchronize()

    def create(self, sandbox: api.PodSandbox, c: api.Container) -> api.CreateContainerResponse:
        return self.runtime.call("CreateContainer", msg.create(sandbox, c),
                                 api.CreateContainerResponse)

    def remove(self, sandbox: api.PodSandbox, c: api.Container) -> None:
        self.runtime.call("StopContainer", api.StopContainerRequest(pod=sandbox, container=c),
                          api.StopContainerResponse)
        self.runtime.call("StateChange", msg.event(api.REMOVE_CONTAINER, sandbox, c), api.Empty)

    def close(self) -> None:
        self.session.close()
        self.runner.join(5)
        self.runtime.close()


def timed_saves(store: CheckpointStore) -> list[float]:
    """Wraps the store's save to collect how long each checkpoint write takes (ms)."""
    samples: list[float] = []
    save = store.save

    def timed(payload: object) -> None:
        began = time.perf_counter()
        save(payload)
        samples.append((time.perf_counter() - began) * 1000)

    store.save = timed  # type: ignore[method-assign]
    return samples


@dataclass(frozen=True)
class CreateRun:
    p50: float
    p99: float
    max: float
    write_p50: float  # the checkpoint write alone
    write_p99: float

    def line(self) -> str:
        return (f"p50 {self.p50:.2f} ms  p99 {self.p99:.2f} ms  max {self.max:.2f} ms  "
                f"(checkpoint write p50 {self.write_p50:.2f} ms  p99 {self.write_p99:.2f} ms)")


def bench_create(args: argparse.Namespace) -> bool:
    """Rounds of disk, then tmpfs: the host's load drifts, and both see the same drift. The
    verdict is on the median of the rounds' figures."""
    places = {"disk": Path(args.disk_dir), "tmpfs": Path(args.tmpfs_dir)}
    print(f"CreateContainer through the wire, {args.preset}, {args.running} containers running, "
          f"{args.calls} calls a round, {args.rounds} rounds:")
    runs: dict[str, list[CreateRun]] = {label: [] for label in places}
    for n in range(args.rounds):
        for label, base in places.items():
            with tempfile.TemporaryDirectory(prefix="nri-bench-", dir=base) as folder:
                runs[label].append(measure_create(Path(folder), args))
            print(f"  round {n + 1}, checkpoint on {label} ({base}): {runs[label][-1].line()}")
    ok = True
    for label, done in runs.items():
        p50 = statistics.median(r.p50 for r in done)
        p99 = statistics.median(r.p99 for r in done)
        passed = p50 <= P50_TARGET_MS and p99 <= P99_TARGET_MS
        ok &= passed
        print(f"CreateContainer, checkpoint on {label}: median of the rounds p50 {p50:.2f} ms  "
              f"p99 {p99:.2f} ms  targets p50 <= {P50_TARGET_MS:g} ms, p99 <= "
              f"{P99_TARGET_MS:g} ms: {'PASS' if passed else 'FAIL'}")
    return ok


def measure_create(folder: Path, args: argparse.Namespace) -> CreateRun:
    handler = logging.FileHandler(folder / "plugin.log")  # the daemon logs each decision
    logging.getLogger().addHandler(handler)
    wired = WiredPlugin(folder, folder / "state", args.preset)
    try:
        rng = random.Random(args.seed)
        running: deque[tuple[api.PodSandbox, api.Container]] = deque()
        for i in range(args.running):
            running.append(kubernetes_container(rng, i))
            wired.create(*running[-1])
        writes = timed_saves(wired.store)
        samples = []
        for i in range(args.running, args.running + args.calls):
            sandbox, c = kubernetes_container(rng, i)
            began = time.perf_counter()
            wired.create(sandbox, c)
            samples.append((time.perf_counter() - began) * 1000)
            running.append((sandbox, c))
            wired.remove(*running.popleft())
    finally:
        wired.close()
        logging.getLogger().removeHandler(handler)
        handler.close()
    return CreateRun(statistics.median(samples), percentile(samples, 0.99), max(samples),
                     statistics.median(writes), percentile(writes, 0.99))


# --- (b) pod start on real containerd -----------------------------------------------------


def bench_pods(args: argparse.Namespace) -> bool:
    from bench.pod_start import measure_pod_starts  # needs root and the e2e runtimes

    ok = True
    for version, with_plugin, without in measure_pod_starts(args.pods, args.block):
        med_with, med_without = statistics.median(with_plugin), statistics.median(without)
        ratio = med_with / med_without - 1
        passed = ratio <= POD_START_TARGET
        ok &= passed
        print(f"pod start on containerd {version} ({len(with_plugin)} pods each way): with the "
              f"plugin median {med_with:.1f} ms p99 {percentile(with_plugin, 0.99):.1f} ms; "
              f"without median {med_without:.1f} ms p99 {percentile(without, 0.99):.1f} ms; "
              f"median ratio {ratio:+.1%}  target <= +{POD_START_TARGET:.0%}: "
              f"{'PASS' if passed else 'FAIL'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("create", "pods", "all"), default="all")
    parser.add_argument("--calls", type=int, default=600, help="timed calls a round (>= 500)")
    parser.add_argument("--running", type=int, default=40, help="containers placed while timing")
    parser.add_argument("--rounds", type=int, default=3, help="disk and tmpfs runs, alternated")
    parser.add_argument("--preset", default="intel-2s-ht", help="synthetic machine")
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

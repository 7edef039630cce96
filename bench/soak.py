"""The soak: `nri-numa run` for a long time under pod churn on a real containerd, its resources
sampled, then judged for growth.

Run from the repository root, as root (it runs containerd and runc):
    .venv/bin/python -m bench.soak --minutes N [--sample-seconds S] [--warmup-minutes W]
        [--seed N] [--max-pods N] [--pause-seconds S] [--resize-chance P] [--drift-chance P]
        [--out DIR] [--plot FILE]

The agent runs as deployed: `nri-numa run` as a process of its own on a private containerd
2.1.9 with NRI (the tests/e2e harness), with a state folder, its log (the decision log) in a
file, Prometheus metrics on a local port (scraped at every sample) and the drift repair every
``--reconcile-seconds``. The machine this was written for has 2 CPUs with CPU 0 reserved, so
CPU 1 is the one exclusive CPU.

The churn, seeded: pods are run, their one container created and started, then stopped and
removed (sometimes the container first, as a kubelet does, sometimes the whole pod), up to
``--max-pods`` at once; Guaranteed (1 CPU: exclusive, or refused while CPU 1 is held; 500m:
shared), Burstable and BestEffort mixed. Now and then an in-place resize (a Burstable
container's quota changed; an exclusive container grown past the free CPUs, which must be
refused), and now and then drift: a running container's cgroup cpuset.cpus is written behind
the agent's back, and the agent's drift repair must put it back.

Every ``--sample-seconds`` it samples the agent's RSS, open descriptors and threads
(/proc/PID), the state folder's size (snapshot + journal) and the log's size (with its rotated
file), prints one line, and checks the invariants: `nri-numa state` exits 0 (the ledger equals
the cgroup files; exit status 3 is drift) and no exclusive CPU is held twice in the ledger. At
the end, with the last pods still running, the checkpoint is compared container by container
with the runtime's cgroups; then every pod is removed and the ledger must be empty.

Growth is judged on the samples after the warm-up (default: the first 5 minutes, a third of a
shorter run): the median of the last few samples against the median of the first few after
the warm-up (a window of a tenth of them, at least 3), so that one sample taken while a scrape
or a repair holds a descriptor or a thread does not decide. Bounds: RSS and open descriptors
within ``--rss-growth`` / ``--fd-growth`` (5 %), threads not more, the state folder never above
what compaction allows (nri_numa.state.plugin_checkpoint: the journal is compacted once it
outgrows max(snapshot, MIN_COMPACT_BYTES), so snapshot + journal <= 2 x the largest snapshot
seen + MIN_COMPACT_BYTES + one record), the log growing by at most ``--log-bytes-per-decision``
per logged decision, and the log with its rotated file never above what rotation keeps
(nri_numa.agent.logs.LOG_KEEP_BYTES twice, plus 64 KiB).

Writes ``samples.csv`` and ``soak.json`` (options, samples, counts, verdict) into ``--out``
and, with ``--plot``, an SVG of the samples (bench/soak_plot.py). Prints one line per violated
bound and exits 1 when there is one; 2 when the soak could not run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import grpc

from nri_numa.agent.logs import LOG_KEEP_BYTES
from nri_numa.state.checkpoint import FILE_NAME
from nri_numa.state.plugin_checkpoint import JOURNAL_NAME, MIN_COMPACT_BYTES
from tests.e2e.harness.cgroups import (CgroupLayout, container_cgroup_path, detect_layout,
                                       read_cpuset, remove_cgroups)
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, QoS, Resources, linux_resources
from tests.e2e.harness.image import build_image, import_image
from tests.e2e.harness.runtimes import ensure_runtimes
from tests.e2e.nri_agent import (AGENT, BOTH, EXCLUSIVE, GUARANTEED_1, REPO, Agent, MiB,
                                 assert_ledger_matches_runtime, live_cpusets, load_state,
                                 machine)

CONTAINERD_VERSION = "2.1.9"
STATE_DRIFT = 3  # `nri-numa state`: a cgroup disagrees with the ledger
# A journal record is one event's changes: a few kB here. The slack over the compaction bound
# allows one record past the threshold and the snapshot's temp file during a compaction.
RECORD_SLACK_BYTES = 64 << 10
STATE_FILES = frozenset({FILE_NAME, JOURNAL_NAME, "lock"})
# The agent's decision lines (nri_numa/nri/decision_log.py and the plugin's release and resize
# lines), by the words after the logger's name.
DECISION_MARKS = {"placed": ": placed pod ", "refused": ": refused pod ",
                  "repaired": ": repaired pod ", "adopted": ": adopted pod ",
                  "resized": ": resized pod ", "released": ": released container "}
CHECK_PATIENCE_S = 20.0  # an update the agent sends on its own (a pool grown) lands within this
REPAIR_PATIENCE_S = 30.0  # on top of the reconcile period: a loaded 2-CPU machine
CALL_TIMEOUT_S = 120.0  # a CRI call on a loaded machine

# The pod mix: name, resources of its one container, weight.
KINDS: tuple[tuple[str, Resources, int], ...] = (
    ("guaranteed-1cpu", GUARANTEED_1, 25),
    ("guaranteed-500m", Resources(cpu_request_m=500, cpu_limit_m=500, memory_request=64 * MiB,
                                  memory_limit=64 * MiB), 10),
    ("burstable", Resources(cpu_request_m=250, cpu_limit_m=1000, memory_request=32 * MiB,
                            memory_limit=128 * MiB), 35),
    ("besteffort", Resources(), 30),
)


@dataclass
class Sample:
    t_s: float  # seconds since the churn began
    rss_kb: int
    fds: int
    threads: int
    state_bytes: int  # every file in the state folder
    snapshot_bytes: int
    journal_bytes: int
    log_bytes: int  # the log and its rotated file
    decisions: int  # decision lines logged so far
    pods: int  # pods running now
    ops: int  # churn steps so far


@dataclass
class Counts:
    """What the churn did."""

    pods_run: int = 0
    placed_exclusive: int = 0
    placed_shared: int = 0
    refused: int = 0  # Guaranteed 1-CPU pods refused while CPU 1 was held, as expected
    removed_by_container: int = 0  # StopContainer, RemoveContainer, then the pod
    removed_by_pod: int = 0  # StopPodSandbox, RemovePodSandbox
    resized: int = 0
    resizes_refused: int = 0
    drifts_repaired: int = 0
    state_checks: int = 0
    log_warnings: int = 0
    log_errors: int = 0


@dataclass
class Options:
    minutes: float
    sample_seconds: float = 60.0
    warmup_minutes: float | None = None  # None: 5 min, or a third of a shorter run
    seed: int = 7
    max_pods: int = 6
    pause_seconds: float = 0.5
    reconcile_seconds: float = 2.0
    resize_chance: float = 0.06  # after each churn step
    drift_chance: float = 0.04
    rss_growth: float = 0.05
    fd_growth: float = 0.05
    log_bytes_per_decision: int = 600
    out: Path | None = None
    plot: Path | None = None

    @property
    def warmup_s(self) -> float:
        if self.warmup_minutes is not None:
            return self.warmup_minutes * 60
        return min(5.0, self.minutes / 3) * 60


@dataclass
class Result:
    options: dict[str, object]
    samples: list[Sample]
    counts: Counts
    violations: list[str]
    notes: list[str] = field(default_factory=list)
    out: str = ""
    state_bound: int = 0  # bytes: what compaction allows the state folder, from its snapshots
    decision_lines: dict[str, int] = field(default_factory=dict)  # by kind, the whole run

    def to_json(self) -> str:
        return json.dumps({"options": self.options, "samples": [asdict(s) for s in self.samples],
                           "counts": asdict(self.counts), "state_bound": self.state_bound,
                           "decision_lines": self.decision_lines,
                           "violations": self.violations, "notes": self.notes}, indent=1)


# --- the agent's resources ----------------------------------------------------------------


def process_figures(pid: int) -> tuple[int, int, int]:
    """RSS in kB, open descriptors and threads of process ``pid``, from /proc."""
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    rss_kb = int(status["VmRSS"].split()[0])
    threads = int(status["Threads"])
    return rss_kb, len(os.listdir(f"/proc/{pid}/fd")), threads


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class LogReader:
    """Reads the agent's log as it grows, across a rotation to ``<name>.1``: counts decision
    lines, warnings and errors (a traceback counts as an error)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.inode: int | None = None
        self.offset = 0
        self.warnings = self.errors = 0
        self.by_kind = dict.fromkeys(DECISION_MARKS, 0)  # decision lines of each kind
        self.bad_lines: list[str] = []  # the first few warnings and errors, for the report

    @property
    def decisions(self) -> int:
        return sum(self.by_kind.values())

    def size(self) -> int:
        return file_size(self.path) + file_size(self.path.with_name(self.path.name + ".1"))

    def _scan(self, data: bytes) -> None:
        for line in data.decode(errors="replace").splitlines():
            kind = next((k for k, mark in DECISION_MARKS.items() if mark in line), None)
            if kind is not None:
                self.by_kind[kind] += 1
            elif " WARNING " in line or " ERROR " in line or line.startswith("Traceback"):
                if " WARNING " in line:
                    self.warnings += 1
                else:
                    self.errors += 1
                if len(self.bad_lines) < 20:
                    self.bad_lines.append(line[:300])

    def _read_from(self, path: Path, offset: int) -> int:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
        cut = data.rfind(b"\n") + 1  # a line being written is read next time
        self._scan(data[:cut])
        return offset + cut

    def poll(self) -> None:
        try:
            inode = self.path.stat().st_ino
        except FileNotFoundError:
            return
        if self.inode is not None and inode != self.inode:
            rotated = self.path.with_name(self.path.name + ".1")
            if rotated.exists() and rotated.stat().st_ino == self.inode:
                self._read_from(rotated, self.offset)
            self.offset = 0
        self.inode = inode
        self.offset = self._read_from(self.path, self.offset)


def scrape(url: str) -> str | None:
    """The agent's /metrics; None (and a note) when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.read().decode()
    except OSError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the churn ----------------------------------------------------------------------------


@dataclass
class LivePod:
    pod: Pod
    kind: str
    sandbox: str
    container: str


class Churn:
    """Seeded pod churn through CRI. Violations of what the agent must do are appended to
    ``violations``; anything else going wrong raises."""

    def __init__(self, client: CriClient, layout: CgroupLayout, image_ref: str,
                 options: Options, violations: list[str]) -> None:
        self.client, self.layout, self.image_ref = client, layout, image_ref
        self.options = options
        self.rng = random.Random(options.seed)
        self.live: dict[str, LivePod] = {}
        self.counts = Counts()
        self.violations = violations
        self.ops = 0

    def cpus(self, container_id: str) -> frozenset[int]:
        return read_cpuset(self.layout, self.cgroup(container_id)).cpu_ids

    def cgroup(self, container_id: str) -> str:
        return container_cgroup_path(self.client.container_info(container_id))

    def exclusive_held(self) -> bool:
        return any(p.kind == "guaranteed-1cpu" for p in self.live.values())

    def step(self) -> None:
        self.ops += 1
        count = len(self.live)
        grow = count == 0 or (count < self.options.max_pods and self.rng.random() < 0.5)
        if grow:
            self.create()
        else:
            self.remove(self.rng.choice(sorted(self.live)))
        if self.live and self.rng.random() < self.options.resize_chance:
            self.resize()
        if self.live and self.rng.random() < self.options.drift_chance:
            self.drift()

    def create(self) -> None:
        name, resources, _ = self.rng.choices(KINDS, weights=[k[2] for k in KINDS])[0]
        expect_refusal = name == "guaranteed-1cpu" and self.exclusive_held()
        self.counts.pods_run += 1
        pod = Pod(f"soak-{self.counts.pods_run}", (resources,))
        sandbox = self.client.run_pod(pod)
        try:
            container = self.client.create_container(
                sandbox, pod.container_config("work", self.image_ref))
        except grpc.RpcError as e:
            details = e.details() or ""
            if not (expect_refusal and "nri-numa" in details):
                self.violations.append(f"{pod.name} ({name}) not created: {details}")
            else:
                self.counts.refused += 1
            self.remove_sandbox(pod, sandbox)
            return
        if expect_refusal:
            self.violations.append(f"{pod.name} got a second exclusive CPU while CPU 1 was held")
        self.client.start_container(container)
        self.live[sandbox] = LivePod(pod, name, sandbox, container)
        if name == "guaranteed-1cpu":
            self.counts.placed_exclusive += 1
            if self.cpus(container) != EXCLUSIVE:
                self.violations.append(f"{pod.name}: exclusive container on CPUs "
                                       f"{sorted(self.cpus(container))}, not {sorted(EXCLUSIVE)}")
        else:
            self.counts.placed_shared += 1

    def remove(self, sandbox: str) -> None:
        live = self.live.pop(sandbox)
        if self.rng.random() < 0.5:  # as a kubelet does: the container first, then the pod
            self.client.stop_container(live.container)
            self.client.remove_container(live.container)
            self.counts.removed_by_container += 1
        else:
            self.counts.removed_by_pod += 1
        self.remove_sandbox(live.pod, sandbox)

    def remove_sandbox(self, pod: Pod, sandbox: str) -> None:
        self.client.stop_pod(sandbox)
        self.client.remove_pod(sandbox)
        busy = remove_cgroups(self.layout, [pod.cgroup_parent])
        self.client.cgroup_parents.discard(pod.cgroup_parent)
        if busy:
            raise RuntimeError(f"the cgroups of {pod.name} stayed: {busy}")

    def resize(self) -> None:
        """A Burstable container's CPU limit changed (accepted), or an exclusive container
        grown to 2 CPUs while CPU 0 is reserved (refused by nri-numa, nothing changed)."""
        candidates = sorted((p for p in self.live.values()
                             if p.kind in ("burstable", "guaranteed-1cpu")),
                            key=lambda p: p.sandbox)
        if not candidates:
            return
        live = self.rng.choice(candidates)
        if live.kind == "burstable":
            limit = self.rng.choice((500, 1000, 2000))
            wanted = Resources(cpu_request_m=250, cpu_limit_m=limit, memory_request=32 * MiB,
                               memory_limit=128 * MiB)
            before = self.cpus(live.container)
            self.client.update_container_resources(live.container,
                                                   linux_resources(wanted, QoS.BURSTABLE))
            self.counts.resized += 1
            if self.cpus(live.container) != before:
                self.violations.append(f"{live.pod.name}: resized Burstable container moved "
                                       f"from CPUs {sorted(before)}")
            return
        two = Resources(cpu_request_m=2000, cpu_limit_m=2000, memory_request=64 * MiB,
                        memory_limit=64 * MiB)
        try:
            self.client.update_container_resources(live.container,
                                                   linux_resources(two, QoS.GUARANTEED))
        except grpc.RpcError as e:
            if "nri-numa: resize refused" in (e.details() or ""):
                self.counts.resizes_refused += 1
            else:
                self.violations.append(f"{live.pod.name}: resize failed otherwise: {e.details()}")
        else:
            self.violations.append(f"{live.pod.name}: grown to 2 CPUs with CPU 0 reserved")
        if self.cpus(live.container) != EXCLUSIVE:
            self.violations.append(f"{live.pod.name}: not on CPU 1 after a refused resize")

    def drift(self) -> None:
        """A running container's cpuset.cpus written behind the agent's back; the drift
        repair must put back what it had, within the reconcile period (and a margin)."""
        live = self.live[self.rng.choice(sorted(self.live))]
        path = self.cgroup(live.container)
        before = read_cpuset(self.layout, path).cpu_ids
        other = "0" if before == BOTH else "0-1"
        (self.layout.mount / path.lstrip("/") / "cpuset.cpus").write_text(other + "\n")
        deadline = time.monotonic() + self.options.reconcile_seconds + REPAIR_PATIENCE_S
        while read_cpuset(self.layout, path).cpu_ids != before:
            if time.monotonic() > deadline:
                self.violations.append(
                    f"{live.pod.name}: cpuset.cpus written as {other} behind the agent's back "
                    f"was not put back to {sorted(before)} within "
                    f"{self.options.reconcile_seconds + REPAIR_PATIENCE_S:g} s")
                return
            time.sleep(0.1)
        self.counts.drifts_repaired += 1

    def remove_all(self) -> None:
        for sandbox in sorted(self.live):
            self.remove(sandbox)


# --- checks -------------------------------------------------------------------------------


def state_check(agent: Agent) -> tuple[int, str]:
    """`nri-numa state` as an operator runs it, retried while the agent may still be sending
    an update of its own (a pool grown after a removal): its last exit status and output."""
    deadline = time.monotonic() + CHECK_PATIENCE_S
    while True:
        done = subprocess.run([str(AGENT), "state", "--state-dir", str(agent.state_dir),
                               "--config", str(agent.config_file)],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        if done.returncode == 0 or time.monotonic() > deadline:
            return done.returncode, (done.stdout + done.stderr).strip()
        time.sleep(1.0)


def ledger_check(agent: Agent) -> list[str]:
    """The ledger's own invariant: no exclusive CPU in two allocations, none in the pool."""
    try:
        state = load_state(agent.state_dir, machine())
    except AssertionError as e:  # caught mid-compaction: read again next time
        return [f"(checkpoint not readable now: {e})"]
    owners: dict[int, str] = {}
    problems = []
    allocations = state.ledger.allocations
    for uid, name, held in ((uid, name, held) for uid, pod in allocations.pods.items()
                            for name, held in pod.containers.items()):
        for cpu in held.exclusive_cpus:
            if cpu in owners:
                problems.append(f"CPU {cpu} exclusive to {owners[cpu]} and {uid}/{name}")
            owners[cpu] = f"{uid}/{name}"
            if cpu in allocations.shared:
                problems.append(f"CPU {cpu} exclusive to {uid}/{name} and in the shared pool")
    return problems


def compaction_bound(largest_snapshot: int) -> int:
    """The most the state folder may hold: the journal is compacted once it outgrows
    max(snapshot, MIN_COMPACT_BYTES), so it holds at most that plus one record."""
    return max(largest_snapshot, MIN_COMPACT_BYTES) + largest_snapshot + RECORD_SLACK_BYTES


def window_median(values: list[float], window: int, last: bool) -> float:
    part = values[-window:] if last else values[:window]
    return statistics.median(part)


def judge(samples: list[Sample], options: Options, state_bound: int) -> tuple[list[str], list[str]]:
    """The growth bounds on the samples after the warm-up: (violations, notes)."""
    violations: list[str] = []
    after = [s for s in samples if s.t_s >= options.warmup_s]
    if len(after) < 4:
        return [f"only {len(after)} samples after the {options.warmup_s / 60:g}-minute warm-up: "
                "too few to judge growth (a longer run or shorter --sample-seconds)"], []
    window = max(3, round(len(after) / 10))
    notes = [f"growth judged on {len(after)} samples after the warm-up, medians of the first "
             f"and last {window}"]

    def growth(name: str, values: list[float], allowed: float, unit: str) -> None:
        first, last = window_median(values, window, False), window_median(values, window, True)
        limit = first * (1 + allowed)
        unit_ = f" {unit}" if unit else ""
        notes.append(f"{name}: {first:g} -> {last:g}{unit_} (max {max(values):g}), "
                     f"bound {limit:g}")
        if last > limit:
            violations.append(f"{name} grew from {first:g} to {last:g}{unit_} after the warm-up "
                              f"(bound +{allowed:.0%}: {limit:g})")

    growth("RSS", [s.rss_kb / 1024 for s in after], options.rss_growth, "MB")
    growth("open descriptors", [s.fds for s in after], options.fd_growth, "")
    growth("threads", [s.threads for s in after], 0.0, "")
    biggest = max(s.state_bytes for s in samples)
    notes.append(f"state folder: at most {biggest} bytes, bound {state_bound}")
    for s in samples:
        if s.state_bytes > state_bound:
            violations.append(f"state folder {s.state_bytes} bytes at {s.t_s / 60:.1f} min, "
                              f"above what compaction allows ({state_bound})")
            break
    decided = after[-1].decisions - after[0].decisions
    grown = after[-1].log_bytes - after[0].log_bytes
    rotated = any(b.log_bytes < a.log_bytes for a, b in zip(after, after[1:]))
    if decided > 0 and not rotated:
        per = grown / decided
        notes.append(f"log: {grown} bytes for {decided} decisions after the warm-up, "
                     f"{per:.0f} bytes a decision (bound {options.log_bytes_per_decision})")
        if per > options.log_bytes_per_decision:
            violations.append(f"log grew {per:.0f} bytes a decision after the warm-up "
                              f"(bound {options.log_bytes_per_decision})")
    log_bound = 2 * LOG_KEEP_BYTES + (64 << 10)
    if max(s.log_bytes for s in samples) > log_bound:
        violations.append(f"log and rotated log {max(s.log_bytes for s in samples)} bytes, "
                          f"above what rotation keeps ({log_bound})")
    return violations, notes


# --- the run ------------------------------------------------------------------------------


def soak(options: Options, say: Callable[[str], None] = print) -> Result:
    if os.geteuid() != 0:
        raise SystemExit("the soak needs root: it runs containerd and runc")
    topology = machine()
    if topology.online_cpus != BOTH or len(topology.numa_nodes) != 1:
        raise SystemExit("the soak is written for a machine with CPUs 0-1 on one NUMA node")
    runtimes = ensure_runtimes()
    layout = detect_layout()
    out = options.out or Path(tempfile.mkdtemp(prefix="nri-numa-soak-", dir="/var/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="nri-soak-", dir="/tmp"))  # short socket paths
    violations: list[str] = []
    samples: list[Sample] = []
    image = build_image(runtimes.busybox, base)
    daemon = ContainerdDaemon(runtimes.containerd[CONTAINERD_VERSION], base / "containerd",
                              image.ref, log=out / "containerd.log")
    (base / "containerd").mkdir()
    agent_dir = out / "agent"
    shutil.rmtree(agent_dir, ignore_errors=True)
    agent_dir.mkdir()
    (agent_dir / "kubelet").mkdir()  # no kubelet checkpoints to adopt from
    port = free_port()
    agent = Agent(daemon.paths.nri_socket, agent_dir, extra_args=(
        "--metrics-address", f"127.0.0.1:{port}", "--pod-resources-socket", "",
        "--kubelet-state-dir", str(agent_dir / "kubelet")))
    with agent.config_file.open("a") as config:
        config.write(f'cpuManagerReconcilePeriod: "{options.reconcile_seconds:g}s"\n')
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    client: CriClient | None = None
    churn: Churn | None = None
    log: LogReader | None = None
    notes: list[str] = []
    largest_snapshot = 0
    try:
        daemon.start()
        import_image(daemon.binaries.ctr, daemon.address, image)
        client = CriClient(daemon.address, timeout_s=CALL_TIMEOUT_S)
        connected = f'plugin \\"{agent.full_name}\\" connected'
        agent.start()
        deadline = time.monotonic() + 60
        while connected not in daemon.log_text():
            if time.monotonic() > deadline or not agent.alive():
                raise RuntimeError(f"containerd did not connect the agent; its log: {agent.log}")
            time.sleep(0.1)
        assert agent.process is not None
        pid = agent.process.pid
        log = LogReader(agent.log)
        churn = Churn(client, layout, daemon.sandbox_image, options, violations)
        say(f"soak: {options.minutes:g} min, a sample every {options.sample_seconds:g} s, "
            f"warm-up {options.warmup_s / 60:g} min, seed {options.seed}; agent pid {pid}, "
            f"containerd {daemon.version}; output in {out}")
        began = time.monotonic()
        end = began + options.minutes * 60
        next_sample = began
        while True:
            now = time.monotonic()
            if now >= next_sample or now >= end:
                if not agent.alive():
                    violations.append(f"the agent exited ({agent.process.returncode}) at "
                                      f"{(now - began) / 60:.1f} min")
                    break
                log.poll()
                rss_kb, fds, threads = process_figures(pid)  # before the scrape's own thread
                if scrape(metrics_url) is None:
                    violations.append(f"/metrics did not answer at {(now - began) / 60:.1f} min")
                snapshot = file_size(agent.state_dir / FILE_NAME)
                largest_snapshot = max(largest_snapshot, snapshot)
                sample = Sample(
                    round(now - began, 1), rss_kb, fds, threads,
                    sum(file_size(p) for p in agent.state_dir.iterdir()), snapshot,
                    file_size(agent.state_dir / JOURNAL_NAME), log.size(), log.decisions,
                    len(churn.live), churn.ops)
                samples.append(sample)
                stray = {p.name for p in agent.state_dir.iterdir()} - STATE_FILES
                stray = {n for n in stray if ".tmp-" not in n}  # a compaction under way
                if stray:
                    violations.append(f"state folder holds {sorted(stray)} at "
                                      f"{sample.t_s / 60:.1f} min (set aside?)")
                status, text = state_check(agent)
                churn.counts.state_checks += 1
                if status != 0:
                    violations.append(f"`nri-numa state` exit status {status} at "
                                      f"{sample.t_s / 60:.1f} min: {text.splitlines()[-1:]}")
                violations.extend(p for p in ledger_check(agent) if not p.startswith("("))
                say(sample_line(sample, churn.counts))
                next_sample += options.sample_seconds
                if now >= end:
                    break
            churn.step()
            time.sleep(options.pause_seconds)
        final_checks(agent, churn, client, layout, violations)
        log.poll()
        churn.counts.log_warnings, churn.counts.log_errors = log.warnings, log.errors
        if log.errors:
            violations.append(f"the agent logged {log.errors} errors: {log.bad_lines[:3]}")
        if log.warnings:
            notes.append(f"the agent logged {log.warnings} warnings, first: {log.bad_lines[:3]}")
        notes.append(f"repair lines: {log.by_kind['repaired']} for "
                     f"{churn.counts.drifts_repaired} cpusets written behind the agent's back "
                     "(more: a periodic check that met an update of the agent's own before "
                     "the runtime had applied it)")
        status = agent.stop()
        if status != 0:
            violations.append(f"the agent's exit status on SIGTERM was {status}")
    finally:
        agent.stop()
        if client is not None:
            if churn is not None:
                try:
                    churn.remove_all()
                except (grpc.RpcError, RuntimeError) as e:
                    notes.append(f"clean-up: {e}")
            client.remove_all()
            client.close()
        problems = daemon.cleanup()
        shutil.rmtree(base, ignore_errors=True)
        if problems:
            notes.append(f"containerd clean-up left: {problems}")
    state_bound = compaction_bound(largest_snapshot)
    grown, judged = judge(samples, options, state_bound)
    violations.extend(grown)
    notes = judged + notes
    counts = churn.counts if churn is not None else Counts()
    result = Result({k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
                    samples, counts, violations, notes, str(out), state_bound,
                    dict(log.by_kind) if log is not None else {})
    write_outputs(result, out)
    if options.plot is not None:
        from bench.soak_plot import write_svg

        write_svg(result, options.plot)
    return result


def final_checks(agent: Agent, churn: Churn, client: CriClient, layout: CgroupLayout,
                 violations: list[str]) -> None:
    """With the last pods running: the checkpoint against every container's cgroup. Then
    with every pod removed: an empty ledger."""
    status, text = state_check(agent)
    if status != 0:
        violations.append(f"at the end, `nri-numa state` exit status {status}: {text}")
    try:
        assert_ledger_matches_runtime(load_state(agent.state_dir, machine()),
                                      live_cpusets(client, layout))
    except AssertionError as e:
        violations.append(f"at the end, the checkpoint disagrees with the runtime: {e}")
    churn.remove_all()
    deadline = time.monotonic() + CHECK_PATIENCE_S
    while True:
        state = load_state(agent.state_dir, machine())
        left = sorted(c.name for c in state.containers.values())
        held = sorted(uid for uid, pod in state.ledger.allocations.pods.items()
                      if pod.cpus_in_use())
        if not left and not held:
            return
        if time.monotonic() > deadline:
            violations.append(f"with every pod removed, the ledger still holds {left} "
                              f"(exclusive CPUs for {held})")
            return
        time.sleep(0.5)


def sample_line(s: Sample, c: Counts) -> str:
    return (f"[{s.t_s / 60:6.1f} min] RSS {s.rss_kb / 1024:6.1f} MB  fds {s.fds:3d}  "
            f"threads {s.threads:2d}  state {s.state_bytes / 1024:7.1f} kB (snapshot "
            f"{s.snapshot_bytes / 1024:.1f}, journal {s.journal_bytes / 1024:.1f})  "
            f"log {s.log_bytes / 1024:7.1f} kB  decisions {s.decisions:5d}  pods {s.pods}  "
            f"steps {s.ops:5d} (exclusive {c.placed_exclusive}, shared {c.placed_shared}, "
            f"refused {c.refused}, resized {c.resized}+{c.resizes_refused} refused, "
            f"drift repaired {c.drifts_repaired})")


def write_outputs(result: Result, out: Path) -> None:
    with (out / "samples.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f.name for f in fields(Sample)])
        writer.writerows([getattr(s, f.name) for f in fields(Sample)] for s in result.samples)
    (out / "soak.json").write_text(result.to_json())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="not judged for growth (default 5, a third of a shorter run)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-pods", type=int, default=6, help="pods running at once, at most")
    parser.add_argument("--pause-seconds", type=float, default=0.5,
                        help="between churn steps (the machine is shared)")
    parser.add_argument("--reconcile-seconds", type=float, default=2.0,
                        help="the agent's cpuManagerReconcilePeriod (drift repair)")
    parser.add_argument("--resize-chance", type=float, default=0.06,
                        help="of an in-place resize after each churn step")
    parser.add_argument("--drift-chance", type=float, default=0.04,
                        help="of a cpuset written behind the agent's back after each step")
    parser.add_argument("--rss-growth", type=float, default=0.05)
    parser.add_argument("--fd-growth", type=float, default=0.05)
    parser.add_argument("--log-bytes-per-decision", type=int, default=600)
    parser.add_argument("--out", type=Path, help="samples.csv, soak.json, the agent's folder")
    parser.add_argument("--plot", type=Path, help="an SVG of the samples")
    args = parser.parse_args()
    options = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    result = soak(options)
    for note in result.notes:
        print(f"note: {note}")
    print(f"counts: {asdict(result.counts)}")
    print(f"decision lines: {result.decision_lines}")
    for violation in result.violations:
        print(f"VIOLATED: {violation}")
    print(f"{'FAIL' if result.violations else 'PASS'}: {len(result.violations)} bounds violated; "
          f"samples in {result.out}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())

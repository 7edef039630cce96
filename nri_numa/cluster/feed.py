"""The agent's side of the export: runs the export process (nri_numa.cluster.export_process) and
feeds it the node's NodeResourceTopology object, without ever making a handler wait.

A handler that changed the ledger calls ``changed()``, which only sets a flag. The feed thread
wakes, waits ``batch_s`` more so that a burst of containers becomes one object, builds the object
from the ledger's committed value (an immutable snapshot, off the handler's path) and writes one
line to the process. A process that died is started again with growing waits, and gets the
latest object first. What the process reports of the API server comes back as log lines and as
``status``, which the metrics read; what it tells of the node's pods (nri_numa.cluster.pod_watch)
goes to ``on_pods``, on the thread that reads the process's reports.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from nri_numa.agent.prometheus_text import MetricFamily, counter_family, gauge_family
from nri_numa.cluster import channel
from nri_numa.cluster.channel import ExportStatus

log = logging.getLogger("nri_numa.cluster")

BATCH_S = 0.1  # a burst's changes within this much of the first one go as one object
RESTART_FIRST_S = 1.0
RESTART_CAP_S = 60.0
STOP_WAIT_S = 3.0
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


POD_MESSAGES = frozenset({"pods", "pod", "pod-gone"})


def export_command(kubeconfig: str | None, resync_s: float, evict: bool, evict_after: int,
                   eviction_delay_s: float, node: str = "") -> list[str]:
    """``node``: also watch that node's pods (nri_numa.cluster.pod_watch)."""
    argv = [sys.executable, "-m", "nri_numa.cluster.export_process", "--resync", str(resync_s),
            "--evict", "true" if evict else "false", "--evict-after", str(evict_after),
            "--eviction-delay", str(eviction_delay_s)]
    return (argv + (["--kubeconfig", kubeconfig] if kubeconfig else [])
            + (["--node", node] if node else []))


class ClusterFeed:
    def __init__(self, snapshot: Callable[[], dict[str, Any]], command: list[str], *,
                 batch_s: float = BATCH_S,
                 start: Callable[[list[str]], subprocess.Popen] | None = None,
                 on_pods: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._snapshot = snapshot
        self._on_pods = on_pods
        self._command = command
        self._batch_s = batch_s
        self._start = start or _start_process
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._dirty = True  # the first object goes as soon as the process runs
        self._queued: list[dict[str, Any]] = []
        self._process: subprocess.Popen | None = None
        self._started_at = 0.0
        self.status = ExportStatus()
        self.restarts = 0
        self._delays = _restart_delays()
        self._thread = threading.Thread(target=self._feed, name="nrt-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._wake.set()

    def changed(self) -> None:
        """The ledger changed (called by handlers: never blocks, never raises)."""
        self._dirty = True
        self._wake.set()

    def send(self, message: dict[str, Any]) -> None:
        """Any other message for the export process (a refusal), in order, never blocking."""
        with self._lock:
            if len(self._queued) < 10000:  # a process that never reads costs bounded memory
                self._queued.append(message)
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=STOP_WAIT_S + 2)
        self._end_process()
        self.status = ExportStatus("stopped", "the agent stopped", self.status.writes,
                                   self.status.errors, self.status.last_success)

    # --- the feed thread ----------------------------------------------------------------------

    def _feed(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            if self._stopping.is_set():
                return
            self._stopping.wait(self._batch_s)  # let the rest of a burst arrive
            self._wake.clear()
            if not self._running() and not self._restart():
                continue
            try:
                self._deliver()
            except (BrokenPipeError, ValueError, OSError):
                self._dirty = True  # the process died mid-write: the next one gets it all
                self._wake.set()
            except Exception:  # the feed must outlive any one object
                log.exception("NodeResourceTopology export: cannot build the object")

    def _deliver(self) -> None:
        with self._lock:
            queued, self._queued = self._queued, []
        lines = [channel.encode(m) for m in queued]
        if self._dirty:
            self._dirty = False
            lines.append(channel.encode({"kind": "nrt", "object": self._snapshot()}))
        process = self._process
        if lines and process is not None and process.stdin is not None:
            process.stdin.write(b"".join(lines))
            process.stdin.flush()

    def _running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _restart(self) -> bool:
        """Start the process (again, after a wait that grows while it keeps dying); False when
        the agent stopped meanwhile or it could not start."""
        if self._process is not None:
            code = self._process.poll()
            if time.monotonic() - self._started_at > RESTART_CAP_S:
                self._delays = _restart_delays()  # it ran a good while: a new outage
            delay = next(self._delays)
            log.warning("NodeResourceTopology export process exited (status %s); starting it "
                        "again in %.0f s", code, delay)
            self.restarts += 1
            if self._stopping.wait(delay):
                return False
        try:
            self._process = self._start(self._command)
        except OSError as e:
            log.error("NodeResourceTopology export process cannot start: %s", e)
            self._process = None
            self._stopping.wait(RESTART_CAP_S)
            self._wake.set()
            return False
        self._started_at = time.monotonic()
        self._dirty = True
        threading.Thread(target=self._read_reports, args=(self._process.stdout,),
                         name="nrt-reports", daemon=True).start()
        return True

    def _read_reports(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        for line in iter(lambda: stream.readline(channel.MAX_LINE + 1), b""):
            try:
                message = channel.decode(line)
            except channel.BadLine as e:
                log.warning("NodeResourceTopology export process said %s", e)
                continue
            if message["kind"] == "status":
                self.status = ExportStatus.from_message(message)
            elif message["kind"] == "log":
                level = _LEVELS.get(str(message.get("level")), logging.INFO)
                log.log(level, "%s", str(message.get("message", ""))[:1000])
            elif message["kind"] in POD_MESSAGES and self._on_pods is not None:
                try:
                    self._on_pods(message)
                except Exception:  # the reports must go on being read
                    log.exception("the export process's pod message could not be taken")
        self._wake.set()  # the process ended: the feed thread starts another

    def _end_process(self) -> None:
        process = self._process
        if process is None:
            return
        try:
            if process.stdin is not None:
                process.stdin.close()  # the process ends when its input does
            process.wait(timeout=STOP_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(timeout=STOP_WAIT_S)


def _start_process(command: list[str]) -> subprocess.Popen:
    # Standard error is the agent's: a crash's traceback lands in the agent's log stream.
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            close_fds=True)


def _restart_delays() -> Iterator[float]:
    delay = RESTART_FIRST_S
    while True:
        yield delay
        delay = min(RESTART_CAP_S, delay * 2)


class ExportCollector:
    """Prometheus families for the export's state, read from the feed at scrape time."""

    def __init__(self, feed: ClusterFeed) -> None:
        self._feed = feed

    def collect(self) -> Iterator[MetricFamily]:
        status = self._feed.status
        synced = gauge_family("nri_numa_nrt_export_synced", "1 when the node's "
                              "NodeResourceTopology object matched the node at the last write or "
                              "check, 0 while writing it fails.")
        synced.add([], 1 if status.state == "synced" else 0)
        yield synced
        yield counter_family("nri_numa_nrt_export_writes", "API calls that created or changed "
                             "the NodeResourceTopology object.", status.writes)
        yield counter_family("nri_numa_nrt_export_errors", "API calls for the "
                             "NodeResourceTopology object that failed.", status.errors)
        yield counter_family("nri_numa_nrt_export_restarts", "Times the export process was "
                             "started again after it ended.", self._feed.restarts)
        if status.last_success is not None:
            last = gauge_family("nri_numa_nrt_export_last_success_timestamp_seconds",
                                "When the object last matched the node (UNIX time).")
            last.add([], status.last_success)
            yield last

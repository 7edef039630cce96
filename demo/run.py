"""The demo's library entry point, `run_demo`: a private containerd, `nri-numa run` attached to
its NRI socket, a BestEffort, a Guaranteed and a Burstable pod run through CRI (BestEffort first,
so that the shared pool is seen shrinking when the Guaranteed pod arrives), every container's
cpuset read back, and everything removed again, on success, failure, Ctrl-C or SIGTERM alike.

It uses the e2e tests' harness (tests.e2e.harness, tests.e2e.nri_agent) rather than a copy."""

from __future__ import annotations

import errno
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import grpc

from demo.cleanup import Cleanup, forget_signals, raise_if_interrupted
from demo.preflight import Ready, preflight
from demo.progress import Progress
from demo.rows import BESTEFFORT, BURSTABLE, GUARANTEED, DemoResult, Row
from nri_numa.agent.inputs import SETTINGS_KEY
from tests.e2e.harness.cgroups import (CgroupLayout, allowed_inside, container_cgroup_path,
                                       read_cpuset, remove_cgroups)
from tests.e2e.harness.containerd import ContainerdDaemon, DaemonFailed
from tests.e2e.harness.cri import CriClient, Pod, QoS, Resources
from tests.e2e.harness.image import IMAGE_REF, BuiltImage, build_image, import_image
from tests.e2e.nri_agent import CONFIG, GUARANTEED_1, Agent, connected_count

MiB = 1 << 20
WORKDIR_PARENT = "/tmp"  # short: containerd's sockets live below it (108-byte limit)
CONTAINER = "work"
LOG_TAIL_LINES = 15
CONNECT_TIMEOUT_S = 15.0
QOS_CGROUPS = ("kubepods", "kubepods/burstable", "kubepods/besteffort")
QOS_NAMES = {QoS.GUARANTEED: GUARANTEED, QoS.BURSTABLE: BURSTABLE, QoS.BESTEFFORT: BESTEFFORT}


class DemoFailed(Exception):
    """A step of the demo did not work; str() names the step and the reason."""


@dataclass(frozen=True)
class DemoPod:
    pod: Pod
    asked: str
    exclusive_cpus: int = 0

    @property
    def qos(self) -> str:
        return QOS_NAMES[self.pod.qos]


def demo_pods() -> tuple[DemoPod, ...]:
    """In the order they are run: BestEffort first, so that its shrinking is seen."""
    return (
        DemoPod(Pod("besteffort", (Resources(),)), "nothing"),
        DemoPod(Pod("guaranteed", (GUARANTEED_1,)), "1 CPU, 64Mi, requests = limits", 1),
        DemoPod(Pod("burstable", (Resources(cpu_request_m=500, memory_limit=128 * MiB),)),
                "CPU request 500m, 128Mi limit"),
    )


def read_row(client: CriClient, ready: Ready, demo_pod: DemoPod, container_id: str) -> Row:
    cgroup = container_cgroup_path(client.container_info(container_id))
    cpuset = read_cpuset(ready.layout, cgroup)
    inside = allowed_inside(client, container_id)
    return Row(demo_pod.pod.name, demo_pod.qos, demo_pod.asked, demo_pod.exclusive_cpus, cgroup,
               cpuset.cpus, cpuset.mems, inside.cpus, inside.mems)


def missing_qos_dirs(layout: CgroupLayout) -> list[Path]:
    """The kubelet-style QoS cgroups (/kubepods, /kubepods/burstable, ...) that do not exist yet:
    runc will make them for the demo's pods, and the clean-up removes them again."""
    return [hierarchy / folder for hierarchy in layout.hierarchies for folder in QOS_CGROUPS
            if not (hierarchy / folder).exists()]


def remove_empty(folders: list[Path]) -> list[str]:
    """rmdir, deepest first. One still in use (by another runtime's pods) is left alone quietly:
    it was made for the demo, but it is no longer only the demo's."""
    problems = []
    for folder in sorted(folders, key=lambda f: -len(f.parts)):
        try:
            folder.rmdir()
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EBUSY, errno.ENOTEMPTY):
                problems.append(f"{folder}: {exc.strerror}")
    return problems


def _remove_tree(path: Path) -> list[str]:
    shutil.rmtree(path, ignore_errors=True)
    return [f"{path} is still there"] if path.exists() else []


def _stop_agent(agent: Agent) -> list[str]:
    status = agent.stop()
    # 0: stopped by SIGTERM as asked; <0 or None: killed (also by a Ctrl-C the terminal sent it).
    return [] if status is None or status <= 0 else [f"nri-numa run exited with status {status}"]


def _remove_pods(client: CriClient) -> list[str]:
    try:
        return client.remove_all()
    finally:
        client.close()


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


class DemoRun:
    """The steps of one run; every step that starts something first registers its undo."""

    def __init__(self, ready: Ready, pods: tuple[DemoPod, ...], workdir: Path, cleanup: Cleanup,
                 progress: Progress) -> None:
        self.ready, self.pods, self.workdir = ready, pods, workdir
        self.cleanup, self.progress = cleanup, progress
        self.daemon = ContainerdDaemon(ready.containerd, workdir / "c", IMAGE_REF,
                                       log=workdir / "containerd.log")
        (workdir / "agent").mkdir()
        self.agent = Agent(self.daemon.paths.nri_socket, workdir / "agent", name="numa-demo")
        # No metrics server: its default port may be taken by another agent on this machine,
        # and the demo ends before anyone could read it.
        with self.agent.config_file.open("a") as config:
            config.write(f"{SETTINGS_KEY}:\n  metricsAddress: \"off\"\n")

    @property
    def version(self) -> str:
        return self.ready.containerd.version

    def start_containerd(self) -> None:
        self.cleanup.push(f"containerd {self.version} (its containers, shims, mounts, files)",
                          self.daemon.cleanup)
        with self.progress.step(f"starting a private containerd {self.version} with NRI on"):
            try:
                self.daemon.start()
            except DaemonFailed as exc:
                # The log's tail follows from show_logs: keep the first line only.
                raise DemoFailed(str(exc).splitlines()[0]) from None

    def import_image(self) -> BuiltImage:
        with self.progress.step("importing the busybox image (workload and sandbox image, no registry)"):
            image = build_image(self.ready.busybox, self.workdir)
            import_image(self.daemon.binaries.ctr, self.daemon.address, image)
        return image

    def start_plugin(self) -> None:
        self.cleanup.push("nri-numa run", lambda: _stop_agent(self.agent))
        with self.progress.step("starting nri-numa run and waiting for containerd to connect it"):
            before = connected_count(self.daemon, self.agent)
            self.agent.start()
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while connected_count(self.daemon, self.agent) == before:
                if not self.agent.alive():
                    raise DemoFailed(f"nri-numa run exited ({self.agent.process.returncode}) "
                                     f"before containerd connected it")
                if time.monotonic() > deadline:
                    raise DemoFailed(f"containerd did not connect nri-numa run within "
                                     f"{CONNECT_TIMEOUT_S:g} s")
                time.sleep(0.02)

    def run_pod(self, client: CriClient, demo_pod: DemoPod, image: BuiltImage) -> str:
        with self.progress.step(f"running pod {demo_pod.pod.name} ({demo_pod.qos}: {demo_pod.asked})"):
            try:
                sandbox = client.run_pod(demo_pod.pod)
                return client.run_container(sandbox, demo_pod.pod.container_config(CONTAINER, image.ref))
            except grpc.RpcError as exc:
                raise DemoFailed(f"pod {demo_pod.pod.name}: CRI said {exc.code().name}: "
                                 f"{exc.details()}") from None

    def placements(self) -> tuple[tuple[Row, ...], str]:
        """Runs the pods and reads every container back; also returns the BestEffort container's
        cpuset.cpus from before the Guaranteed pod came."""
        self.start_containerd()
        image = self.import_image()
        self.start_plugin()
        client = self.daemon.cri()
        self.cleanup.push("the pods", lambda: _remove_pods(client))
        before = ""
        for demo_pod in self.pods:
            container_id = self.run_pod(client, demo_pod, image)
            if demo_pod.qos == BESTEFFORT:
                before = read_row(client, self.ready, demo_pod, container_id).cpus
        # The shared containers may have been moved since they were read: read them all again.
        ids = {c.labels["io.kubernetes.pod.name"]: c.id for c in client.list_containers()}
        in_qos_order = sorted(self.pods, key=lambda p: list(QOS_NAMES.values()).index(p.qos))
        return tuple(read_row(client, self.ready, p, ids[p.pod.name]) for p in in_qos_order), before

    def plugin_lines(self) -> tuple[str, ...]:
        """The plugin's own account of each placement, from its log."""
        return tuple(line.split(": ", 1)[-1] for line in self.agent.log_text().splitlines()
                     if "placed pod" in line)

    def show_logs(self) -> None:
        self.progress.say(f"containerd log, last lines:\n{_tail(self.daemon.paths.log)}")
        self.progress.say(f"nri-numa log, last lines:\n{_tail(self.agent.log)}")


def run_demo(version: str = "2.1", out: TextIO = sys.stderr) -> DemoResult:
    """Runs the demo once and returns what was read back; raises DemoUnavailable (this machine
    cannot run it), DemoFailed, KeyboardInterrupt or Interrupted, always after cleaning up."""
    ready = preflight(version)
    progress = Progress(out)
    began = time.monotonic()
    pods = demo_pods()
    cleanup = Cleanup()
    run: DemoRun | None = None
    try:
        workdir = Path(tempfile.mkdtemp(prefix="nri-numa-demo-", dir=WORKDIR_PARENT))
        cleanup.push(f"remove {workdir}", lambda: _remove_tree(workdir))
        new_qos_dirs = missing_qos_dirs(ready.layout)
        cleanup.push("the QoS cgroups the demo made", lambda: remove_empty(new_qos_dirs))
        parents = sorted(p.pod.cgroup_parent for p in pods)
        cleanup.push("the pods' cgroups", lambda: remove_cgroups(ready.layout, parents))
        run = DemoRun(ready, pods, workdir, cleanup, progress)
        rows, before = run.placements()
        lines = run.plugin_lines()
        raise_if_interrupted()  # one gRPC swallowed during the last read: before the clean-up
    except BaseException as exc:
        forget_signals()
        if run is not None and isinstance(exc, Exception):
            run.show_logs()
        progress.say("cleaning up")
        for problem in cleanup.run():
            progress.say(f"clean-up: {problem}")
        if isinstance(exc, Exception) and not isinstance(exc, DemoFailed):
            raise DemoFailed(f"{type(exc).__name__}: {exc}") from exc
        raise
    with progress.step("cleaning up: pods, nri-numa, containerd, shims, mounts, cgroups, files"):
        problems = tuple(cleanup.run())
    return DemoResult(containerd_version=ready.containerd.version, machine=ready.machine,
                      config=dict(CONFIG), cgroup_mount=ready.layout.mount,
                      rows=rows, besteffort_before=before, plugin_lines=lines, workdir=workdir,
                      seconds=time.monotonic() - began, cleanup_problems=problems)

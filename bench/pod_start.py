"""Pod start times on real containerd, with and without `nri-numa run` connected, for
bench_nri_plugin.py part (b). Uses the e2e harness (tests/e2e/harness): private containerd
daemons, the busybox image, a kubelet-like CRI client; root is needed.

The agent is started at every switch to "with" and stopped at every switch to "without"; the
first pod after each switch is started untimed (``SETTLE``), so that both sides are timed in
the steady state an agent serves pods in, not in the agent's own start-up."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.e2e.harness.cgroups import detect_layout, remove_cgroups
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage, build_image, import_image
from tests.e2e.harness.runtimes import RUNTIME_VERSIONS, ContainerdBinaries, ensure_runtimes
from tests.e2e.nri_agent import GUARANTEED_1, Agent, connected_count, wait_until

WARM_UP = 2  # pods each way before timing: image layers and caches
# Untimed pods after every switch, either way. The agent is a new process at every connect: its
# first CreateContainer runs cold (measured 4-7 ms against 2.5-3 after), and that cost comes
# once per agent start, not per pod. After a disconnect, containerd 1.7 drops the closed
# plugin only at the next event it fails to send. Neither belongs to a pod start.
SETTLE = 1


def pod_start_ms(client: CriClient, image: BuiltImage, name: str) -> float:
    """RunPodSandbox, CreateContainer, StartContainer of one Guaranteed 1-CPU pod; then it is
    stopped and removed, untimed."""
    pod = Pod(name, (GUARANTEED_1,))
    began = time.perf_counter()
    sandbox = client.run_pod(pod)
    container = client.create_container(sandbox, pod.container_config("work", image.ref))
    client.start_container(container)
    elapsed = (time.perf_counter() - began) * 1000
    client.stop_pod(sandbox)
    client.remove_pod(sandbox)
    remove_cgroups(detect_layout(), [pod.cgroup_parent])
    return elapsed


class Toggle:
    """The plugin connected to containerd, or not."""

    def __init__(self, containerd: ContainerdDaemon, folder: Path) -> None:
        self.containerd = containerd
        self.agent = Agent(containerd.paths.nri_socket, folder)

    def connect(self) -> None:
        before = connected_count(self.containerd, self.agent)
        self.agent.start()
        wait_until(lambda: connected_count(self.containerd, self.agent) > before, 15,
                   "containerd to connect the plugin")

    def disconnect(self) -> None:
        closed = f'connection to plugin \\"{self.agent.full_name}\\" closed'
        before = self.containerd.log_text().count(closed)
        self.agent.stop()
        wait_until(lambda: self.containerd.log_text().count(closed) > before, 10,
                   "containerd to drop the plugin")


def schedule(pods: int, block: int) -> list[bool]:
    """with, without, without, with, ... in blocks: True means with the plugin."""
    order: list[bool] = []
    pattern = (True, False, False, True)
    while order.count(True) < pods or order.count(False) < pods:
        setting = pattern[len(order) // block % len(pattern)]
        order.append(setting)
    return order


def one_version(binaries: ContainerdBinaries, image: BuiltImage, base: Path, pods: int,
                block: int) -> tuple[list[float], list[float]]:
    version = binaries.version
    daemon = ContainerdDaemon(binaries, base / version, image.ref)
    (base / version).mkdir()
    (base / "agent").mkdir(exist_ok=True)
    daemon.start()
    client = None
    toggle = Toggle(daemon, Path(tempfile.mkdtemp(dir=base / "agent")))
    try:
        import_image(daemon.binaries.ctr, daemon.address, image)
        client = daemon.cri()
        times: dict[bool, list[float]] = {True: [], False: []}
        started = {True: 0, False: 0}  # pods started with the plugin, and without

        def start_pod(with_plugin: bool) -> float:
            started[with_plugin] += 1
            return pod_start_ms(client, image, f"bench-{sum(started.values())}")

        connected = False
        warm_up = [True] * WARM_UP + [False] * WARM_UP
        for i, setting in enumerate(warm_up + schedule(pods, block)):
            settle = SETTLE if i >= len(warm_up) and setting != connected else 0
            if setting and not connected:
                toggle.connect()
            elif connected and not setting:
                toggle.disconnect()
            connected = setting
            for _ in range(settle):
                start_pod(setting)
            elapsed = start_pod(setting)
            if i >= len(warm_up):
                times[setting].append(elapsed)
        placed = toggle.agent.log_count("placed pod")
        if placed != started[True]:  # else "with" measured something else
            raise RuntimeError(f"the plugin placed {placed} pods, not every pod started with it "
                               f"({started[True]}); its log: {toggle.agent.log}")
        return times[True][:pods], times[False][:pods]
    finally:
        toggle.agent.stop()
        if client is not None:
            client.remove_all()
            client.close()
        daemon.cleanup()


def measure_pod_starts(pods: int, block: int) -> Iterator[tuple[str, list[float], list[float]]]:
    """(containerd version, ms with the plugin, ms without) per version."""
    if os.geteuid() != 0:
        raise SystemExit("part (b) needs root: it runs containerd and runc")
    runtimes = ensure_runtimes()
    base = Path(tempfile.mkdtemp(prefix="nri-bench-", dir="/tmp"))  # short socket paths
    try:
        image = build_image(runtimes.busybox, base)
        for version in RUNTIME_VERSIONS:
            yield version, *one_version(runtimes.containerd[version], image, base, pods, block)
    finally:
        shutil.rmtree(base, ignore_errors=True)

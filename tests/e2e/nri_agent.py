"""`nri-numa run` as a real process for the e2e tests: started against a containerd's NRI socket
with the static CPU policy, killed with SIGKILL or frozen with SIGSTOP, its log read back, and
its checkpoint loaded through ``nri_numa.state`` to be compared with what the runtime reports.

This machine has 2 CPUs on one NUMA node. The static policy needs at least one reserved CPU
(the kubelet's rule, which the engine keeps); reserved CPUs stay in the shared pool, so with
``reservedSystemCPUs: "0"`` CPU 1 is the only one that can be exclusive and CPU 0 keeps the
shared pool from ever being empty.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.state.checkpoint import FILE_NAME, CheckpointStore, machine_fingerprint
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_checkpoint import JOURNAL_NAME, PluginCheckpoint
from nri_numa.state.plugin_records import ContainerRecord, PodRecord, records_from_dict
from nri_numa.topology import discover
from nri_numa.topology.cpulist import format_list, parse_list
from nri_numa.topology.model import Topology
from tests.e2e.cri import api_pb2 as cri
from tests.e2e.harness.cgroups import CgroupLayout, container_cgroup_path, read_cpuset
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod, Resources
from tests.e2e.harness.image import BuiltImage

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / ".venv" / "bin" / "nri-numa"
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
          "topologyManagerPolicy": "single-numa-node"}
SHARED_ONLY, EXCLUSIVE = frozenset({0}), frozenset({1})
BOTH = SHARED_ONLY | EXCLUSIVE
MiB = 1 << 20
GUARANTEED_1 = Resources(cpu_request_m=1000, cpu_limit_m=1000, memory_request=64 * MiB,
                         memory_limit=64 * MiB)
GUARANTEED_2 = Resources(cpu_request_m=2000, cpu_limit_m=2000, memory_request=64 * MiB,
                         memory_limit=64 * MiB)
BESTEFFORT = Resources()
LIVE = (cri.CONTAINER_CREATED, cri.CONTAINER_RUNNING)
LOG_LINES_ON_FAILURE = 150


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str,
               poll_s: float = 0.01) -> float:
    """Seconds until ``condition()`` held; AssertionError naming ``what`` after ``timeout_s``."""
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < timeout_s, f"{what}: not within {timeout_s:g} s"
        time.sleep(poll_s)
    return time.monotonic() - began


class Agent:
    """One ``nri-numa run`` process at a time on a fixed state folder; it can be killed and
    started again on the same folder. Its log (and anything the interpreter writes to stderr,
    such as a traceback) goes to ``log``."""

    def __init__(self, socket: Path, folder: Path, name: str = "numa-e2e",
                 index: str = "90", extra_args: tuple[str, ...] = ()) -> None:
        self.socket, self.name, self.index = socket, name, index
        self.extra_args = extra_args  # more `nri-numa run` options (--topology, --dev-root)
        self.state_dir = folder / "state"
        self.config_file = folder / "config.yaml"
        self.config_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in CONFIG.items()))
        self.log = folder / "agent.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def full_name(self) -> str:
        return f"{self.index}-{self.name}"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "the agent still runs"
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"=== test: start {self.starts} of nri-numa run ===\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                [str(AGENT), "run", "--nri-socket", str(self.socket), "--state-dir",
                 str(self.state_dir), "--config", str(self.config_file), "--name", self.name,
                 "--index", self.index, "--log-file", str(self.log), *self.extra_args],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL, cwd=REPO)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind happens in the agent. A frozen agent dies frozen
        (no SIGCONT first, which would let it answer what it was sent meanwhile)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def stop(self) -> int | None:
        """SIGTERM and the exit status (None when it had to be killed)."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            return self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_count(self, text: str) -> int:
        return self.log_text().count(text)

    def wait_log(self, text: str, count: int = 1, timeout_s: float = 10.0) -> float:
        return wait_until(lambda: self.log_count(text) >= count, timeout_s,
                          f"the agent's log to say {text!r} {count} time(s)")


def connected_count(containerd: ContainerdDaemon, agent: Agent) -> int:
    """containerd's own record of the plugin joining (1.7: "connected", 2.1: "connected and
    synchronized"): only then does it send the plugin events."""
    return containerd.log_text().count(f'plugin \\"{agent.full_name}\\" connected')


def start_and_connect(containerd: ContainerdDaemon, agent: Agent, timeout_s: float = 15.0) -> float:
    """Start the agent and wait until containerd has added it; returns the seconds taken."""
    before = connected_count(containerd, agent)
    agent.start()
    return wait_until(lambda: connected_count(containerd, agent) > before, timeout_s,
                      f"containerd to connect {agent.full_name}")


def require_two_cpus() -> None:
    topology = machine()
    if topology.online_cpus != BOTH or len(topology.numa_nodes) != 1:
        pytest.skip(f"written for a machine with CPUs 0-1 on one NUMA node; this one has CPUs "
                    f"{format_list(topology.online_cpus)} on {len(topology.numa_nodes)} nodes")


@contextmanager
def agent_on(socket: Path, tmp_path: Path, topology: Topology | None = None,
             extra_args: tuple[str, ...] = ()) -> Iterator[Agent]:
    """An agent (not started) for ``socket``, on ``topology`` (``--topology``) when given;
    stopped afterwards, with its log printed, which pytest shows only when the test failed."""
    require_two_cpus()
    folder = Path(tempfile.mkdtemp(prefix="agent-", dir=tmp_path))
    if topology is not None:
        (folder / "topology.json").write_text(topology.to_json())
        extra_args = ("--topology", str(folder / "topology.json"), *extra_args)
    made = Agent(socket, folder, extra_args=extra_args)
    try:
        yield made
    finally:
        status = made.stop()
        lines = made.log_text().splitlines()
        print(f"--- nri-numa log, last {LOG_LINES_ON_FAILURE} lines ({made.log}), "
              f"exit status {status} ---")
        print("\n".join(lines[-LOG_LINES_ON_FAILURE:]))


@pytest.fixture
def agent(containerd: ContainerdDaemon, tmp_path: Path) -> Iterator[Agent]:
    """An agent (not started) for this module's containerd."""
    with agent_on(containerd.paths.nri_socket, tmp_path) as made:
        yield made


# --- the plugin's ledger against the runtime ---------------------------------------------


@dataclass(frozen=True)
class SavedState:
    ledger: Ledger
    pods: dict[str, PodRecord]
    containers: dict[str, ContainerRecord]


def machine() -> Topology:
    return discover("/")


def load_state(state_dir: Path, topology: Topology) -> SavedState:
    """The agent's checkpoint (snapshot and journal), checked as the agent checks them (format,
    machine, checksums) and turned back into a ledger. A copy is read: loading may rename an
    untrusted file aside."""
    with tempfile.TemporaryDirectory() as scratch:
        for name in (FILE_NAME, JOURNAL_NAME):
            if (state_dir / name).exists():
                shutil.copy(state_dir / name, Path(scratch) / name)
        loaded = PluginCheckpoint(CheckpointStore(scratch, machine_fingerprint(topology))).load()
        assert loaded is not None, f"{state_dir / FILE_NAME} is not a trusted checkpoint"
        payload = loaded.payload
    ctx = EngineContext.build(topology, config_from_mapping(CONFIG))
    pods, containers = records_from_dict(payload["records"])
    return SavedState(Ledger.restore(ctx, payload["ledger"]), pods, containers)


def run(client: CriClient, pod: Pod, image: BuiltImage) -> str:
    """Run ``pod`` with one container, ``work``, started; its id."""
    sandbox = client.run_pod(pod)
    container = client.create_container(sandbox, pod.container_config("work", image.ref))
    client.start_container(container)
    return container


def cgroup_cpus(client: CriClient, layout: CgroupLayout, container_id: str) -> frozenset[int]:
    path = container_cgroup_path(client.container_info(container_id))
    return read_cpuset(layout, path).cpu_ids


def spec_cpus(client: CriClient, container_id: str) -> frozenset[int] | None:
    """linux.resources.cpu.cpus of the OCI spec containerd keeps; None when unset."""
    spec = client.container_info(container_id)["runtimeSpec"]
    cpus = spec.get("linux", {}).get("resources", {}).get("cpu", {}).get("cpus", "")
    return parse_list(cpus) if cpus else None


def runtime_cpus(client: CriClient, layout: CgroupLayout, container_id: str) -> frozenset[int]:
    """The cgroup's cpuset.cpus once the container has a cgroup (runc makes it at
    StartContainer); before that, the spec's cpus, where unset means every online CPU."""
    info = client.container_info(container_id)
    path = container_cgroup_path(info)
    if (layout.mount / path.lstrip("/")).is_dir():
        return read_cpuset(layout, path).cpu_ids
    return spec_cpus(client, container_id) or BOTH


def live_cpusets(client: CriClient, layout: CgroupLayout) -> dict[str, frozenset[int]]:
    """Every created or running container the runtime lists, with the CPUs it runs on."""
    return {c.id: runtime_cpus(client, layout, c.id) for c in client.list_containers()
            if c.state in LIVE}


def assert_ledger_matches_runtime(state: SavedState, runtime: dict[str, frozenset[int]]) -> None:
    """The checkpoint knows exactly the live containers, each on the cpuset the runtime
    applied; exclusive CPUs belong to one container each, match the ledger and are outside the
    shared pool; shared containers run on the ledger's shared pool."""
    records = state.containers
    allocations = state.ledger.allocations
    assert set(records) == set(runtime), (sorted(records), sorted(runtime))
    owners: dict[int, str] = {}
    for cid, record in records.items():
        assert runtime[cid] == record.cpus, f"{record.name} ({cid}): runtime {sorted(runtime[cid])}"
        if record.exclusive:
            held = allocations.container(record.pod_uid, record.name)
            assert held is not None and held.exclusive_cpus == record.cpus, (record, held)
            for cpu in record.cpus:
                assert cpu not in owners, f"CPU {cpu} exclusive to {owners.get(cpu)} and {cid}"
                owners[cpu] = cid
        else:
            assert record.cpus == allocations.shared, (record, allocations.shared)
    assert not set(owners) & allocations.shared
    assert set(owners) | allocations.shared == BOTH

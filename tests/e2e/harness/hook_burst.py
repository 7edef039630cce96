"""A burst of container starts through real runc with nri-numa's OCI hooks: every container of
the burst created and started at once (`runc run --detach`), then all deleted at once (`runc
delete --force`, which runs the poststop hooks), with the hooks exactly as
hooks/runc-config.example.json ships them (their timeouts and options), only the paths pointed
at this lab. Shared by tests/e2e/test_oci_hook_burst.py and bench/bench_hook_burst.py.

How long each hook run took comes from the hook log: every run, placed or refused, logs one line
ending in ``(N ms)``, counted from the start of the hook process (the runtime's clock).
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from nri_numa.hook.client import SOCKET_ENV, SOCKET_NAME
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.model import Topology
from tests.e2e.harness.cgroups import CgroupLayout, detect_layout, remove_cgroups
from tests.e2e.harness.image import rootfs_layer
from tests.e2e.harness.runtimes import RUNC

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "hooks" / "runc-config.example.json"
KILLED = "ran past specified timeout"  # runc's word when it kills a hook at its timeout
_LOG_RUN = re.compile(r" (?:INFO|ERROR) hook\[(\d+)\] (\w+): (.*) \((\d+) ms\)$")


@dataclass
class BurstLab:
    base: Path
    rootfs: Path
    state: Path
    config: Path
    topology: Topology
    layout: CgroupLayout
    parent: str  # the cgroup parent of every container here
    hook: Path  # the nri-numa executable

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def log(self) -> Path:
        return self.state / "hook.log"

    def ledger(self) -> dict:
        payload = CheckpointStore(self.state, machine_fingerprint(self.topology)).load()
        return payload or {"records": {"containers": []}, "ledger": None, "processes": {}}


def make_lab(hook: Path, busybox: Path) -> BurstLab:
    """A rootfs, a state folder and a cgroup parent of their own, under one temp folder."""
    base = Path(tempfile.mkdtemp(prefix="nri-numa-burst-", dir="/tmp"))
    rootfs = base / "rootfs"
    rootfs.mkdir()
    with tarfile.open(fileobj=io.BytesIO(rootfs_layer(busybox))) as tar:
        tar.extractall(rootfs, filter="tar")
    topology = Topology.from_json(subprocess.run(
        [str(hook), "topology", "--json", "--no-nvml"], capture_output=True, text=True,
        check=True).stdout)
    config = base / "config.json"
    config.write_text(json.dumps({"cpuManagerPolicy": "static",
                                  "reservedSystemCPUs": str(min(topology.online_cpus)),
                                  "topologyManagerPolicy": "single-numa-node"}))
    return BurstLab(base, rootfs, _state_folder(base), config, topology, detect_layout(),
                    f"/nri-numa-burst-{uuid.uuid4().hex[:8]}", hook)


def _state_folder(base: Path) -> Path:
    """On tmpfs where there is one, as /run/nri-numa is on a real node (a save's fsync costs
    nothing there); the lab's folder links to it, and cleanup removes both."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        return base / "state"
    state = Path(tempfile.mkdtemp(prefix="nri-numa-burst-state-", dir=shm))
    (base / "state").symlink_to(state)
    return state


def documented_hooks(lab: BurstLab, drop: Iterable[str] = ()) -> dict:
    """The example's hooks, pointed at this lab: the executable, --config, --state-dir and the
    socket in the environment are replaced; timeouts and every other option stay as shipped.
    ``drop``: flags to leave out."""
    hooks = json.loads(EXAMPLE.read_text())["hooks"]
    dropped = set(drop)
    for entries in hooks.values():
        for hook in entries:
            args, out = hook["args"], []
            for i, arg in enumerate(args):
                if arg in dropped:
                    continue
                if i and args[i - 1] == "--config":
                    arg = str(lab.config)
                elif i and args[i - 1] == "--state-dir":
                    arg = str(lab.state)
                out.append(arg)
            hook["env"] = [f"{SOCKET_ENV}={lab.state / SOCKET_NAME}"
                           if e.startswith(f"{SOCKET_ENV}=") else e for e in hook["env"]]
            if out[1:3] == ["-I", "-S"]:  # the Python client, by path, from nri-numa's Python
                out[0] = str(lab.hook.with_name("python3"))
                out[3] = str(python_client(lab.hook))
                hook.update(path=out[0], args=out)
            else:
                hook.update(path=str(lab.hook), args=out)
    return hooks


@functools.lru_cache(maxsize=4)
def python_client(hook: Path) -> Path:
    """The Python client of the build whose ``nri-numa`` is ``hook`` (another build's with
    bench_hook_burst --hook)."""
    done = subprocess.run([str(hook.with_name("python3")), "-c",
                           "import nri_numa.hook.client as m; print(m.__file__)"],
                          capture_output=True, text=True, check=True, timeout=60)
    return Path(done.stdout.strip())


def hook_timeouts() -> tuple[float, float]:
    """(the runtime's hook timeout, the hook's own --timeout) as the example ships them."""
    hook = json.loads(EXAMPLE.read_text())["hooks"]["createRuntime"][0]
    args = hook["args"]
    return float(hook["timeout"]), float(args[args.index("--timeout") + 1])


def write_bundle(lab: BurstLab, name: str, cpus: int, hooks: dict) -> Path:
    """A bundle made from the example config: ``cpus`` exclusive CPUs (0: BestEffort)."""
    spec = json.loads(EXAMPLE.read_text())
    spec["root"] = {"path": str(lab.rootfs), "readonly": True}
    spec["process"]["args"] = ["/bin/sleep", "600"]
    spec["linux"]["cgroupsPath"] = f"{lab.parent}/{name}"
    resources = spec["linux"]["resources"]
    if cpus:
        resources["cpu"] = {"quota": cpus * 100_000, "period": 100_000}
    else:
        del resources["cpu"], resources["memory"]
    spec["hooks"] = hooks
    folder = lab.base / "bundles" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec))
    return folder


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stderr: str
    seconds: float


def at_once(lab: BurstLab, names: list[str], command: list[str]) -> dict[str, Outcome]:
    """``runc <command> NAME`` for every name, all released together."""
    gate = threading.Barrier(len(names))

    def one(name: str) -> Outcome:
        err_file = lab.base / f"{command[0]}-{name}.err"
        argv = [str(RUNC), "--root", str(lab.runc_root), *command, name]
        if command[0] == "run":
            argv[-1:-1] = ["--bundle", str(lab.base / "bundles" / name)]
        gate.wait()
        started = time.monotonic()
        # A detached container keeps runc's stdio: files, not pipes that would never close.
        with open(err_file, "w") as err:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err, timeout=120)
        return Outcome(done.returncode, err_file.read_text(), time.monotonic() - started)

    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(one, names)))


def runc_pid(lab: BurstLab, name: str) -> int:
    done = subprocess.run([str(RUNC), "--root", str(lab.runc_root), "state", name],
                          capture_output=True, text=True, check=True, timeout=60)
    return json.loads(done.stdout)["pid"]


def poststop_sweep(lab: BurstLab) -> subprocess.CompletedProcess:
    """One more poststop, for a container nobody placed, with all the time it needs: its
    transaction drops what the containers whose own poststop gave up still held."""
    state = json.dumps({"ociVersion": "1.0.2", "id": "sweep", "status": "stopped",
                        "bundle": str(lab.base)})
    return subprocess.run([str(lab.hook), "hook", "poststop", "--config", str(lab.config),
                           "--state-dir", str(lab.state), "--timeout", "60"],
                          input=state, capture_output=True, text=True, check=True, timeout=120)


@dataclass(frozen=True)
class HookRun:
    pid: int
    stage: str
    ok: bool
    line: str
    ms: int


def hook_runs(log_text: str) -> list[HookRun]:
    """One entry per hook process. A run the daemon took after its hook had given up is logged
    twice, by the hook (which gave up) and by the daemon (which then refuses it at once): the
    daemon's line is left out."""
    daemons = {int(m) for m in re.findall(r"hook daemon (\d+) listening on", log_text)}
    runs = []
    for line in log_text.splitlines():
        found = _LOG_RUN.search(line)
        if found:
            pid, stage, text, ms = found.groups()
            if int(pid) in daemons and text.startswith("gave up after"):
                continue
            runs.append(HookRun(int(pid), stage, " INFO " in line, text, int(ms)))
    return runs


def percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        return (0.0, 0.0, 0.0)

    def rank(p: int) -> float:
        return ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)]

    return rank(50), rank(99), ordered[-1]


def daemon_pids(state: Path) -> list[int]:
    """The hook daemons serving this state folder (started on demand by its hooks)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"hook-daemon" in argv and str(state).encode() in argv:
            pids.append(int(entry.name))
    return pids


def stop_daemons(state: Path, patience_s: float = 10) -> None:
    pids = daemon_pids(state)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + patience_s
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def cleanup(lab: BurstLab) -> None:
    if lab.runc_root.is_dir():
        for entry in lab.runc_root.iterdir():
            subprocess.run([str(RUNC), "--root", str(lab.runc_root), "delete", "--force",
                            entry.name], capture_output=True, timeout=60)
    stop_daemons(lab.state)
    remove_cgroups(lab.layout, [lab.parent])
    shutil.rmtree(lab.state, ignore_errors=True)
    shutil.rmtree(lab.base, ignore_errors=True)

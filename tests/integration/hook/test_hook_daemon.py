"""A real `nri-numa hook-daemon` process on a fake host, with `nri-numa hook` clients."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nri_numa.hook.client import SOCKET_NAME
from nri_numa.hook.entry import LOG_NAME
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import parse_list
from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle
from tests.integration.hook.test_hook_processes import CONFIG, CPUS_EACH, TOPOLOGY, hook

REPO = Path(__file__).resolve().parents[3]


def daemon_setup(tmp_path: Path) -> tuple[FakeHost, Path, list[str], list[str]]:
    """A fake host, the state folder, the options daemon and hooks share, and the hook's."""
    host = FakeHost(tmp_path / "host", 1, TOPOLOGY.online_cpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    state = tmp_path / "state"
    served = ["--state-dir", str(state), "--config", str(config),
              "--topology", str(topology_file(tmp_path, TOPOLOGY))]
    args = [*served, "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc)]
    return host, state, served, args


@pytest.fixture
def setup(tmp_path):
    return daemon_setup(tmp_path)


def start_daemon(served: list[str], state: Path) -> subprocess.Popen:
    daemon = subprocess.Popen([sys.executable, "-m", "nri_numa", "hook-daemon", *served],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # A stale socket may already be there: wait for this daemon's own word that it listens.
    listening = f"hook daemon {daemon.pid} listening on"
    log = state / LOG_NAME
    deadline = time.monotonic() + 20
    while not (log.exists() and listening in log.read_text()):
        assert daemon.poll() is None, daemon.communicate()
        assert time.monotonic() < deadline, "the daemon never listened"
        time.sleep(0.02)
    return daemon


@pytest.fixture
def daemon(setup):
    _, state, served, _ = setup
    process = start_daemon(served, state)
    yield process
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=10)


def create(host: FakeHost, cid: str, pid: int, cpus: int) -> bytes:
    bundle = write_bundle(host.base, cid, cpus)
    host.start(pid, f"/pods/{cid}")
    return oci_state(cid, pid, bundle)


def exclusive_cpus(host: FakeHost, state: Path) -> dict[str, frozenset[int]]:
    payload = CheckpointStore(state, machine_fingerprint(TOPOLOGY)).load()
    held = {r["id"]: parse_list(r["cpus"]) for r in payload["records"]["containers"]
            if r["exclusive"]}
    for cid, cpus in held.items():
        assert host.cpus(f"/pods/{cid}") == cpus
    return held


def test_the_daemon_serves_the_hook_on_a_private_socket(setup, daemon):
    host, state, _, args = setup
    assert stat.S_IMODE((state / SOCKET_NAME).stat().st_mode) == 0o600
    done = hook("createRuntime", args, create(host, "c1", 5001, 2))
    assert done.returncode == 0, done.stderr
    assert len(host.cpus("/pods/c1")) == 2
    # The run was the daemon's: its log line carries the daemon's pid.
    logged = (state / LOG_NAME).read_text()
    assert f"hook[{daemon.pid}] createRuntime: placed container c1" in logged
    stop = hook("poststop", args, oci_state("c1", None, host.base))
    assert stop.returncode == 0, stop.stderr
    assert exclusive_cpus(host, state) == {}


def test_a_hook_configured_otherwise_is_refused_with_a_reason(setup, daemon, tmp_path):
    host, state, _, args = setup
    other = tmp_path / "other.json"
    other.write_text(json.dumps(CONFIG))
    args = [other if a.endswith("config.json") else a for a in map(str, args)]
    done = hook("createRuntime", [str(a) for a in args], create(host, "c1", 5001, 2))
    assert done.returncode == 1 and done.stderr.decode().count("\n") == 1
    assert f"the hook daemon at {state}/hook.sock serves --config" in done.stderr.decode()


def test_concurrent_clients_never_get_the_same_cpu(setup, daemon):
    host, state, _, args = setup
    jobs = [(f"c{i}", create(host, f"c{i}", 5000 + i, CPUS_EACH if i < 10 else 0))
            for i in range(14)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda j: hook("createRuntime", args, j[1], timeout=30), jobs))
    refused = [r for r in results if r.returncode != 0]
    assert len(refused) == 10 - 94 // CPUS_EACH
    assert all("cpu: asked 10 exclusive CPUs" in r.stderr.decode() for r in refused)
    held = exclusive_cpus(host, state)
    assert len(held) == 94 // CPUS_EACH
    assert sum(map(len, held.values())) == len(frozenset().union(*held.values()))


def test_a_killed_daemon_fails_hooks_closed_then_they_run_in_process(setup, daemon):
    host, state, served, args = setup
    jobs = [create(host, f"c{i}", 5000 + i, 3) for i in range(12)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(hook, "createRuntime", args, job, 30) for job in jobs]
        time.sleep(0.3)
        daemon.send_signal(signal.SIGKILL)
        results = [f.result() for f in futures]
    for r in results:
        if r.returncode != 0:
            line = r.stderr.decode()
            assert line.startswith("nri-numa hook createRuntime: ") and line.count("\n") == 1
    # The socket outlived the daemon: nobody accepts on it, so a hook runs in process.
    assert (state / SOCKET_NAME).exists()
    late = hook("createRuntime", args, create(host, "late", 6000, 3))
    assert late.returncode == 0, late.stderr
    held = exclusive_cpus(host, state)
    assert "late" in held
    assert sum(map(len, held.values())) == len(frozenset().union(*held.values()))
    # A new daemon replaces the stale socket.
    again = start_daemon(served, state)
    try:
        assert hook("poststop", args, oci_state("late", None, host.base)).returncode == 0
        assert "late" not in exclusive_cpus(host, state)
        assert f"hook[{again.pid}] poststop:" in (state / LOG_NAME).read_text()
    finally:
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=10)
    assert again.returncode == 0 and not (state / SOCKET_NAME).exists()


def test_a_second_daemon_refuses_while_one_listens(setup, daemon):
    _, state, served, _ = setup
    second = subprocess.run([sys.executable, "-m", "nri_numa", "hook-daemon", *served],
                            cwd=REPO, capture_output=True, timeout=30)
    assert second.returncode == 1
    assert "another hook daemon listens on" in second.stderr.decode()
    assert (state / SOCKET_NAME).exists() and daemon.poll() is None

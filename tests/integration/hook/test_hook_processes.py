"""`nri-numa hook` as the runtimes run it: separate processes, the real lock file, stdin and exit
status. Many hooks at once must never hand one CPU to two containers, and every cgroup must end up
as the ledger says; a hook never outlives its --timeout and always says why it failed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nri_numa.hook.entry import LOG_NAME
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle

REPO = Path(__file__).resolve().parents[3]
TOPOLOGY = preset_topology("intel-2s-ht")  # 96 CPUs; 0 and 48 reserved: 94 to give out
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48",
          "topologyManagerPolicy": "none"}
EXCLUSIVE, SHARED, CPUS_EACH = 10, 4, 10  # 10 × 10 CPUs do not fit in 94: some are refused


@pytest.fixture
def setup(tmp_path):
    host = FakeHost(tmp_path / "host", 1, TOPOLOGY.online_cpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    state = tmp_path / "state"
    args = ["--state-dir", str(state), "--config", str(config),
            "--topology", str(topology_file(tmp_path, TOPOLOGY)),
            "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc)]
    return host, state, args


def hook(stage: str, args: list[str], stdin: bytes, timeout: float = 4.0,
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nri_numa", "hook", stage, *args,
                           "--timeout", str(timeout)],
                          input=stdin, capture_output=True, cwd=REPO, timeout=60)


def test_concurrent_hooks_never_share_an_exclusive_cpu(setup):
    host, state, args = setup
    jobs = []
    for i in range(EXCLUSIVE + SHARED):
        cid, pid = f"c{i}", 5000 + i
        bundle = write_bundle(host.base, cid, CPUS_EACH if i < EXCLUSIVE else 0)
        host.start(pid, f"/pods/{cid}")
        jobs.append((cid, oci_state(cid, pid, bundle)))
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip([cid for cid, _ in jobs], pool.map(
            lambda job: hook("createRuntime", args, job[1], timeout=30), jobs)))
    refused = {cid for cid, r in results.items() if r.returncode != 0}
    for cid in refused:
        line = results[cid].stderr.decode()
        assert line.startswith("nri-numa hook createRuntime:") and line.count("\n") == 1
        assert "cpu: asked 10 exclusive CPUs" in line, line
    assert refused and refused <= {f"c{i}" for i in range(EXCLUSIVE)}  # shared ones always fit
    assert len(refused) == EXCLUSIVE - 94 // CPUS_EACH

    payload = CheckpointStore(state, machine_fingerprint(TOPOLOGY)).load()
    records = {r["id"]: r for r in payload["records"]["containers"]}
    assert set(records) == set(results) - refused
    pool_cpus = parse_list(payload["ledger"]["allocations"]["shared"])
    seen: set[int] = set()
    for cid, record in records.items():
        on_disk = host.cpus(f"/pods/{cid}")
        if record["exclusive"]:
            assert on_disk == parse_list(record["cpus"]) and len(on_disk) == CPUS_EACH
            assert not on_disk & seen, f"{cid} shares CPUs with another container"
            seen |= on_disk
        else:
            assert on_disk == pool_cpus  # every move reached its cgroup
    assert not seen & pool_cpus and seen | pool_cpus == TOPOLOGY.online_cpus


def test_a_held_lock_fails_the_hook_within_its_timeout(setup):
    host, state, args = setup
    holder = CheckpointStore(state, "any")
    holder.lock()
    try:
        started = time.monotonic()
        done = hook("poststop", args, oci_state("c1", None, host.base), timeout=1.0)
        took = time.monotonic() - started
    finally:
        holder.unlock()
    assert done.returncode == 1 and took < 4  # the interpreter's start-up adds to the 1 s
    err = done.stderr.decode()
    assert err.count("\n") == 1 and "in use by another nri-numa" in err
    log = state / LOG_NAME
    assert "in use by another nri-numa" in log.read_text()
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600


def test_a_hook_never_blocks_past_its_timeout(setup):
    _, _, args = setup
    process = subprocess.Popen([sys.executable, "-m", "nri_numa", "hook", "createRuntime", *args,
                                "--timeout", "1"], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=REPO)
    try:  # stdin stays open and empty: a runtime that hangs
        status = process.wait(timeout=15)
        err = process.stderr.read()
    finally:
        process.kill()
        process.wait()
        process.stdin.close()
        process.stderr.close()
    assert status == 1 and b"gave up after 1 s" in err


@pytest.mark.parametrize("stdin, reason", [
    (b"not json", "not JSON"),
    (b'{"id": "c1", "pid": 99999999, "bundle": "/nonexistent"}', "cannot read the spec"),
])
def test_bad_input_fails_closed_with_a_reason(setup, stdin, reason):
    _, _, args = setup
    done = hook("createRuntime", args, stdin)
    assert done.returncode == 1 and reason in done.stderr.decode()
    assert done.stdout == b""


def test_precreate_prints_the_placed_spec(setup):
    host, _, args = setup
    cid = "ab" * 32
    spec = {"hooks": {"createRuntime": [{"path": "/x", "args": ["nri-numa", "hook",
                                                                "createRuntime"]}]},
            "linux": {"cgroupsPath": f"/libpod_parent/libpod-{cid}",
                      "resources": {"cpu": {"quota": 200000, "period": 100000},
                                    "memory": {"limit": 1 << 26}}}}
    done = hook("precreate", args, json.dumps(spec).encode())
    assert done.returncode == 0, done.stderr
    placed = json.loads(done.stdout)
    assert len(parse_list(placed["linux"]["resources"]["cpu"]["cpus"])) == 2
    assert placed["hooks"] == spec["hooks"]

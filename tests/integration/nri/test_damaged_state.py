"""`nri-numa run` always starts on damaged state, and `nri-numa state` always answers.

The agent runs as a real process against a listening NRI socket with the fake runtime behind it.
Whatever lies at its checkpoint's name (bytes nested 100000 deep, a 5000-digit version, a
directory, a FIFO, a socket, a symlink, a file past the size limit) is renamed aside with one
warning line naming where it went; the agent registers, adopts what runs from Synchronize and
places new containers; so is a lock file that is a symlink, a FIFO or a directory. `nri-numa
state` on the same file prints one line, exits 1 and moves nothing. SIGTERM stops a start-up
that waits on a file, and a log file that is a symlink or a FIFO is not written (the log goes to
standard error, with a warning there).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.topology.cpulist import format_list, parse_list
from tests import nri_messages as msg
from tests.damaged_state import DAMAGES, VICTIM_TEXT, damage, snapshot
from tests.integration.nri.fake_runtime import FakeRuntime
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from tests.integration.nri.plugin_env import agent_files, create, machine, new_plugin, saved_payload
from tests.tmpfs import fast_tmp

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def scratch(tmp_path: Path):
    with fast_tmp(tmp_path) as base:
        agent_files(base)
        yield base


def start_agent(scratch: Path, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nri_numa", "run", "--topology", str(scratch / "node.json"),
         "--config", str(scratch / "config.yaml"), "--state-dir", str(scratch / "state"),
         "--metrics-address", "off", "--pod-resources-socket", "",
         "--nri-socket", str(scratch / "nri.sock"), *args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.DEVNULL, stderr=stderr)


def stop(agent: subprocess.Popen[str]) -> str:
    """SIGTERM; the agent must end cleanly. Returns its standard error."""
    agent.send_signal(signal.SIGTERM)
    try:
        _, err = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert agent.returncode == 0, err
    return err or ""


def serve_runtime(scratch: Path, agent: subprocess.Popen[str]) -> FakeRuntime:
    """The runtime end of the agent's first connection, registered."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(scratch / "nri.sock"))
        listener.listen(1)
        listener.settimeout(1)
        deadline = time.monotonic() + 60
        while True:
            try:
                conn, _ = listener.accept()
                break
            except TimeoutError:
                if agent.poll() is not None or time.monotonic() > deadline:
                    _, err = agent.communicate(timeout=5)
                    raise AssertionError(f"the agent never connected (status "
                                         f"{agent.returncode}): {err}") from None
    runtime = FakeRuntime(conn).start()
    assert runtime.registered.wait(30)
    return runtime


RUNNING = msg.guaranteed(msg.pod("old"), "app", cpus=2)
RUNNING.state, RUNNING.pid = api.CONTAINER_RUNNING, 4242
RUNNING.linux.resources.cpu.cpus = "6-7"


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_the_agent_starts_on_a_damaged_checkpoint_sets_it_aside_and_serves(scratch, kind):
    state = scratch / "state"
    victim = damage(state / "checkpoint.json", kind)
    log = scratch / "agent.log"
    agent = start_agent(scratch, "--log-file", str(log))
    try:
        runtime = serve_runtime(scratch, agent)
        runtime.configure()
        synced = runtime.synchronize(api.SynchronizeRequest(pods=[msg.pod("old")],
                                                            containers=[RUNNING]))
        assert not synced.update  # adopted where it runs: 6-7
        new_pod = msg.pod("new")
        created = runtime.call("CreateContainer",
                               msg.create(new_pod, msg.guaranteed(new_pod, "app", cpus=2)),
                               api.CreateContainerResponse)
        given = parse_list(created.adjust.linux.resources.cpu.cpus)
        assert len(given) == 2 and not given & {0, 6, 7}  # not the reserved or adopted CPUs
        runtime.close()
    finally:
        stop(agent)
    [aside] = [p for p in state.iterdir() if p.name.startswith("checkpoint.json.corrupt-")]
    # One line from the checkpoint (the runtime closing the session may add one of its own).
    warnings = [line for line in log.read_text().splitlines()
                if " WARNING nri_numa.state." in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].endswith(f"checkpoint {state / 'checkpoint.json'} set aside as {aside}: "
                                f"{DAMAGES[kind]}; the state will be rebuilt from the runtime")
    written = saved_payload(state)
    cpus = {c["id"]: c["cpus"] for c in written["records"]["containers"]}
    assert cpus[RUNNING.id] == format_list({6, 7}) and len(cpus) == 2
    if victim is not None:
        assert aside.is_symlink() and victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_the_agent_starts_on_a_damaged_lock_sets_it_aside_and_serves(scratch, kind):
    state = scratch / "state"
    victim = damage(state / "lock", kind)
    log = scratch / "agent.log"
    agent = start_agent(scratch, "--log-file", str(log))
    try:
        runtime = serve_runtime(scratch, agent)
        runtime.configure()
        runtime.synchronize(api.SynchronizeRequest())
        new_pod = msg.pod("new")
        created = runtime.call("CreateContainer",
                               msg.create(new_pod, msg.guaranteed(new_pod, "app", cpus=2)),
                               api.CreateContainerResponse)
        assert len(parse_list(created.adjust.linux.resources.cpu.cpus)) == 2
        # The new lock is held: a second agent on the folder is refused, in one line.
        second = start_agent(scratch)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert err == (f"nri-numa: error: {state} is in use by another nri-numa; it holds "
                       f"{state / 'lock'}\n")
        runtime.close()
    finally:
        stop(agent)
    [aside] = [p for p in state.iterdir() if p.name.startswith("lock.corrupt-")]
    warnings = [line for line in log.read_text().splitlines()
                if " WARNING nri_numa.state." in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].endswith(f"lock {state / 'lock'} set aside as {aside}: {DAMAGES[kind]}; "
                                "a new lock is made")
    assert (state / "lock").is_file() and not (state / "lock").is_symlink()
    assert len(saved_payload(state)["records"]["containers"]) == 1
    if victim is not None:
        assert aside.is_symlink() and victim.read_text() == VICTIM_TEXT


def run_state(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nri_numa", "state", *args], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_state_names_a_damaged_checkpoint_in_one_line_and_moves_nothing(scratch, kind):
    state = scratch / "state"
    victim = damage(state / "checkpoint.json", kind)
    before = snapshot(state)
    done = run_state("--state-dir", str(state))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"nri-numa: error: {state / 'checkpoint.json'}: {DAMAGES[kind]}\n"
    assert snapshot(state) == before
    if victim is not None:
        assert victim.read_text() == VICTIM_TEXT


def test_state_refuses_a_state_folder_that_is_a_symlink(scratch):
    (scratch / "elsewhere").mkdir()
    (scratch / "state").symlink_to(scratch / "elsewhere")
    done = run_state("--state-dir", str(scratch / "state"))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"nri-numa: error: {scratch / 'state'}: it is a symlink: refusing to "
                           "use it as a folder (give the folder it points to)\n")


def test_the_agent_refuses_a_state_folder_that_is_a_symlink_and_writes_nothing_there(scratch):
    (scratch / "elsewhere").mkdir()
    (scratch / "state").symlink_to(scratch / "elsewhere")
    agent = start_agent(scratch)
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 1
    assert err == (f"nri-numa: error: state folder {scratch / 'state'}: it is a symlink: "
                   "refusing to use it as a folder (give the folder it points to)\n")
    assert list((scratch / "elsewhere").iterdir()) == []


def test_sigterm_ends_a_start_up_that_waits_on_a_file(scratch):
    """The configuration is a FIFO nobody writes: start-up blocks reading it. The handlers are
    in place before that read, so SIGTERM ends the agent cleanly, at once."""
    config = scratch / "config.yaml"
    config.unlink()
    os.mkfifo(config)
    agent = start_agent(scratch)
    time.sleep(2)  # into the blocking open of the FIFO
    assert agent.poll() is None
    err = stop(agent)
    assert "Traceback" not in err
    assert not (scratch / "state").exists()  # stopped before the state was touched


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_log_file_that_is_a_symlink_or_fifo_is_not_written(scratch, kind):
    log = scratch / "agent.log"
    victim = damage(log, kind)
    agent = start_agent(scratch, "--log-file", str(log))
    try:
        serve_runtime(scratch, agent).close()  # it starts and serves all the same
    finally:
        err = stop(agent)
    first = err.splitlines()[0]
    assert first.endswith(f"not logging to {log}: {DAMAGES[kind]}; logging to standard error")
    assert "synchronized" in err or "NRI session" in err  # the log went to standard error
    if victim is not None:
        assert victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("change, why", [
    (lambda p: p["ledger"]["allocations"].update(shared="0-4000000000"),
     "'0-4000000000': ids go up to 65535"),
    (lambda p: p["ledger"]["allocations"]["pods"]["uid-g"]["containers"]["app"]["hint"].update(
        affinity=[4000000000]), "affinity must be null or a list of NUMA node ids"),
    (lambda p: p["records"]["containers"][0]["request"]["device_numa_hints"].update(
        gpu=[4000000000]), "device_numa_hints['gpu'] must hold NUMA node ids"),
], ids=["cpu-list", "hint-node", "device-hint-node"])
def test_huge_ids_in_a_checksummed_checkpoint_set_it_aside_at_once(state_dir, caplog, change,
                                                                   why):
    """A payload whose checksum matches may still hold ids no machine has: a list of four
    billion CPUs, or a hint mask of node 4000000000, would take minutes and gigabytes."""
    caplog.set_level(logging.INFO)  # the journal's line too, whatever logging earlier tests set
    first = new_plugin(state_dir)
    g = msg.pod("g")
    create(first, g, msg.guaranteed(g, "app", cpus=2))
    store = CheckpointStore(state_dir, machine_fingerprint(machine()))
    payload = saved_payload(state_dir)
    change(payload)
    store.save(payload)  # a checkpoint in one file, as earlier versions wrote it
    started = time.monotonic()
    assert not new_plugin(state_dir).containers
    assert time.monotonic() - started < 10
    # One warning, the snapshot's (its journal goes aside with it in an info line).
    [line] = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "set aside as" in r.getMessage()]
    assert why in line, line

"""The hook on damaged or planted state, on a fake host: a ledger or a lock file it cannot use is
set aside on the next run, which warns in hook.log and places the container; a symlink where
the hook keeps a file (hook.log, the lock, the kept topology, the state folder itself,
hook.sock) is never written through, and a FIFO there never blocks a run."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from nri_numa.hook.entry import LOG_NAME, HookOptions, run
from nri_numa.hook.machine import TOPOLOGY_CACHE, cached_topology
from nri_numa.state.checkpoint import FILE_NAME, LOCK_NAME
from nri_numa.topology.synthetic import preset_topology, write_tree
from tests.damaged_state import DAMAGES, VICTIM_TEXT, damage
from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle
from tests.tmpfs import fast_tmp

REPO = Path(__file__).resolve().parents[3]
TOPOLOGY = preset_topology("intel-2s-ht")  # 96 CPUs; 0 and 48 reserved
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48"}
EMPTY_LEDGER = ("the hook starts from an empty ledger, so the CPUs of containers it placed "
                "before count as free")


@pytest.fixture
def base(tmp_path):
    with fast_tmp(tmp_path) as folder:
        yield folder


@pytest.fixture
def host(base) -> FakeHost:
    return FakeHost(base / "host", 1, TOPOLOGY.online_cpus)


def options(base: Path, host: FakeHost, stage: str = "createRuntime") -> HookOptions:
    config = base / "config.json"
    config.write_text(json.dumps(CONFIG))
    return HookOptions(stage, state_dir=base / "state", config_file=config,
                       topology_file=topology_file(base, TOPOLOGY),
                       cgroup_root=host.cgroup_root, proc_root=host.proc)


def create(base: Path, host: FakeHost, cid: str = "c1", pid: int = 4001,
           **changes) -> tuple[int, str]:
    """One in-process createRuntime for an exclusive container (2 CPUs), within 10 s: (exit
    status, stderr)."""
    bundle = write_bundle(host.base, cid, 2)
    host.start(pid, f"/pods/{cid}")
    hook = replace(options(base, host), **changes)
    err = io.StringIO()
    # In the test's main thread (the hook's timer is a SIGALRM there). A FIFO it blocked on
    # would stop the test: a watchdog's SIGUSR1 interrupts the blocking call after 10 s.
    previous = signal.signal(signal.SIGUSR1, _blocked)
    watchdog = threading.Timer(10, os.kill, (os.getpid(), signal.SIGUSR1))
    watchdog.start()
    try:
        code = run(hook, io.BytesIO(oci_state(cid, pid, bundle)), io.StringIO(), err)
    finally:
        watchdog.cancel()
        signal.signal(signal.SIGUSR1, previous)
    return code, err.getvalue()


def _blocked(signum, frame):
    raise AssertionError("the hook run was still blocked after 10 s")


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_ledger_is_set_aside_and_the_container_placed(base, host, kind):
    state = base / "state"
    victim = damage(state / FILE_NAME, kind)
    code, err = create(base, host)
    assert (code, err) == (0, "")
    assert len(host.cpus("/pods/c1")) == 2  # pinned to its own CPUs
    [aside] = [p for p in state.iterdir() if p.name.startswith(f"{FILE_NAME}.corrupt-")]
    [warning] = [line for line in (state / LOG_NAME).read_text().splitlines()
                 if " WARNING " in line]
    assert warning.endswith(f"checkpoint {state / FILE_NAME} set aside as {aside}: "
                            f"{DAMAGES[kind]}; {EMPTY_LEDGER}")
    ledger = json.loads((state / FILE_NAME).read_text())
    assert list(ledger["payload"]["processes"]) == ["c1"]
    if victim is not None:
        assert aside.is_symlink() and victim.read_text() == VICTIM_TEXT
    code, err = create(base, host, "c2", 4002)  # and the next run uses the new ledger
    assert (code, err) == (0, "") and not host.cpus("/pods/c1") & host.cpus("/pods/c2")


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_hook_log_that_is_not_a_file_is_not_written_and_the_run_goes_on(base, host, kind):
    log = base / "state" / LOG_NAME
    victim = damage(log, kind)
    code, err = create(base, host)
    assert code == 0
    assert err == (f"nri-numa hook createRuntime: warning: not logging to {log}: "
                   f"{DAMAGES[kind]}\n")
    assert len(host.cpus("/pods/c1")) == 2
    if victim is not None:
        assert victim.read_text() == VICTIM_TEXT


def test_a_hook_log_that_cannot_take_a_line_costs_the_line_not_the_run(base, host, capsys):
    code, err = create(base, host, log_file=Path("/dev/full"))  # every write: ENOSPC
    assert (code, err) == (0, "")
    assert len(host.cpus("/pods/c1")) == 2
    assert capsys.readouterr().err == ""  # where logging reports a line it could not write


def test_a_full_hook_log_is_rotated_without_following_a_planted_old_log(base, host):
    state = base / "state"
    state.mkdir()
    (state / LOG_NAME).write_bytes(b"x" * ((1 << 20) + 1))
    victim = damage(state / (LOG_NAME + ".1"), "symlink")  # the rename replaces the link
    assert create(base, host) == (0, "")
    assert victim.read_text() == VICTIM_TEXT
    assert (state / (LOG_NAME + ".1")).stat().st_size == (1 << 20) + 1
    assert "placed container c1" in (state / LOG_NAME).read_text()


def test_a_state_folder_that_is_a_symlink_fails_the_run_in_one_line(base, host):
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    (base / "state").symlink_to(elsewhere)
    code, err = create(base, host)
    assert code == 1
    assert err == (f"nri-numa hook createRuntime: state folder {base / 'state'}: it is a "
                   "symlink: refusing to use it as a folder (give the folder it points to)\n")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_lock_that_is_not_a_file_is_set_aside_and_the_container_placed(base, host, kind):
    state = base / "state"
    victim = damage(state / LOCK_NAME, kind)
    code, err = create(base, host)
    assert (code, err) == (0, "")
    assert len(host.cpus("/pods/c1")) == 2
    [aside] = [p for p in state.iterdir() if p.name.startswith(f"{LOCK_NAME}.corrupt-")]
    [warning] = [line for line in (state / LOG_NAME).read_text().splitlines()
                 if " WARNING " in line]
    assert warning.endswith(f"lock {state / LOCK_NAME} set aside as {aside}: {DAMAGES[kind]}; "
                            "a new lock is made")
    assert (state / LOCK_NAME).is_file() and not (state / LOCK_NAME).is_symlink()
    if victim is not None:
        assert aside.is_symlink() and victim.read_text() == VICTIM_TEXT
    code, err = create(base, host, "c2", 4002)  # the next run takes the new lock, quietly
    assert (code, err) == (0, "") and not host.cpus("/pods/c1") & host.cpus("/pods/c2")
    assert len([p for p in state.iterdir() if p.name.startswith(f"{LOCK_NAME}.corrupt-")]) == 1


def test_a_dangling_lock_symlink_makes_nothing_where_it_points(base, host):
    state = base / "state"
    state.mkdir()
    target = base / "made-through-the-lock"
    (state / LOCK_NAME).symlink_to(target)
    assert create(base, host) == (0, "")
    assert not target.exists()


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory):
    with fast_tmp(tmp_path_factory.mktemp("sysfs")) as root:
        write_tree(TOPOLOGY, root)
        yield root


@pytest.mark.parametrize("kind", ["symlink", "nested", "digits", "fifo", "directory"])
def test_a_kept_topology_that_cannot_be_used_is_discovered_again(base, sysfs, kind):
    state = base / "state"
    victim = damage(state / TOPOLOGY_CACHE, kind)
    if kind == "symlink":  # a good topology behind the link: still not followed
        victim.write_text(TOPOLOGY.to_json())
    result: list = []
    reader = threading.Thread(target=lambda: result.append(cached_topology(state, sysfs)),
                              daemon=True)
    reader.start()
    reader.join(30)
    assert result and result[0].online_cpus == TOPOLOGY.online_cpus
    if kind == "directory":  # cannot be replaced by a rename: discovered at every run
        assert (state / TOPOLOGY_CACHE).is_dir()
    else:
        assert (state / TOPOLOGY_CACHE).is_file() and not (state / TOPOLOGY_CACHE).is_symlink()
    if victim is not None:
        assert victim.read_text() == TOPOLOGY.to_json()


def test_the_hook_daemon_refuses_a_state_folder_that_is_a_symlink(base, host):
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    (base / "state").symlink_to(elsewhere)
    hook = options(base, host)
    done = subprocess.run([sys.executable, "-m", "nri_numa", "hook-daemon", "--state-dir",
                           str(base / "state"), "--config", str(hook.config_file),
                           "--topology", str(hook.topology_file)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"nri-numa: error: state folder {base / 'state'}: it is a symlink: refusing to use it "
        "as a folder (give the folder it points to)")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("extra", [[], ["--start-daemon"]], ids=["in-process", "start-daemon"])
def test_a_hook_process_makes_nothing_in_a_symlinked_state_folder(base, host, extra):
    """Nothing of the hook's lands where the link points: not the turn files, the daemon's
    start lock or socket, the log, the lock or the ledger. One line says why."""
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    (base / "state").symlink_to(elsewhere)
    hook = options(base, host)
    bundle = write_bundle(host.base, "c1", 2)
    host.start(4001, "/pods/c1")
    done = subprocess.run(
        [sys.executable, "-m", "nri_numa", "hook", "createRuntime", "--state-dir",
         str(base / "state"), "--config", str(hook.config_file), "--topology",
         str(hook.topology_file), "--cgroup-root", str(host.cgroup_root), "--proc-root",
         str(host.proc), *extra],
        input=oci_state("c1", 4001, bundle), cwd=REPO, capture_output=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"nri-numa hook createRuntime: state folder {base / 'state'}: it is a symlink: refusing "
        "to use it as a folder (give the folder it points to)\n")
    assert list(elsewhere.iterdir()) == []

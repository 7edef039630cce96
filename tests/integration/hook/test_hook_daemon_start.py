"""How a hook daemon comes to listen: a listening socket handed over as systemd's socket unit
hands it (LISTEN_FDS/LISTEN_PID), or a hook with --start-daemon starting one when none listens.
Real processes on a fake host, as tests/integration/hook/test_hook_daemon.py runs them."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nri_numa.hook.client import SOCKET_NAME
from nri_numa.hook.entry import LOG_NAME
from tests.integration.hook.fake_host import FakeHost, oci_state
from tests.integration.hook.test_hook_daemon import create, daemon_setup, exclusive_cpus
from tests.integration.hook.test_hook_processes import CONFIG, hook

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def setup(tmp_path) -> Iterator[tuple[FakeHost, Path, list[str], list[str]]]:
    host, state, served, args = daemon_setup(tmp_path)
    yield host, state, served, args
    stop_daemons(state)


def daemon_pids(state: Path) -> list[int]:
    """The hook daemons of this state folder (one started by a hook is no child of the test)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if b"hook-daemon" in argv and str(state).encode() in argv:
            found.append(int(entry.name))
    return found


def stop_daemons(state: Path) -> None:
    pids = daemon_pids(state)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def wait_for_log(state: Path, text: str, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        log = (state / LOG_NAME).read_text() if (state / LOG_NAME).exists() else ""
        if text in log:
            return log
        time.sleep(0.02)
    raise AssertionError(f"never logged: {text}")


def bound_socket(path: Path) -> socket.socket:
    """What systemd's socket unit makes of ListenStream=path."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    return listener


def activated_daemon(served: list[str], listener: socket.socket, count: str = "1",
                     ) -> subprocess.Popen:
    """`nri-numa hook-daemon` started the way systemd starts a socket-activated service: the
    socket as descriptor 3, LISTEN_FDS, and LISTEN_PID naming the daemon's own pid."""
    fd = listener.fileno()
    # A launcher hands the socket over and execs the daemon, which keeps its pid. Not a
    # preexec_fn: that runs Python in a forked copy of this process, where earlier tests' gRPC
    # threads are missing (gRPC's poller aborted such a child).
    hand_over = ("import os, sys; fd = int(sys.argv[1]); os.dup2(fd, 3); fd == 3 or os.close(fd); "
                 f"os.environ.update(LISTEN_FDS={count!r}, LISTEN_PID=str(os.getpid())); "
                 "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")
    return subprocess.Popen([sys.executable, "-c", hand_over, str(fd), "-m", "nri_numa", "hook-daemon",
                             *served],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(fd,))


def test_a_socket_handed_over_is_served_and_left_in_place(setup):
    host, state, served, args = setup
    path = state / SOCKET_NAME
    listener = bound_socket(path)
    # A hook that comes before the daemon is even started waits in the socket's backlog.
    with ThreadPoolExecutor(1) as pool:
        early = pool.submit(hook, "createRuntime", args, create(host, "c1", 5001, 2), 20.0)
        time.sleep(0.3)
        daemon = activated_daemon(served, listener)
        listener.close()  # systemd keeps its copy; here the daemon's is the only one
        try:
            done = early.result()
            assert done.returncode == 0, done.stderr
            log = wait_for_log(state, f"hook daemon {daemon.pid} listening on {path} (socket "
                                      "handed over)")
            assert f"hook[{daemon.pid}] createRuntime: placed container c1" in log
            assert len(host.cpus("/pods/c1")) == 2
            stop = hook("poststop", args, oci_state("c1", None, host.base))
            assert stop.returncode == 0, stop.stderr
            assert exclusive_cpus(host, state) == {}
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.communicate(timeout=10)
    assert daemon.returncode == 0
    assert stat.S_ISSOCK(path.lstat().st_mode)  # the socket unit's: never removed by the daemon


@pytest.mark.parametrize("count, elsewhere, reason", [
    ("2", False, "LISTEN_FDS=2: the hook daemon serves exactly one socket"),
    ("1", True, "but hooks look for"),
])
def test_a_socket_it_cannot_serve_is_refused_with_a_reason(setup, tmp_path, count, elsewhere,
                                                           reason):
    _, state, served, _ = setup
    listener = bound_socket(tmp_path / "other.sock" if elsewhere else state / SOCKET_NAME)
    try:
        daemon = activated_daemon(served, listener, count)
        _, err = daemon.communicate(timeout=30)
    finally:
        listener.close()
    assert daemon.returncode == 1
    assert reason in err.decode(), err


def test_an_activated_daemon_answers_a_bad_configuration_with_its_reason(setup, tmp_path):
    host, state, served, args = setup
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    served = [broken.as_posix() if s.endswith("config.json") else s for s in served]
    args = [broken.as_posix() if s.endswith("config.json") else s for s in args]
    listener = bound_socket(state / SOCKET_NAME)
    daemon = activated_daemon(served, listener)
    listener.close()
    try:
        done = hook("createRuntime", args, create(host, "c1", 5001, 2), 20.0)
        assert done.returncode == 1 and done.stderr.decode().count("\n") == 1
        assert str(broken) in done.stderr.decode()
        assert daemon.poll() is None  # still serving: a fixed file is read at the next run
        broken.write_text(json.dumps(CONFIG))
        fixed = hook("createRuntime", args, create(host, "c2", 5002, 2), 20.0)
        assert fixed.returncode == 0, fixed.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=10)


def test_start_daemon_starts_one_daemon_for_a_burst_of_hooks(setup):
    host, state, _, args = setup
    args = [*args, "--start-daemon"]
    jobs = [create(host, f"c{i}", 5000 + i, 3 if i < 6 else 0) for i in range(16)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: hook("createRuntime", args, job, 20.0), jobs))
    assert [r.returncode for r in results] == [0] * len(jobs), [r.stderr for r in results]
    [pid] = daemon_pids(state)
    log = (state / LOG_NAME).read_text()
    assert log.count("listening on") == 1 and "(socket handed over)" in log
    assert log.count(f"hook[{pid}] createRuntime: placed container") == len(jobs)
    held = exclusive_cpus(host, state)
    assert len(held) == 6 and sum(map(len, held.values())) == 18
    # Detached: a session of its own (not the runtime's, whose end would take it along), cwd /,
    # and nothing of the hook's open (the runtime's pipes, which it reads until all close).
    assert os.getsid(pid) != os.getsid(0) and os.readlink(f"/proc/{pid}/cwd") == "/"
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"
    stop_daemons(state)
    # Killed or stopped, the next hook starts another on the socket left behind.
    again = hook("poststop", args, oci_state("c0", None, host.base))
    assert again.returncode == 0, again.stderr
    assert len(daemon_pids(state)) == 1 and "c0" not in exclusive_cpus(host, state)


def test_a_daemon_that_cannot_start_leaves_the_hook_to_run_in_process(setup):
    host, state, _, args = setup
    state.mkdir(parents=True)
    (state / SOCKET_NAME).write_text("not a socket")
    done = hook("createRuntime", [*args, "--start-daemon"], create(host, "c1", 5001, 2))
    assert done.returncode == 0, done.stderr
    log = (state / LOG_NAME).read_text()
    assert "WARNING" in log and "cannot start the hook daemon" in log
    assert "exists and is not a socket; remove it); running in process" in log
    assert "createRuntime: placed container c1" in log and daemon_pids(state) == []

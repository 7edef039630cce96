"""The pieces that keep a hook within its deadline and start its daemon: the process's age, the
guard, the client's flags, turns for runs in process, the start lock's socket, and the socket a
daemon is handed (LISTEN_FDS). Processes and sockets of their own, no fake host."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nri_numa.hook import deadline, ondemand, turns
from nri_numa.hook.activation import ActivationError, inherited_listener


def test_the_age_counts_from_the_process_start_not_from_our_code():
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.3); "
                           "from nri_numa.hook.deadline import process_age; print(process_age())"],
                          capture_output=True, text=True, check=True)
    took = time.monotonic() - started
    assert 0.3 <= float(done.stdout) <= took + 0.02  # clock ticks are 10 ms


def test_a_guard_outside_the_main_thread_does_nothing():
    guard = deadline.Guard("poststop", 0.01, "/nonexistent/hook.log")
    worker = threading.Thread(target=guard.arm)
    worker.start()
    worker.join()
    time.sleep(0.05)  # an armed guard would have ended this process by now
    guard.disarm()


def test_give_up_lines_name_the_deadline():
    counted = "(--timeout, counted from the start of the hook process)"
    assert deadline.gave_up(4, "loading the engine", "hint") == \
        f"gave up after 4 s {counted} while loading the engine: hint"
    assert deadline.gave_up_early(2.5, "waiting for X") == \
        f"gave up waiting for X, to end within 2.5 s {counted}"


def test_the_daemon_reads_the_start_of_the_process_that_connected(tmp_path):
    """SO_PEERCRED's pid, then /proc/PID/stat: the hook process's age, not the connection's."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(tmp_path / "s"))
        listener.listen(1)
        hook = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; "
                                 "time.sleep(0.5); s = socket.socket(socket.AF_UNIX); "
                                 "s.connect(sys.argv[1]); s.recv(1)", listener.getsockname()])
        started = time.monotonic()
        conn, _ = listener.accept()
        with conn:
            accepted = time.monotonic()
            peer = deadline.peer_started(conn)
            conn.sendall(b"x")
        hook.wait(10)
    # It connected half a second after it started; clock ticks are 10 ms.
    assert started - 0.05 <= peer <= accepted - 0.5


def test_the_daemon_started_on_demand_gets_the_hooks_files():
    argv = ondemand.daemon_command("/run/n", {"config": "/etc/c.json", "timeout": "4"})
    assert argv[1:] == ["-m", "nri_numa", "hook-daemon", "--state-dir", "/run/n", "--config",
                        "/etc/c.json"]
    with pytest.raises(ondemand.StartError, match="c.json is a relative path"):
        ondemand.daemon_command("/run/n", {"config": "c.json"})


def test_turns_are_one_per_cpu_and_wait_only_while_time_is_left(tmp_path):
    first = turns.take_turn(str(tmp_path), lambda: 1.0, count=2)
    second = turns.take_turn(str(tmp_path), lambda: 1.0, count=2)
    assert first is not None and second is not None
    started = time.monotonic()
    assert turns.take_turn(str(tmp_path), lambda: 0.2 - (time.monotonic() - started),
                           count=2) is None
    assert 0.2 <= time.monotonic() - started < 1
    turns.release(first)
    third = turns.take_turn(str(tmp_path), lambda: 1.0, count=2)
    assert third is not None
    turns.release(second)
    turns.release(third)
    assert stat.S_IMODE((tmp_path / f"{turns.TURN_PREFIX}0").stat().st_mode) == 0o600


def test_the_start_lock_is_waited_for_only_while_time_is_left(tmp_path):
    held = ondemand.take_start_lock(str(tmp_path))
    try:
        started = time.monotonic()
        assert ondemand.take_start_lock(str(tmp_path),
                                        lambda: 0.1 - (time.monotonic() - started)) is None
    finally:
        os.close(held)
    again = ondemand.take_start_lock(str(tmp_path), lambda: 1.0)
    assert again is not None
    os.close(again)


def test_a_stale_socket_is_replaced_and_anything_else_refused(tmp_path):
    path = tmp_path / "hook.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a daemon that died: the file stays, nobody listens
    listener = ondemand.bind_listener(str(path))
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))
    finally:
        listener.close()
    other = tmp_path / "file"
    other.write_text("")
    with pytest.raises(ondemand.StartError, match="exists and is not a socket"):
        ondemand.bind_listener(str(other))


def test_listen_variables_for_another_process_are_ignored(tmp_path):
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    assert inherited_listener(tmp_path / "hook.sock", env) is None
    assert env == {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
    assert inherited_listener(tmp_path / "hook.sock", {}) is None


def test_more_than_one_socket_is_refused_and_the_variables_are_not_passed_on(tmp_path):
    env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"}
    with pytest.raises(ActivationError, match="LISTEN_FDS=2"):
        inherited_listener(tmp_path / "hook.sock", env)
    assert env == {}


def test_the_lock_files_are_never_followed_through_a_link(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / ondemand.START_LOCK_NAME).symlink_to(target)
    with pytest.raises(OSError):
        ondemand.take_start_lock(str(tmp_path))
    assert not target.exists()


def test_the_give_up_line_is_never_written_through_a_link_or_into_a_fifo(tmp_path):
    target = tmp_path / "elsewhere"
    (tmp_path / "linked.log").symlink_to(target)
    deadline.log_line(str(tmp_path / "linked.log"), "poststop", "gave up")
    assert not target.exists()
    os.mkfifo(tmp_path / "fifo.log")
    started = time.monotonic()
    deadline.log_line(str(tmp_path / "fifo.log"), "poststop", "gave up")  # no reader: no wait
    assert time.monotonic() - started < 1
    deadline.log_line(str(tmp_path / "hook.log"), "poststop", "gave up (5 ms)")
    line = (tmp_path / "hook.log").read_text()
    assert line.endswith(f" ERROR hook[{os.getpid()}] poststop: gave up (5 ms)\n")
    assert stat.S_IMODE((tmp_path / "hook.log").stat().st_mode) == 0o600


def test_the_shipped_hooks_keep_the_measured_margins():
    """docs/oci-hook.md, "Burst-proof setup": 2 s between the hook's deadline and the runtime's,
    and the daemon started on demand, in every shipped hook."""
    import json

    hooks_dir = Path(__file__).resolve().parents[3] / "hooks"
    spec = json.loads((hooks_dir / "runc-config.example.json").read_text())
    hooks = [h for entries in spec["hooks"].values() for h in entries]
    hooks += [json.loads(f.read_text())["hook"] for f in sorted(hooks_dir.glob("nri-numa-*.json"))]
    assert len(hooks) == 5
    for hook in hooks:
        own = float(hook["args"][hook["args"].index("--timeout") + 1])
        assert hook["timeout"] - own >= 2 and "--start-daemon" in hook["args"]

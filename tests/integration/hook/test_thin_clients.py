"""The hook's two thin clients, nri_numa/hook/client.py run by path (``python3 -I -S``) and the
compiled nri-numa-hook-client, as a runtime runs them: the same wire to a hook daemon (arguments
and the three standard descriptors), the daemon's exit status as theirs, and ``nri-numa hook``
in their own process when no daemon takes the run. Real processes, real sockets, a fake host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nri_numa.hook.client import SOCKET_ENV, SOCKET_NAME
from nri_numa.hook.entry import LOG_NAME
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from tests.integration.hook.fake_host import oci_state
from tests.integration.hook.test_hook_daemon import (  # noqa: F401 (daemon: a fixture)
    create, daemon, daemon_setup, exclusive_cpus)
from tests.integration.hook.test_hook_daemon_start import daemon_pids, stop_daemons, wait_for_log
from tests.integration.hook.test_hook_processes import TOPOLOGY

REPO = Path(__file__).resolve().parents[3]
PYTHON_CLIENT = [sys.executable, "-I", "-S", str(REPO / "nri_numa" / "hook" / "client.py")]
HOOK = [sys.executable, "-m", "nri_numa", "hook"]


@pytest.fixture(params=["python", "c"])
def client(request) -> list[str]:
    """The command that runs a thin client: the Python one, or the C one."""
    if request.param == "python":
        return PYTHON_CLIENT
    return [str(request.getfixturevalue("c_client_binary"))]


@pytest.fixture
def setup(tmp_path):
    host, state, served, args = daemon_setup(tmp_path)
    yield host, state, served, args
    stop_daemons(state)  # one a test had started by --start-daemon


def run(command: list[str], args: list, stdin: bytes | None, state: Path,
        **kwargs) -> subprocess.CompletedProcess:
    """``command ARGS`` as a runtime runs a hook: in a folder of no interest (the bundle), the
    socket named in its environment as the shipped hooks name it."""
    env = {**os.environ, SOCKET_ENV: str(state / SOCKET_NAME)}
    return subprocess.run([*command, *args], input=stdin, capture_output=True, cwd="/", env=env,
                          timeout=60, **kwargs)


class RecordingDaemon:
    """Takes one run on ``<state>/hook.sock`` as the hook daemon takes it, records the
    arguments and what it read from the stdin passed, writes to the stdout and stderr passed and
    answers ``status`` (None: hangs up without a word)."""

    def __init__(self, state: Path, status: int | None = 7):
        state.mkdir(parents=True, exist_ok=True)
        self.path = state / SOCKET_NAME
        self.status = status
        self.runs: list[tuple[bytes, bytes]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                data, fds = b"", []
                while True:
                    chunk, got, _, _ = socket.recv_fds(conn, 1 << 16, 3)
                    data, fds = data + chunk, fds + got
                    if not chunk:
                        break
                if self.status is None or len(fds) != 3:
                    self.runs.append((data, b""))
                    for fd in fds:
                        os.close(fd)
                    continue
                with open(fds[0], "rb") as stdin:
                    self.runs.append((data, stdin.read()))
                os.write(fds[1], b"out\n")
                os.write(fds[2], b"err\n")
                os.close(fds[1])
                os.close(fds[2])
                conn.sendall(bytes([self.status]))

    def close(self) -> None:
        self.listener.close()
        self.path.unlink()


@pytest.mark.parametrize("args, stdin", [
    (["createRuntime"], b'{"id": "c1", "pid": 42}'),
    (["poststop", "--config=/etc/c.json", "", "--timeout", "2.5"], b""),
    (["precreate", b"--config=/etc/\xff\xfe\xed\xa0\x80", "caf\u00e9 \U0001f600"],
     bytes(range(256)) * 1000),
], ids=["plain", "an-empty-argument", "not-utf8"])
def test_both_clients_send_the_arguments_and_descriptors_and_exit_with_the_answer(
        tmp_path, client, args, stdin):
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    try:
        done = run(client, args, stdin, state)
    finally:
        daemon.close()
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    sent = b"".join((a if isinstance(a, bytes) else a.encode()) + b"\0" for a in args)
    assert daemon.runs == [(sent, stdin)]


def test_a_daemon_that_hangs_up_fails_the_hook_closed_in_one_line(tmp_path, client):
    state = tmp_path / "state"
    daemon = RecordingDaemon(state, status=None)
    try:
        done = run(client, ["poststop"], b"{}", state)
    finally:
        daemon.close()
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode() == (f"nri-numa hook: the hook daemon at {state}/hook.sock "
                                    "closed the connection before answering\n")
    assert daemon.runs == [(b"poststop\0", b"")]


def test_the_daemon_runs_the_hook_and_the_client_relays_it(setup, daemon, client):
    host, state, _, args = setup
    done = run(client, ["createRuntime", *args], create(host, "c1", 5001, 3), state)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert len(exclusive_cpus(host, state)["c1"]) == 3
    logged = (state / LOG_NAME).read_text()
    assert f"hook[{daemon.pid}] createRuntime: placed container c1" in logged
    host.stop(5001)
    done = run(client, ["poststop", *args], oci_state("c1", None, host.base), state)
    assert done.returncode == 0, done.stderr
    assert exclusive_cpus(host, state) == {}


def nothing_saved(state: Path) -> bool:
    return CheckpointStore(state, machine_fingerprint(TOPOLOGY)).load() is None


def one_line(text: bytes, stage: str = "createRuntime") -> str:
    lines = text.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"nri-numa hook {stage}: ")
    return lines[0]


@pytest.mark.parametrize("option", ["--config", "--topology", "--state-dir"])
def test_a_hook_configured_otherwise_is_refused_in_one_line(setup, daemon, tmp_path, client,
                                                          option):
    host, state, _, args = setup
    other = tmp_path / "other"
    other.write_text("{}")
    args = [*args, option, str(other)]
    done = run(client, ["createRuntime", *args], create(host, "c1", 5001, 1), state)
    assert done.returncode == 1
    assert f"the hook daemon at {state}/hook.sock serves {option} " in one_line(done.stderr)
    assert nothing_saved(state)


@pytest.mark.parametrize("stdin", [b"", b"not json \xff\xfe", b'{"id": "c1"}'])
def test_bad_stdin_is_one_line(setup, daemon, stdin, client):
    _, state, _, args = setup
    done = run(client, ["createRuntime", *args], stdin, state)
    assert done.returncode == 1 and done.stdout == b""
    one_line(done.stderr)


def test_without_a_daemon_the_hook_runs_in_the_clients_own_process(setup, client):
    host, state, _, args = setup
    env = {**os.environ, SOCKET_ENV: str(state / SOCKET_NAME)}
    process = subprocess.Popen([*client, "createRuntime", *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", env=env)
    out, err = process.communicate(create(host, "c1", 5001, 2), timeout=60)
    assert (process.returncode, out, err) == (0, b"", b"")
    # The same process (exec): its pid is the one that logged the run, and no daemon ran it.
    assert f"hook[{process.pid}] createRuntime: placed container c1" in \
        (state / LOG_NAME).read_text()
    assert len(exclusive_cpus(host, state)["c1"]) == 2 and daemon_pids(state) == []


def test_a_socket_nobody_listens_on_means_no_daemon(setup, client):
    host, state, _, args = setup
    state.mkdir(parents=True)
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(state / SOCKET_NAME))  # bound, never listening: refused, as a dead daemon's
    try:
        done = run(client, ["createRuntime", *args], create(host, "c1", 5001, 1), state)
    finally:
        left.close()
    assert done.returncode == 0, done.stderr
    assert "c1" in exclusive_cpus(host, state)


def test_start_daemon_starts_one_and_hands_it_the_run(setup, client):
    host, state, _, args = setup
    args = ["createRuntime", *args, "--start-daemon"]
    done = run(client, args, create(host, "c1", 5001, 2), state)
    assert done.returncode == 0, done.stderr
    [pid] = daemon_pids(state)
    log = wait_for_log(state, "(socket handed over)")
    assert f"hook[{pid}] createRuntime: placed container c1" in log
    done = run(client, args, create(host, "c2", 5002, 2), state)
    assert done.returncode == 0, done.stderr
    assert daemon_pids(state) == [pid]
    assert f"hook[{pid}] createRuntime: placed container c2" in (state / LOG_NAME).read_text()


def test_stdin_left_open_gives_up_at_the_timeout_saying_so(setup, daemon, client):
    _, state, _, args = setup
    env = {**os.environ, SOCKET_ENV: str(state / SOCKET_NAME)}
    process = subprocess.Popen([*client, "poststop", *args, "--timeout", "1"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd="/", env=env)
    try:
        process.wait(timeout=10)  # stdin stays open: never written, never closed
        err = process.stderr.read()
    finally:
        process.stdin.close()
    assert process.returncode == 1
    assert one_line(err, "poststop").endswith(
        "gave up after 1 s (--timeout, counted from the start of the hook process) while "
        "reading the OCI state on stdin")


def test_the_daemon_counts_the_deadline_from_the_start_of_the_hook_process(setup, daemon,
                                                                           client):
    """A hook process that spent its --timeout before connecting (here asleep; under a burst,
    starved of CPU) is answered at once with the reason, not given a fresh --timeout."""
    host, state, _, args = setup
    started = time.monotonic()
    done = run(["sh", "-c", 'sleep 1.2; exec "$@"', "sh"],
               [*client, "createRuntime", *args, "--timeout", "1"],
               create(host, "c1", 5001, 1), state)
    assert time.monotonic() - started < 5
    assert done.returncode == 1
    assert "gave up after 1 s (--timeout, counted from the start of the hook process) while " \
           "waiting to be run: the hook daemon had more runs queued" in one_line(done.stderr)
    assert nothing_saved(state)


@pytest.mark.parametrize("extra", [
    ["--bogus"], ["--help"], ["--timeout", "0"], ["--timeout", "nan"], ["--timeout", "1e300"],
    ["--timeout"], ["--start-daemon=1"], ["poststop"]])
def test_arguments_read_as_nri_numa_hook_reads_them_in_its_own_process(setup, daemon, client,
                                                                      extra):
    """The daemon reads a run's arguments with the parser of ``nri-numa hook``: help, usage
    errors and refused values come out as the hook in its own process gives them."""
    _, state, _, args = setup
    ours = run(client, ["createRuntime", *args, *extra], b"{}", state)
    theirs = run(HOOK, ["createRuntime", *args, *extra], b"{}", state.parent / "elsewhere")
    assert (ours.returncode, ours.stdout, ours.stderr) == \
        (theirs.returncode, theirs.stdout, theirs.stderr)
    assert ours.returncode != 0 or extra == ["--help"]


def test_no_arguments_get_nri_numa_hooks_usage_error(tmp_path, client):
    ours = run(client, [], b"{}", tmp_path)
    theirs = run(HOOK, [], b"{}", tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == \
        (theirs.returncode, theirs.stdout, theirs.stderr)
    assert ours.returncode == 2 and b"required: stage" in ours.stderr


@pytest.mark.parametrize("command", ["python", "c", "nri-numa hook"])
def test_a_closed_stdin_is_one_line_and_never_the_socket_read_as_stdin(tmp_path, request,
                                                                       command):
    """With stdin closed (``<&-``) a socket opened by the client would take descriptor 0: the
    clients hand nothing over, and the hook fails in its own process as it reads stdin."""
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    commands = {"python": PYTHON_CLIENT, "nri-numa hook": HOOK}
    used = commands.get(command) or [str(request.getfixturevalue("c_client_binary"))]
    try:
        done = run(["sh", "-c", 'exec "$@" <&-', "sh"],
                   [*used, "createRuntime", "--state-dir", str(state), "--timeout", "5"],
                   None, state)
    finally:
        daemon.close()
    assert (done.returncode, done.stderr) == (
        1, b"nri-numa hook createRuntime: cannot read stdin: [Errno 9] Bad file descriptor\n")
    assert daemon.runs == []


def test_with_a_daemon_the_python_client_loads_nothing_of_nri_numa(setup, daemon):
    host, state, _, args = setup
    done = run([PYTHON_CLIENT[0], "-X", "importtime", *PYTHON_CLIENT[1:]],
               ["createRuntime", *args], create(host, "c1", 5001, 0), state)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines()
              if line.startswith("import time:") and "|" in line}
    assert "_socket" in loaded
    assert not {name for name in loaded if name.startswith("nri_numa")}
    assert not loaded & {"argparse", "json", "site", "socket", "enum", "selectors"}


def test_a_socket_path_past_the_kernels_limit_is_one_line(tmp_path, client):
    state = tmp_path / ("d" * (108 - len(str(tmp_path)) - len("/hook.sock")))
    done = run(client, ["createRuntime"], b"{}", state)
    assert done.returncode == 1
    assert done.stderr.decode().startswith(
        f"nri-numa hook: cannot reach the hook daemon at {state}/hook.sock: ")
    assert done.stderr.count(b"\n") == 1

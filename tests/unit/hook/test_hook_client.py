"""The hook's wire in one process: what the client sends and reads (nri_numa.hook.client), and
how the daemon answers a run's arguments (nri_numa.hook.daemon.answer). The clients as
processes, with a real daemon, are in tests/integration/hook/test_thin_clients.py."""

from __future__ import annotations

import io
import os
import socket
import threading
import time

import pytest

from nri_numa.hook import client
from nri_numa.hook.daemon import DaemonOptions, answer


def test_no_socket_a_socket_nobody_listens_on_and_a_fifo_mean_no_daemon(tmp_path):
    assert client.connect(str(tmp_path / "none")) is None
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(tmp_path / "bound"))  # never listening: refused, as a dead daemon's
    os.mkfifo(tmp_path / "fifo")
    try:
        assert client.connect(str(tmp_path / "bound")) is None
        assert client.connect(str(tmp_path / "fifo")) is None
    finally:
        bound.close()


def test_the_socket_is_the_variables_else_the_default(monkeypatch):
    monkeypatch.delenv(client.SOCKET_ENV, raising=False)
    assert client.socket_path() == "/run/nri-numa/hook.sock" == client.DEFAULT_SOCKET
    monkeypatch.setenv(client.SOCKET_ENV, "/run/x/hook.sock")
    assert client.socket_path() == "/run/x/hook.sock"
    monkeypatch.setenv(client.SOCKET_ENV, "")
    assert client.socket_path() == client.DEFAULT_SOCKET


def serve_once(answer_with: bytes) -> tuple[socket.socket, list, threading.Thread]:
    """One end of a socket pair for the client; the other reads a request as the daemon does
    and answers ``answer_with``."""
    ours, theirs = socket.socketpair()
    seen: list = []

    def serve() -> None:
        with theirs:
            data, fds = b"", []
            while True:
                chunk, got, _, _ = socket.recv_fds(theirs, 1 << 16, 3)
                data, fds = data + chunk, fds + got
                if not chunk:
                    break
            seen.append((data, [os.fstat(fd).st_ino for fd in fds]))
            for fd in fds:
                os.close(fd)
            theirs.sendall(answer_with)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return ours, seen, thread


@pytest.mark.parametrize("status", [0, 1, 2, 255])
def test_the_arguments_and_standard_descriptors_go_out_and_the_status_comes_back(status):
    conn, seen, thread = serve_once(bytes([status]))
    args = ["createRuntime", "--state-dir", "/run/x", "", "caf\u00e9", "\udcff"]
    with conn:
        assert client.hand_over(conn, args) == status
    thread.join(5)
    [(data, inodes)] = seen
    assert data == b"createRuntime\0--state-dir\0/run/x\0\0caf\xc3\xa9\0\xff\0"
    assert inodes == [os.fstat(fd).st_ino for fd in client.STANDARD_FDS]


def test_a_daemon_that_hangs_up_is_no_answer():
    conn, _, thread = serve_once(b"")
    with conn:
        assert client.hand_over(conn, ["poststop"]) is None
    thread.join(5)
    assert client.unanswered("/s") == \
        "the hook daemon at /s closed the connection before answering"
    assert client.unanswered("/s", ConnectionResetError(104, "Connection reset by peer")) == \
        "the hook daemon at /s failed before answering: Connection reset by peer"


def ask(tmp_path, *args: str, started: float | None = None, stdin: bytes = b"{}",
        **served) -> tuple[int, str, str]:
    options = DaemonOptions(state_dir=tmp_path, **served)
    return answer(list(args), io.BytesIO(stdin), time.monotonic() if started is None else started,
                  options, machine=None)


def test_the_daemon_reads_arguments_with_the_hooks_parser(tmp_path, capsys):
    code, out, err = ask(tmp_path, "createRuntime", "--help")
    assert (code, err) == (0, "") and out.startswith("usage: nri-numa hook ")
    code, out, err = ask(tmp_path, "createRuntime", "--bogus")
    assert (code, out) == (2, "")
    assert err.endswith("nri-numa: error: unrecognized arguments: --bogus\n")
    assert ask(tmp_path, "createRuntime", "--timeout", "1e300", "--state-dir", str(tmp_path)) == \
        (1, "", "nri-numa: error: timeout must be positive and at most 86400 s, not 1e+300\n")
    assert capsys.readouterr() == ("", "")  # nothing on the daemon's own stdout or stderr


@pytest.mark.parametrize("option", ["--state-dir", "--config", "--topology"])
def test_a_run_the_daemon_does_not_serve_is_refused_in_one_line(tmp_path, option):
    code, out, err = ask(tmp_path, "poststop", "--state-dir", str(tmp_path), option, "/other")
    served = str(tmp_path) if option == "--state-dir" else "(none)"
    assert (code, out) == (1, "")
    assert err == (f"nri-numa hook poststop: the hook daemon at {tmp_path}/hook.sock serves "
                   f"{option} {served}, this hook asks for /other; give both the same\n")


def test_time_spent_before_the_daemon_took_the_run_counts_against_the_timeout(tmp_path):
    code, out, err = ask(tmp_path, "poststop", "--state-dir", str(tmp_path), "--timeout", "1",
                         started=time.monotonic() - 5)
    assert (code, out) == (1, "")
    assert err == ("nri-numa hook poststop: gave up after 1 s (--timeout, counted from the start "
                   "of the hook process) while waiting to be run: the hook daemon had more runs "
                   "queued than it could serve in that time (docs/oci-hook.md, \"Burst-proof "
                   "setup\")\n")


def test_hook_daemon_help_names_its_default_state_dir():
    from nri_numa.cli import build_parser

    daemon_parser = build_parser()._subparsers._group_actions[0].choices["hook-daemon"]
    assert str(DaemonOptions().state_dir) in daemon_parser.format_help()

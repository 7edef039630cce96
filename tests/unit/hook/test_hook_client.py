"""The thin hook client and the daemon's request decoding, without a daemon process."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_numa.hook import client
from nri_numa.hook.daemon import BadRequest, DaemonOptions, answer, decode_request


def test_hook_args_become_a_stage_and_options():
    assert client.parse_hook_args(["createRuntime", "--state-dir", "/s", "--timeout=2.5",
                                   "--cgroup-root", "/c"]) == (
        "createRuntime", {"state_dir": "/s", "timeout": "2.5", "cgroup_root": "/c"})


@pytest.mark.parametrize("args", [[], ["--help"], ["createRuntime", "--bogus"],
                                  ["createRuntime", "--config"], ["start"],
                                  ["poststop", "poststop"]])
def test_what_argparse_must_judge_is_left_to_it(args):
    assert client.parse_hook_args(args) is None


def test_a_request_round_trips_any_bytes(tmp_path):
    stdin = b'{"id": "c1"}\xff\xfe'
    line = client.encode_request("poststop", stdin, {"timeout": "3", "proc_root": "/p"})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    hook, got, _ = decode_request(line[:-1], DaemonOptions(state_dir=tmp_path))
    assert got == stdin
    assert (hook.stage, hook.timeout, hook.proc_root, hook.state_dir) == (
        "poststop", 3.0, Path("/p"), tmp_path)


@pytest.mark.parametrize("line, reason", [
    (b"nope", "not JSON"), (b"[]", "not a JSON object"),
    (b'{"stage": "poststop", "stdin": 1, "options": {}}', "must be a string"),
    (b'{"stage": "start", "stdin": "", "options": {}}', "is not one of"),
    (b'{"stage": "poststop", "stdin": "", "options": {"timeout": "x"}}', "could not convert"),
    (b'{"stage": "poststop", "stdin": "", "options": {"config": 3}}', "options.config"),
])
def test_a_bad_request_is_refused_with_a_reason(tmp_path, line, reason):
    with pytest.raises(BadRequest, match=reason):
        decode_request(line, DaemonOptions(state_dir=tmp_path))
    reply = answer(line, DaemonOptions(state_dir=tmp_path), machine=None)
    assert reply["exit"] == 1 and "bad request" in reply["stderr"]


@pytest.mark.parametrize("line", [b"{", b"[1]", b'{"exit": true, "stdout": "", "stderr": ""}',
                                  b'{"exit": 0, "stdout": ""}'])
def test_a_bad_reply_is_a_protocol_error(line):
    with pytest.raises(client.ProtocolError):
        client.decode_reply(line)


class Stdin(io.BytesIO):
    read_called = False

    def read(self, *args):  # type: ignore[override]
        self.read_called = True
        return super().read(*args)


@pytest.fixture(autouse=True)
def a_fresh_hook_process(monkeypatch):
    """The client counts --timeout from its process's start; here that process is pytest,
    minutes old, which would leave the daemon 1 ms to answer. Each call is a fresh hook."""
    monkeypatch.setattr(client.deadline, "process_age", lambda: 0.0)


def forward(state: Path, timeout: str = "2") -> tuple[int | None, str, str, Stdin]:
    stdin, out, err = Stdin(b'{"id": "c1"}'), io.StringIO(), io.StringIO()
    code = client.forward(["createRuntime", "--state-dir", str(state), "--timeout", timeout],
                          stdin, out, err)
    return code, out.getvalue(), err.getvalue(), stdin


def test_no_socket_means_run_in_process_with_stdin_untouched(tmp_path):
    code, out, err, stdin = forward(tmp_path)
    assert code is None and not stdin.read_called and (out, err) == ("", "")


def test_a_socket_nobody_listens_on_means_run_in_process(tmp_path):
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(tmp_path / client.SOCKET_NAME))  # bound, never listening: refused
    try:
        code, _, _, stdin = forward(tmp_path)
    finally:
        left.close()
    assert code is None and not stdin.read_called


@pytest.fixture
def fake_daemon(tmp_path) -> Iterator[Callable[[Callable[[socket.socket], None]], list[bytes]]]:
    """Serve one connection with the given handler; returns the request lines it read."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / client.SOCKET_NAME))
    listener.listen(1)
    threads: list[threading.Thread] = []
    seen: list[bytes] = []

    def start(handler: Callable[[socket.socket], None]) -> list[bytes]:
        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                seen.append(client.read_line(conn))
                handler(conn)
        threads.append(threading.Thread(target=serve, daemon=True))
        threads[-1].start()
        return seen

    yield start
    listener.close()
    for t in threads:
        t.join(5)


def test_the_daemons_answer_is_relayed_as_is(tmp_path, fake_daemon):
    reply = {"exit": 1, "stdout": "out", "stderr": "nri-numa hook createRuntime: refused\n"}
    seen = fake_daemon(lambda c: c.sendall(json.dumps(reply).encode() + b"\n"))
    code, out, err, _ = forward(tmp_path)
    assert (code, out, err) == (1, "out", reply["stderr"])
    request = json.loads(seen[0])
    assert request["stage"] == "createRuntime" and request["stdin"] == '{"id": "c1"}'
    assert request["options"]["state_dir"] == str(tmp_path)
    assert request["options"]["timeout"] == "2" and request["options"]["started"] > 0


def test_a_silent_daemon_fails_the_hook_at_its_timeout(tmp_path, fake_daemon):
    release = threading.Event()
    fake_daemon(lambda c: release.wait(5))
    try:
        code, _, err, _ = forward(tmp_path, timeout="0.3")
    finally:
        release.set()
    assert code == 1 and err.count("\n") == 1
    assert "no answer from the hook daemon" in err and "0.3 s" in err


def test_a_daemon_that_hangs_up_fails_the_hook_closed(tmp_path, fake_daemon):
    fake_daemon(lambda c: None)
    code, _, err, _ = forward(tmp_path)
    assert code == 1 and err.startswith("nri-numa hook createRuntime: the hook daemon at ")
    assert "failed before answering" in err and err.count("\n") == 1


def test_a_path_that_is_no_socket_means_no_daemon(tmp_path):
    os.mkfifo(tmp_path / client.SOCKET_NAME)  # connect() is refused, as for a stale socket
    code, _, _, stdin = forward(tmp_path)
    assert code is None and not stdin.read_called


def test_the_client_knows_every_hook_option_and_default():
    from nri_numa.cli import build_parser
    from nri_numa.hook import entry

    assert Path(client.DEFAULT_STATE_DIR) == entry.DEFAULT_STATE_DIR
    assert client.DEFAULT_TIMEOUT_S == entry.DEFAULT_TIMEOUT_S
    assert client.MAX_TIMEOUT_S == entry.MAX_TIMEOUT_S
    hook_parser = build_parser()._subparsers._group_actions[0].choices["hook"]
    takes_value = {s for a in hook_parser._actions if a.option_strings and a.nargs is None
                   and a.dest != "help" for s in a.option_strings}
    assert takes_value == set(client.VALUE_OPTIONS)
    assert set(client.STAGES) == set(entry.STAGES)


def test_hook_daemon_help_names_its_default_state_dir():
    from nri_numa.cli import build_parser

    daemon_parser = build_parser()._subparsers._group_actions[0].choices["hook-daemon"]
    assert str(DaemonOptions().state_dir) in daemon_parser.format_help()


def test_time_spent_waiting_for_the_daemon_counts_against_the_timeout(tmp_path):
    import time

    line = json.dumps({"stage": "poststop", "stdin": "{}",
                       "options": {"timeout": "1", "started": time.time() - 5}}).encode()
    reply = answer(line, DaemonOptions(state_dir=tmp_path), machine=None)
    assert reply["exit"] == 1
    assert reply["stderr"] == "nri-numa hook poststop: gave up after 1 s (--timeout)\n"


def test_a_timeout_past_a_day_is_left_to_argparse_which_refuses_it_in_one_line(capsys):
    # Was: OverflowError from the deadline guard's timer, a traceback.
    from nri_numa.cli import main

    assert client.hook_timeout({"timeout": "1e300"}) is None
    assert client.hook_timeout({"timeout": "86400"}) == 86400.0
    assert main(["hook", "createRuntime", "--timeout", "1e300", "--state-dir", "/nonexistent"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "timeout must be positive and at most 86400 s" in err, err

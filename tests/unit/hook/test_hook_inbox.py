"""The hook daemon's inbox: a hook that connected and has not written yet holds up no one;
silent, broken or hostile connections are dropped, their descriptors closed."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_numa.hook.inbox import MAX_REQUEST, Inbox


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "hook.sock"))
    server.listen(16)
    yield server
    server.close()


def client(listener: socket.socket) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(listener.getsockname())
    return conn


def send(conn: socket.socket, args: list[bytes], fds: list[int] = [0, 1, 2],
         done: bool = True) -> None:
    socket.send_fds(conn, [b"".join(a + b"\0" for a in args)], fds)
    if done:
        conn.shutdown(socket.SHUT_WR)


def test_a_silent_hook_does_not_hold_up_the_ones_behind_it(listener):
    silent, second, third = client(listener), client(listener), client(listener)
    send(third, [b"poststop", b"3"])
    send(second, [b"poststop"], done=False)
    second.sendall(b"2\0")  # in two pieces
    second.shutdown(socket.SHUT_WR)
    with Inbox(listener, idle_s=30) as inbox:
        got = {tuple(r.args): r for r in (inbox.next(), inbox.next())}
        assert set(got) == {("poststop", "3"), ("poststop", "2")}
        request = got[("poststop", "3")]
        assert request.conn.getblocking()  # blocking again, for the answer
        assert [os.fstat(fd).st_ino for fd in request.fds] == \
            [os.fstat(fd).st_ino for fd in (0, 1, 2)]
        assert 0 <= time.monotonic() - request.started < 3600  # this test process's start
        request.conn.sendall(b"\0")
        assert third.recv(100) == b"\0"
        for r in got.values():
            r.close()
        send(silent, [b"late"])
        late = inbox.next()
        assert late.args == ["late"]
        late.close()
    for c in (silent, second, third):
        c.close()


@pytest.mark.parametrize("fds, payload, why", [
    ([], b"poststop\0", "the connection closed before a whole request came"),
    ([0, 1], b"poststop\0", "the connection closed before a whole request came"),
    ([0, 1, 2], b"poststop", "the connection closed before a whole request came"),
    ([0, 1, 2, 0], b"poststop\0", "more than 3 descriptors"),
    ([0, 1, 2], b"x" * (MAX_REQUEST + 1), f"a request longer than {MAX_REQUEST} bytes"),
])
def test_what_is_no_hooks_request_is_dropped_with_a_warning(listener, caplog, fds, payload,
                                                            why):
    bad, good = client(listener), client(listener)
    open_before = len(os.listdir("/proc/self/fd"))

    def send_bad() -> None:
        try:
            if fds:
                socket.send_fds(bad, [payload], fds)
            else:
                bad.sendall(payload)
            bad.shutdown(socket.SHUT_WR)
        except OSError:  # dropped halfway through
            pass

    sender = threading.Thread(target=send_bad, daemon=True)
    sender.start()
    # The good request comes once the bad one is all in: the inbox has dropped it by then.
    threading.Thread(target=lambda: (sender.join(), send(good, [b"poststop"])),
                     daemon=True).start()
    with Inbox(listener, idle_s=30) as inbox:
        request = inbox.next()
        assert request.args == ["poststop"]
        request.close()
    assert f"dropped a client: {why}" in [r.getMessage() for r in caplog.records]
    assert bad.recv(10) == b""  # closed by the daemon, unanswered
    bad.close()
    assert len(os.listdir("/proc/self/fd")) <= open_before  # no descriptor kept


def test_closed_and_idle_connections_are_dropped_with_a_warning(listener, caplog):
    clock = Clock()
    gone, idle = client(listener), client(listener)
    gone.close()
    with Inbox(listener, idle_s=5, clock=clock) as inbox:
        inbox._accept()  # both in; then the idle one grows old
        clock.now = 6
        good = client(listener)
        send(good, [b"ok"])
        request = inbox.next()
        assert request.args == ["ok"]
        request.close()
    messages = [r.getMessage() for r in caplog.records]
    assert "dropped a client: the connection closed before a whole request came" in messages
    assert "dropped a client: no whole request within 5 s" in messages
    assert idle.recv(10) == b""  # closed by the daemon
    for c in (idle, good):
        c.close()

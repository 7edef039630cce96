"""The hook daemon's inbox: a hook that connected and has not written yet holds up no one;
silent or broken connections are dropped."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_numa.hook.inbox import Inbox


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


def test_a_silent_hook_does_not_hold_up_the_ones_behind_it(listener):
    silent, second, third = client(listener), client(listener), client(listener)
    third.sendall(b'{"n": 3}\n')
    second.sendall(b'{"n": 2}')
    second.sendall(b'}\n')  # in two pieces
    with Inbox(listener, idle_s=30) as inbox:
        got = dict((line, conn) for conn, line in (inbox.next(), inbox.next()))
        assert set(got) == {b'{"n": 3}', b'{"n": 2}}'}
        conn = got[b'{"n": 3}']
        assert conn.getblocking()  # blocking again, for the answer
        conn.sendall(b"answer\n")
        assert third.recv(100) == b"answer\n"
        silent.sendall(b"late\n")
        assert inbox.next()[1] == b"late"
    for c in (silent, second, third):
        c.close()


def test_closed_and_idle_connections_are_dropped_with_a_warning(listener, caplog):
    clock = Clock()
    gone, idle, good = client(listener), client(listener), client(listener)
    gone.close()
    with Inbox(listener, idle_s=5, clock=clock) as inbox:
        inbox._accept()  # all three in; then the idle one grows old
        clock.now = 6
        good.sendall(b"ok\n")
        assert inbox.next()[1] == b"ok"
    messages = [r.getMessage() for r in caplog.records]
    assert "dropped a client: the connection closed before a whole line came" in messages
    assert "dropped a client: no whole request within 5 s" in messages
    assert idle.recv(10) == b""  # closed by the daemon
    for c in (idle, good):
        c.close()

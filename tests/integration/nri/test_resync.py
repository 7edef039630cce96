"""Found against real containerd (tests/e2e/test_nri_plugin*.py) and pinned here:

* a Synchronize that fails or answers after the runtime's deadline leaves containerd holding the
  connection without ever adding the plugin (docs/nri-protocol.md §6): the session must close it itself,
  so that the daemon connects again and gets a new Synchronize;
* the reconnection waits start over after every session the runtime took in, so a second
  containerd restart soon after the first is followed as quickly as the first.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from nri_numa.nri import daemon as d
from nri_numa.nri.pb import api_pb2
from nri_numa.nri.session import NriSession, PluginError, SessionClosed
from tests.integration.nri.fake_runtime import CallFailed, FakeRuntime
from tests.integration.nri.plugin_env import new_plugin
from tests.integration.nri.test_session import DEADLINE, Handlers, started
from tests.polling import until

__all__ = ["started"]  # the fixture, imported for pytest


def test_a_failed_synchronize_closes_the_connection(started) -> None:
    handlers = Handlers()

    def refuse(req):
        raise PluginError("state cannot be rebuilt")

    handlers.on_sync = refuse
    runtime, running, _ = started(handlers)
    runtime.configure()
    with pytest.raises(CallFailed, match="state cannot be rebuilt"):
        runtime.synchronize()  # the error still reaches the runtime before the close
    assert runtime.eof.wait(DEADLINE), "the plugin kept a connection the runtime ignores"
    outcome = running.result()
    assert isinstance(outcome, SessionClosed)
    assert "Synchronize failed (code 2)" in outcome.reason
    assert not running.session.synchronized


def test_a_synchronize_answered_after_the_deadline_closes_the_connection(started) -> None:
    handlers = Handlers()
    handlers.on_sync = lambda req: time.sleep(0.3) or api_pb2.SynchronizeResponse()
    runtime, running, _ = started(handlers)
    with pytest.raises(TimeoutError):
        runtime.call("Synchronize", api_pb2.SynchronizeRequest(), api_pb2.SynchronizeResponse,
                     timeout=0.1)
    assert runtime.eof.wait(DEADLINE)
    outcome = running.result()
    assert isinstance(outcome, SessionClosed) and "too late" in outcome.reason


def test_a_synchronize_in_time_keeps_the_session(started) -> None:
    runtime, running, _ = started()
    runtime.configure()
    runtime.synchronize()
    # Set just after the reply is written: the runtime may read the reply first.
    until(lambda: running.session.synchronized, DEADLINE, 0.001)
    runtime.configure()
    assert not runtime.eof.is_set()


class Runtimes:
    """connect(): a fake runtime per call; the n-th synchronizes the plugin when ``syncs[n]``,
    then closes the connection, as a restarting containerd does."""

    def __init__(self, syncs: list[bool]) -> None:
        self.syncs = syncs
        self.runtimes: list[FakeRuntime] = []
        self.done = threading.Event()

    def __call__(self, path: str) -> NriSession:
        if len(self.runtimes) == len(self.syncs):
            self.done.set()
            raise ConnectionError("no more runtimes")
        plugin_end, runtime_end = socket.socketpair()
        runtime = FakeRuntime(runtime_end).start()
        self.runtimes.append(runtime)
        threading.Thread(target=self._drive, args=(runtime, self.syncs[len(self.runtimes) - 1]),
                         daemon=True).start()
        return NriSession(plugin_end)

    @staticmethod
    def _drive(runtime: FakeRuntime, sync: bool) -> None:
        assert runtime.registered.wait(DEADLINE)
        runtime.configure()
        if sync:
            runtime.synchronize()
        runtime.close()


def test_the_waits_start_over_after_a_session_the_runtime_took_in(monkeypatch) -> None:
    sequences: list[list[float]] = []

    def recording_delays():
        waits: list[float] = []
        sequences.append(waits)
        while True:
            waits.append(0.001 * (len(waits) + 1))
            yield waits[-1]

    monkeypatch.setattr(d, "backoff_delays", recording_delays)
    connect = Runtimes([False, True, False, False])
    sender = d.UpdateSender()
    daemon = d.Daemon(new_plugin(), sender, d.DaemonOptions(socket_path="/x/nri.sock"),
                      connect=connect)
    worker = threading.Thread(target=daemon.run_external, daemon=True)
    worker.start()
    try:
        assert connect.done.wait(10)
    finally:
        daemon.stop()
        worker.join(5)
        sender.stop()
        for runtime in connect.runtimes:
            runtime.close()
    # One wait after the first, unsynchronized session; the synchronized second one starts a
    # new sequence, which then grows over the third and fourth.
    assert len(sequences) == 2
    assert sequences[0] == [0.001]
    assert sequences[1][:3] == [0.001, 0.002, 0.003]

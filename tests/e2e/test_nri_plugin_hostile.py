"""The real `nri-numa run` process against a hostile runtime (tests/e2e/hostile_runtime.py), then
against real containerd 1.7.24 and 2.1.9: it never dies, logs each broken connection, connects
again, and once its socket leads to containerd it places containers as usual.

The agent's --nri-socket is a symlink: first to the hostile runtime's socket, at the end to
containerd's, which the agent reaches on its next reconnection like any runtime restart."""

from __future__ import annotations

import os
from collections import Counter
import random
import socket
from pathlib import Path

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, allowed_inside
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.runtimes import RUNTIME_VERSIONS
from tests.e2e.harness.timing import StepTimes
from tests.e2e.hostile_runtime import (HostileRuntime, before_registration, ping,
                                       session_enders, survivable)
from tests.e2e.nri_agent import (BESTEFFORT, EXCLUSIVE, GUARANTEED_1, SHARED_ONLY, Agent,
                                 agent_on, connected_count, run, wait_until)

pytestmark = pytest.mark.e2e
SEED = 20240611
SURVIVABLE_CASES = 240
ENDING_CASES = 15
ACCEPT_TIMEOUT_S = 10.0  # the agent's wait before a new attempt stays under 1 s after a sync


class Listener:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.sock.settimeout(ACCEPT_TIMEOUT_S)

    def accept(self, agent: Agent) -> socket.socket:
        try:
            conn, _ = self.sock.accept()
        except TimeoutError:
            raise AssertionError(f"the agent did not connect again within {ACCEPT_TIMEOUT_S:g} s"
                                 f" (alive: {agent.alive()})") from None
        conn.settimeout(None)
        return conn

    def synchronized(self, agent: Agent) -> HostileRuntime:
        """Accept, register, configure and synchronize, as a well-behaved runtime would."""
        runtime = HostileRuntime(self.accept(agent)).start()
        assert runtime.registered.wait(5), "no RegisterPlugin"
        ping(runtime)
        runtime.synchronize()
        return runtime


def point(link: Path, target: Path) -> None:
    """Repoint the symlink atomically: a connect sees the old target or the new one."""
    fresh = link.with_name(link.name + ".new")
    fresh.symlink_to(target)
    os.replace(fresh, link)


def test_hostile_runtime_then_real_containerd(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, tmp_path: Path, step_times: StepTimes) -> None:
    version = containerd.version
    rng = random.Random(SEED + RUNTIME_VERSIONS.index(version))
    link, hostile = tmp_path / "nri.sock", tmp_path / "hostile.sock"
    listener = Listener(hostile)
    point(link, hostile)
    with agent_on(link, tmp_path) as agent:
        agent.start()
        cases = 0
        with step_times.step(version, "hostile runtime: cases before registration"):
            for send in before_registration(rng):
                conn = listener.accept(agent)
                send(conn)
                conn.close()
                cases += 1

        with step_times.step(version, f"hostile runtime: {SURVIVABLE_CASES} survivable cases"):
            runtime = listener.synchronized(agent)
            kinds = Counter[str]()
            for case in survivable(rng, SURVIVABLE_CASES):
                kinds[case.name] += 1
                case.run(runtime)
                try:
                    ping(runtime)
                except Exception as exc:  # noqa: BLE001 - the case that broke it is named
                    raise AssertionError(f"case {cases} ({case.name}) broke the session") from exc
                assert not runtime.eof.is_set(), f"case {cases} ({case.name}) ended the session"
                cases += 1
            runtime.close()

        with step_times.step(version, f"hostile runtime: {ENDING_CASES} session-ending cases"):
            for case in session_enders(rng, ENDING_CASES):
                runtime = listener.synchronized(agent)
                case.run(runtime)
                assert runtime.eof.wait(5), f"case {cases} ({case.name}): the connection stayed"
                runtime.close()
                cases += 1
        assert agent.alive()
        log = agent.log_text()
        assert "Traceback" not in log
        assert log.count("NRI session ended") >= ENDING_CASES + 2
        for problem in ("exceeds the 16 MiB frame limit", "connection ended inside a frame"):
            assert problem in log

        # Back after the last case; the next reconnection reaches containerd.
        last = listener.synchronized(agent)
        point(link, containerd.paths.nri_socket)
        before = connected_count(containerd, agent)
        last.close()
        listener.sock.close()
        with step_times.step(version, "hostile runtime → containerd: connected"):
            wait_until(lambda: connected_count(containerd, agent) > before, 10,
                       "the agent to join containerd")
        shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
        guaranteed = run(cri_client, Pod("g", (GUARANTEED_1,)), busybox_image)
        assert allowed_inside(cri_client, guaranteed).cpu_ids == EXCLUSIVE
        assert allowed_inside(cri_client, shared).cpu_ids == SHARED_ONLY
        assert agent.alive() and "Traceback" not in agent.log_text()
        assert agent.stop() == 0  # and it still ends cleanly on SIGTERM
        print(f"{cases} hostile cases; survivable ones by kind: {dict(kinds)}")

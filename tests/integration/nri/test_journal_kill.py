"""kill -9 of a process running the NRI plugin's persistence (tests/integration/nri/
journal_child.py: NumaPlugin with the store `nri-numa run` uses) at the two instants a journal
is not whole: in the middle of a record's append and in the middle of a compaction (after the
new snapshot's rename, before the new journal's). The pauses are the checkpoint's test hooks
(NRI_NUMA_TEST_PAUSE_APPEND, NRI_NUMA_TEST_PAUSE_COMPACTION), inert unless set. After each
kill the next process starts on the same folder; at the end every answered creation is there
with the CPUs it was answered with, the one cut off in its append is not, and no CPU is held
twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.daemon import plugin_store
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.journal import parse
from nri_numa.topology.cpulist import parse_list
from tests.integration.nri.plugin_env import CONFIG, machine

REPO = Path(__file__).resolve().parents[3]


class Child:
    def __init__(self, state_dir: Path, first: int, last: int, log: Path,
                 pause: tuple[str, Path] | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NRI_NUMA_TEST_PAUSE")}
        if pause is not None:
            env[pause[0]] = str(pause[1])
        self.log = log
        with open(log, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.nri.journal_child", str(state_dir),
                 str(first), str(last)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err)

    def acked_until(self, done: Callable[[bytes], bool], timeout: float = 60) -> dict[str, frozenset[int]]:
        """Lines until ``done()`` is true (checked between lines and while waiting), then
        SIGKILL; the acknowledged containers with their CPUs."""
        acked: dict[str, frozenset[int]] = {}
        os.set_blocking(self.process.stdout.fileno(), False)
        deadline, pending = time.monotonic() + timeout, b""
        while not done(pending):
            assert time.monotonic() < deadline, self.log.read_text()[-2000:]
            assert self.process.poll() is None, self.log.read_text()[-2000:]
            chunk = self.process.stdout.read()
            if chunk:
                pending += chunk
            else:
                time.sleep(0.01)
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        pending += self.process.stdout.read() or b""
        for line in pending.decode().splitlines():
            if line.startswith("ACK "):
                _, cid, cpus = (line.split(" ") + [""])[:3]
                acked[cid] = parse_list(cpus)
        return acked


def test_kill_9_inside_an_append_and_inside_a_compaction_loses_no_answered_creation(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    # 1. Twenty creations answered, then killed while idle.
    first = Child(state, 0, 20, tmp_path / "1.log")
    acked = first.acked_until(lambda out: b"DONE" in out)
    assert len(acked) == 20
    # 2. Killed inside the append of its first creation: half a record is on disk.
    marker = tmp_path / "append.paused"
    second = Child(state, 20, 25, tmp_path / "2.log", ("NRI_NUMA_TEST_PAUSE_APPEND", marker))
    assert second.acked_until(lambda out: marker.exists()) == {}
    torn = (state / "checkpoint.journal").read_bytes()
    # 3. Creations until a compaction, killed after its snapshot's rename.
    marker = tmp_path / "compaction.paused"
    third = Child(state, 25, 400, tmp_path / "3.log", ("NRI_NUMA_TEST_PAUSE_COMPACTION", marker))
    answered = third.acked_until(lambda out: marker.exists())
    assert "torn tail dropped" in (tmp_path / "3.log").read_text()  # the second's half record
    assert len(answered) > 20 and "c20" not in answered
    acked.update(answered)

    topology = machine()
    plugin = NumaPlugin(topology, config_from_mapping(CONFIG), plugin_store(state, topology))
    records = plugin.containers
    assert "c20" not in records  # never answered: its torn record was dropped
    missing = set(acked) - set(records)
    assert not missing, missing
    held = [cid for cid in acked if records[cid].exclusive]
    assert len(held) >= 5
    for cid in held:  # exactly the CPUs it was answered with (a shared one follows the pool)
        assert records[cid].cpus == acked[cid], cid
    exclusive = [r.cpus for r in records.values() if r.exclusive]
    assert sum(map(len, exclusive)) == len(frozenset().union(*exclusive))  # no CPU twice
    assert not frozenset().union(*exclusive) & plugin.ledger.allocations.shared
    plugin.ledger.ctx.check(plugin.ledger.allocations)
    assert parse(torn).torn is not None  # the second process really left half a record

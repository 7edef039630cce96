"""The plugin's snapshot and journal (nri_numa.state.plugin_checkpoint) under the real plugin:
what a restart reads equals the state in memory after every event, a compaction writes what
the journal replays to, a compaction stopped after any of its steps loses nothing, an event's
record does not grow with the ledger, and the single-file checkpoint of earlier versions is
read and migrated."""

from __future__ import annotations

import logging
import os
import random
from dataclasses import replace
from pathlib import Path

import pytest

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.persistence import recorded
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.nri.session import PluginError
from nri_numa.state import plugin_checkpoint
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint, read_envelope
from nri_numa.state.encoding import canonical
from nri_numa.state.journal import frame, parse
from nri_numa.state.plugin_records import records_to_dict
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import machine, new_plugin, saved_payload

GIB = 1 << 30
MEMORY = {"memoryManagerPolicy": "Static",
          "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}


def plugin_at(state_dir: Path) -> NumaPlugin:
    return new_plugin(state_dir, **MEMORY)


def in_memory(plugin: NumaPlugin) -> bytes:
    """The plugin's state as a checkpoint writes it: shared containers on the pool."""
    ledger = plugin.ledger
    records = plugin._records  # noqa: SLF001 - the state under test
    pool = ledger.allocations.shared
    containers = {k: c if c.exclusive else _on(c, pool) for k, c in records.containers.items()}
    return canonical({"ledger": ledger.to_dict(),
                      "records": records_to_dict(records.pods, containers)})


def on_disk(state_dir: Path) -> bytes:
    payload = saved_payload(state_dir)
    return canonical({"ledger": payload["ledger"], "records": payload["records"]})


def _on(record, pool):
    return replace(record, cpus=pool)


class Workload:
    """Seeded events as a node sees them: pods of every QoS class, second containers,
    restarts under a new id, stops and removals, pods removed whole, and refusals."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.live: dict[str, tuple[api.PodSandbox, api.Container]] = {}
        self.pods: dict[str, api.PodSandbox] = {}
        self.n = 0

    def step(self, plugin: NumaPlugin) -> str:
        rng, self.n = self.rng, self.n + 1
        roll = rng.random()
        try:
            if roll < 0.45 or not self.live:
                return self._create(plugin)
            if roll < 0.55:  # the same container again under a new id: the old one exited
                sandbox, old = self.live[rng.choice(sorted(self.live))]
                return self._create(plugin, sandbox, old.name)
            if roll < 0.85:
                sandbox, c = self.live.pop(rng.choice(sorted(self.live)))
                plugin.stop_container(api.StopContainerRequest(pod=sandbox, container=c))
                plugin.state_change(msg.event(api.REMOVE_CONTAINER, sandbox, c))
                return "removed"
            sandbox = self.pods[rng.choice(sorted(self.pods))]
            plugin.state_change(msg.event(api.REMOVE_POD_SANDBOX, sandbox))
            for key in [k for k, (s, _) in self.live.items() if s.id == sandbox.id]:
                del self.live[key]
            return "pod removed"
        except PluginError:
            return "refused"

    def _create(self, plugin: NumaPlugin, sandbox: api.PodSandbox | None = None,
                name: str | None = None) -> str:
        rng = self.rng
        if sandbox is None:
            qos = rng.choice(["guaranteed", "burstable", "besteffort"])
            sandbox = msg.pod(f"p{self.n}", qos)
            self.pods[sandbox.id] = sandbox
            name = "app"
        qos = sandbox.linux.cgroup_parent.split("/")[2]
        qos = qos if qos in ("burstable", "besteffort") else "guaranteed"
        cid = f"c{self.n}"
        if qos == "guaranteed":
            c = msg.guaranteed(sandbox, name, rng.choice([1, 2, 3, 7]),
                               memory=rng.choice([1, 2]) * GIB, cid=cid)
        elif qos == "burstable":
            c = msg.container(sandbox, name, cpu=500, cpu_limit=1000, memory=GIB, cid=cid)
        else:
            c = msg.container(sandbox, name, cid=cid)
        plugin.create_container(msg.create(sandbox, c))
        self.live = {k: v for k, v in self.live.items()
                     if not (v[0].id == sandbox.id and v[1].name == name)}
        self.live[cid] = (sandbox, c)
        return "created"


@pytest.mark.parametrize("seed", range(3))
def test_a_restart_reads_the_state_in_memory_after_every_event(state_dir: Path, seed: int,
                                                             monkeypatch) -> None:
    # Compactions now and then: the journal outgrows the snapshot every few events.
    monkeypatch.setattr(plugin_checkpoint, "MIN_COMPACT_BYTES", 4096)
    plugin, work = plugin_at(state_dir), Workload(seed)
    seen = set()
    for step in range(120):
        seen.add(work.step(plugin))
        assert on_disk(state_dir) == in_memory(plugin), step
        if step % 40 == 39:  # and a real restart reads the same
            again = plugin_at(state_dir)
            assert in_memory(again) == in_memory(plugin)
            plugin = again
    assert seen == {"created", "removed", "pod removed", "refused"}


def test_a_compaction_writes_what_the_journal_replays_to(state_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(plugin_checkpoint, "MIN_COMPACT_BYTES", 0)
    plugin, work = plugin_at(state_dir), Workload(7)
    compactions = 0
    while not (state_dir / "checkpoint.journal").exists():  # the first change: a snapshot
        work.step(plugin)
    for _ in range(60):
        journal_before = (state_dir / "checkpoint.journal").read_bytes()
        work.step(plugin)
        snapshot = read_envelope((state_dir / "checkpoint.json").read_bytes())["payload"]
        journal_now = (state_dir / "checkpoint.journal").read_bytes()
        if snapshot["journal"] not in journal_before.decode(errors="replace"):
            compactions += 1  # a new snapshot: it holds everything, its journal nothing yet
            assert len(journal_now) == len(frame(canonical({
                "format": "nri-numa-journal", "snapshot": snapshot["journal"], "version": 1})))
            assert canonical({"ledger": snapshot["ledger"], "records": snapshot["records"]}) \
                == in_memory(plugin)
        else:
            assert on_disk(state_dir) == in_memory(plugin)
    assert compactions >= 5


class Killed(BaseException):
    """The process dying at that instant (a test's stand-in for SIGKILL)."""


@pytest.mark.parametrize("step", ["before the snapshot's rename", "after the snapshot's rename",
                                  "before the journal's rename", "after the journal's rename"])
def test_a_compaction_stopped_after_any_step_loses_nothing(tmp_path: Path, monkeypatch,
                                                           step: str) -> None:
    reference, victim = tmp_path / "reference", tmp_path / "victim"
    plugins = {d: plugin_at(d) for d in (reference, victim)}
    works = {d: Workload(3) for d in (reference, victim)}
    for _ in range(25):
        for d in (reference, victim):
            works[d].step(plugins[d])
    # The next event's record goes in, then the journal is compacted: stop inside that.
    works[reference].step(plugins[reference])
    expected = in_memory(plugins[reference])
    monkeypatch.setattr(plugin_checkpoint, "MIN_COMPACT_BYTES", 0)
    plugins[victim]._state_file._checkpoint.snapshot_bytes = 0  # noqa: SLF001
    which, after = {"before the snapshot's rename": (1, False),
                    "after the snapshot's rename": (1, True),
                    "before the journal's rename": (2, False),
                    "after the journal's rename": (2, True)}[step]
    real_replace, calls = os.replace, []

    def replace(*args, **kwargs):
        calls.append(args)
        if len(calls) == which and not after:
            raise Killed
        real_replace(*args, **kwargs)
        if len(calls) == which and after:
            raise Killed

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Killed):
        works[victim].step(plugins[victim])
    monkeypatch.undo()
    restarted = plugin_at(victim)
    assert in_memory(restarted) == expected
    assert on_disk(victim) == expected  # and written again whole at the restart


def test_one_events_record_does_not_grow_with_the_ledger(state_dir: Path) -> None:
    plugin = plugin_at(state_dir)
    checkpoint = plugin._state_file._checkpoint  # noqa: SLF001
    sizes = {}
    for i in range(400):
        sandbox = msg.pod(f"p{i:04d}", "besteffort")
        before = checkpoint.journal_bytes
        plugin.create_container(msg.create(sandbox, msg.container(sandbox, "app",
                                                                  cid=f"c{i:04d}")))
        if checkpoint.journal_bytes > before:  # not the event that compacted
            sizes[i] = checkpoint.journal_bytes - before
    # The same bytes but for the digits of the record's number.
    assert abs(sizes[399] - sizes[10]) <= 3 and sizes[399] < 2048, sizes


def test_the_single_file_checkpoint_of_earlier_versions_is_read_and_migrated(
        state_dir: Path, caplog) -> None:
    """A node upgrading keeps its placements: the checkpoint as earlier versions wrote it (the
    whole payload in one file, shared containers carrying the pool) is read, then written as
    snapshot and journal."""
    first = plugin_at(state_dir)
    g, be = msg.pod("g"), msg.pod("be", "besteffort")
    first.create_container(msg.create(g, msg.guaranteed(g, "app", 2)))
    first.create_container(msg.create(be, msg.container(be, "app")))
    state = in_memory(first)
    for name in os.listdir(state_dir):  # start from the old format alone
        os.unlink(state_dir / name)
    records = first._records  # noqa: SLF001
    pool = first.ledger.allocations.shared
    old = CheckpointStore(state_dir, machine_fingerprint(machine()))
    old.save({"ledger": first.ledger.to_dict(),
              "records": records_to_dict(records.pods, {
                  k: c if c.exclusive else _on(c, pool) for k, c in records.containers.items()}),
              "config": recorded(first.ledger.ctx).to_dict()})
    with caplog.at_level(logging.INFO):
        upgraded = plugin_at(state_dir)
    assert in_memory(upgraded) == state
    assert "single-file format of an earlier nri-numa" in caplog.text
    snapshot = read_envelope((state_dir / "checkpoint.json").read_bytes())["payload"]
    assert "journal" in snapshot and (state_dir / "checkpoint.journal").exists()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert in_memory(plugin_at(state_dir)) == state  # migrated once
    assert "single-file format" not in caplog.text


def test_a_torn_tail_is_dropped_with_one_warning(state_dir: Path, caplog) -> None:
    plugin = plugin_at(state_dir)
    g = msg.pod("g")
    plugin.create_container(msg.create(g, msg.guaranteed(g, "app", 2)))
    state = in_memory(plugin)
    journal_file = state_dir / "checkpoint.journal"
    with open(journal_file, "ab") as f:
        f.write(frame(b'{"ops":[["pods","x",null]],"seq":2}')[:20])
    with caplog.at_level(logging.WARNING):
        assert in_memory(plugin_at(state_dir)) == state
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "torn tail dropped" in warnings[0], warnings
    assert parse(journal_file.read_bytes()).torn is None  # written again whole at the restart


def test_a_journal_damaged_before_its_tail_is_set_aside_with_its_snapshot(
        state_dir: Path, caplog) -> None:
    plugin = plugin_at(state_dir)
    for name in ("a", "b", "c"):  # a is in the snapshot, b and c are records 1 and 2
        sandbox = msg.pod(name)
        plugin.create_container(msg.create(sandbox, msg.guaranteed(sandbox, "app", 1)))
    journal_file = state_dir / "checkpoint.journal"
    data = bytearray(journal_file.read_bytes())
    header = len(frame(read_header(bytes(data))))
    data[header + 12] ^= 0x01  # inside the first record, the second one after it
    journal_file.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert not plugin_at(state_dir).containers  # rebuilt from the runtime, as for any
    aside = sorted(p.name.split(".corrupt-")[0] for p in state_dir.iterdir()
                   if ".corrupt-" in p.name)
    assert aside == ["checkpoint.journal", "checkpoint.json"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "checksum mismatch with records after it" in warnings[0]


def read_header(data: bytes) -> bytes:
    return parse(data).header


def test_a_journal_of_another_snapshot_is_ignored(state_dir: Path) -> None:
    """What a kill between a compaction's two renames leaves: the new snapshot holds all."""
    plugin = plugin_at(state_dir)
    g = msg.pod("g")
    plugin.create_container(msg.create(g, msg.guaranteed(g, "app", 2)))
    state = in_memory(plugin)
    (state_dir / "checkpoint.journal").write_bytes(frame(canonical({
        "format": "nri-numa-journal", "snapshot": "0" * 32, "version": 1}))
        + frame(b'{"ops":[["pods","uid-g",null]],"seq":1}'))
    # The snapshot still names its own journal: only the one on disk is another's.
    assert in_memory(plugin_at(state_dir)) == state and on_disk(state_dir) == state


def test_after_a_reboot_snapshot_and_journal_go_aside_with_one_warning(state_dir: Path,
                                                                        caplog) -> None:
    from nri_numa.engine.config_reader import config_from_mapping
    from tests.integration.nri.plugin_env import CONFIG
    earlier = NumaPlugin(machine(), config_from_mapping({**CONFIG, **MEMORY}), CheckpointStore(
        state_dir, machine_fingerprint(machine()), boot_id="an-earlier-boot"))
    for name in ("a", "b"):
        sandbox = msg.pod(name)
        earlier.create_container(msg.create(sandbox, msg.guaranteed(sandbox, "app", 1)))
    assert (state_dir / "checkpoint.journal").stat().st_size > 100  # b is a journal record
    with caplog.at_level(logging.INFO):
        assert not plugin_at(state_dir).containers
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "written before the machine last started" in warnings[0]
    aside = sorted(p.name.split(".corrupt-")[0] for p in state_dir.iterdir()
                   if ".corrupt-" in p.name)
    assert aside == ["checkpoint.journal", "checkpoint.json"]

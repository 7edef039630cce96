"""The checkpoint file: atomic replacement, mode 0600, checksums, and every kind of bad file set
aside (never trusted, never lost) — including a writer killed with SIGKILL at random moments."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nri_numa.state import checkpoint as cp
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore, machine_fingerprint
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, HugePages, NumaNode

MACHINE = "m" * 64
PAYLOAD = {"ledger": {"version": 1, "allocations": {"shared": "0-3"}}, "records": {"n": [1, 2]}}


def _store(state_dir: Path, machine: str = MACHINE) -> CheckpointStore:
    # A fixed clock: set-aside names are predictable.
    return CheckpointStore(state_dir, machine, clock=lambda: 1_700_000_000.0)


def _aside(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob(cp.FILE_NAME + ".corrupt-*"))


def test_round_trip_and_permissions(state_dir):
    store = _store(state_dir)
    assert store.load() is None  # nothing yet, and no folder: not an error
    store.save(PAYLOAD)
    assert store.load() == PAYLOAD
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    envelope = json.loads(store.path.read_text())
    assert envelope["format"] == cp.FORMAT and envelope["version"] == cp.CHECKPOINT_VERSION
    assert envelope["machine"] == MACHINE and len(envelope["sha256"]) == 64


def test_a_new_save_replaces_the_old_one_and_leaves_no_temp_files(state_dir):
    store = _store(state_dir)
    store.save(PAYLOAD)
    store.save({"ledger": None, "records": {"n": [3]}})
    assert store.load() == {"ledger": None, "records": {"n": [3]}}
    assert [p.name for p in state_dir.iterdir()] == [cp.FILE_NAME]


def test_a_failed_write_keeps_the_good_file(state_dir, monkeypatch):
    store = _store(state_dir)
    store.save(PAYLOAD)
    before = store.path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cp.os, "fsync", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        store.save({"ledger": "new"})
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert [p.name for p in state_dir.iterdir()] == [cp.FILE_NAME]
    assert store.load() == PAYLOAD


def test_a_payload_that_is_not_json_touches_nothing(state_dir):
    store = _store(state_dir)
    store.save(PAYLOAD)
    with pytest.raises(CheckpointError, match="JSON"):
        store.save({"ledger": {1, 2}})
    assert store.load() == PAYLOAD


def test_a_temp_file_left_by_a_kill_is_ignored_and_removed(state_dir):
    store = _store(state_dir)
    store.save(PAYLOAD)
    leftover = state_dir / (cp.FILE_NAME + ".tmp-abc123")
    leftover.write_text('{"format": "nri-numa-checkpoint", "vers')  # killed mid-write
    assert store.load() == PAYLOAD
    assert not leftover.exists()
    assert _aside(state_dir) == []


@pytest.mark.parametrize("damage, reason", [
    (lambda raw: raw[: len(raw) // 2], "not JSON"),
    (lambda raw: b"", "not JSON"),
    (lambda raw: b"\xff\xfe garbage", "not JSON"),
    (lambda raw: raw.replace(b'"0-3"', b'"0-7"'), "checksum mismatch"),
    (lambda raw: raw.replace(b'"version":1', b'"version":2'), "version 2"),
    (lambda raw: raw.replace(MACHINE.encode(), b"x" * 64), "another machine"),
    (lambda raw: b'{"some": "other file"}', "not an nri-numa checkpoint"),
    (lambda raw: b"[1, 2, 3]", "not an nri-numa checkpoint"),
])
def test_a_bad_file_is_set_aside_with_a_warning(state_dir, caplog, damage, reason):
    store = _store(state_dir)
    store.save(PAYLOAD)
    bad = damage(store.path.read_bytes())
    store.path.write_bytes(bad)
    with caplog.at_level(logging.WARNING, logger=cp.__name__):
        assert store.load() is None
    assert not store.path.exists()
    [aside] = _aside(state_dir)
    assert aside.name == f"{cp.FILE_NAME}.corrupt-20231114T221320Z"
    assert aside.read_bytes() == bad  # kept for a person to look at
    assert reason in caplog.text and aside.name in caplog.text
    store.save(PAYLOAD)  # and the next write starts afresh
    assert store.load() == PAYLOAD


def test_a_removed_folder_is_made_again_and_a_stale_temp_of_the_same_name_is_overwritten(
        state_dir):
    store = _store(state_dir)
    store.save(PAYLOAD)
    shutil.rmtree(state_dir)
    # What a killed writer with this pid and thread left: longer than the new file.
    state_dir.mkdir(mode=0o700)
    stale = state_dir / f"{cp.FILE_NAME}.tmp-{os.getpid()}-{threading.get_ident()}"
    stale.write_bytes(b"x" * 100_000)
    store.save(PAYLOAD)
    assert [p.name for p in state_dir.iterdir()] == [cp.FILE_NAME]
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load() == PAYLOAD
    shutil.rmtree(state_dir)
    store.save(PAYLOAD)  # the folder is gone: made again, 0700
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert store.load() == PAYLOAD


def test_set_aside_never_overwrites_an_earlier_one(state_dir):
    store = _store(state_dir)
    for _ in range(3):
        store.path.parent.mkdir(parents=True, exist_ok=True)
        store.path.write_text("garbage")
        assert store.load() is None
    assert [p.name.rsplit("Z", 1)[1] for p in _aside(state_dir)] == ["", "-2", "-3"]


def test_the_lock_keeps_a_second_agent_out(state_dir):
    first, second = _store(state_dir), _store(state_dir)
    first.lock()
    with pytest.raises(CheckpointError, match="in use by another nri-numa"):
        second.lock()
    first.unlock()
    second.lock()
    second.unlock()


_WRITER = """
import sys
from nri_numa.state.checkpoint import CheckpointStore
store = CheckpointStore(sys.argv[1], sys.argv[2])
n = 0
while True:
    n += 1
    store.save({"n": n, "filler": "x" * (n % 5000)})
"""


def test_a_writer_killed_at_any_moment_leaves_a_good_checkpoint(state_dir):
    """SIGKILL a process that saves in a loop, at several moments: what is on disk is always
    a complete checkpoint from one of its saves."""
    repo = Path(__file__).resolve().parents[3]
    seen: list[int] = []
    for delay in (0.05, 0.11, 0.17, 0.23):
        # The last round's file would end the wait below before this writer has saved at all.
        (state_dir / cp.FILE_NAME).unlink(missing_ok=True)
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(state_dir), MACHINE],
                                  cwd=repo)
        deadline = time.monotonic() + 10
        while not (state_dir / cp.FILE_NAME).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        payload = _store(state_dir).load()
        assert payload is not None and payload["filler"] == "x" * (payload["n"] % 5000)
        assert _aside(state_dir) == []
        assert [p.name for p in state_dir.iterdir()] == [cp.FILE_NAME]
        seen.append(payload["n"])
    assert min(seen) >= 1


# --- machine fingerprint ---------------------------------------------------------------------


def _topology(online3: bool = True, free_pages: int = 10) -> Topology:
    cpus = tuple(Cpu(id=i, numa=i // 2, core=i, socket=0, online=i != 3 or online3)
                 for i in range(4))
    nodes = tuple(NumaNode(id=n, cpus=frozenset(c.id for c in cpus if c.numa == n and c.online),
                           memory_bytes=1 << 30, hugepages={2048: HugePages(10, free_pages)})
                  for n in range(2))
    return Topology(cpus=cpus, numa_nodes=nodes)


def test_fingerprint_follows_the_cpus_not_the_free_memory():
    assert machine_fingerprint(_topology()) == machine_fingerprint(_topology(free_pages=3))
    assert machine_fingerprint(_topology()) != machine_fingerprint(_topology(online3=False))

"""The checkpoint across boots and without fsync: a file from an earlier boot describes
containers that cannot run any more and is set aside; a store made with ``fsync=False`` (the
plugin's) never syncs, and what it wrote reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_numa.state import checkpoint as cp
from nri_numa.state.checkpoint import CheckpointStore

MACHINE = "m" * 64
PAYLOAD = {"ledger": {"version": 1}, "records": {"n": [1]}}


def test_the_boot_id_is_the_kernels() -> None:
    assert cp.current_boot_id() == Path(cp.BOOT_ID).read_text().strip()


def test_a_checkpoint_from_an_earlier_boot_is_set_aside(state_dir, caplog) -> None:
    CheckpointStore(state_dir, MACHINE, boot_id="boot-1").save(PAYLOAD)
    assert CheckpointStore(state_dir, MACHINE, boot_id="boot-1").load() == PAYLOAD
    assert CheckpointStore(state_dir, MACHINE, boot_id="boot-2").load() is None
    assert "written before the machine last started" in caplog.text
    assert [p.name.split("-")[0] for p in state_dir.glob("checkpoint.json.corrupt-*")] == [
        "checkpoint.json.corrupt"]


def test_a_checkpoint_without_a_boot_id_is_read(state_dir) -> None:
    store = CheckpointStore(state_dir, MACHINE, boot_id="boot-1")
    store.save(PAYLOAD)
    envelope = json.loads(store.path.read_bytes())
    del envelope["boot"]  # written where the boot id could not be read
    store.path.write_text(json.dumps(envelope))
    assert store.load() == PAYLOAD


@pytest.mark.parametrize("fsync, syncs", [(True, 2), (False, 0)])
def test_fsync_only_when_asked(state_dir, monkeypatch, fsync: bool, syncs: int) -> None:
    calls: list[int] = []
    monkeypatch.setattr(cp.os, "fsync", calls.append)
    store = CheckpointStore(state_dir, MACHINE, fsync=fsync)
    store.save(PAYLOAD)
    assert len(calls) == syncs  # the file, then its folder
    monkeypatch.undo()
    assert store.load() == PAYLOAD
    assert [p.name for p in state_dir.iterdir() if p.name.startswith(cp.FILE_NAME)] == [
        cp.FILE_NAME]

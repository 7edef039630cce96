"""The checksum of a checkpoint read back: over the payload's bytes as save wrote them, without
encoding the parsed payload again; a file laid out otherwise is judged on the payload encoded
again, and a changed payload is still a checksum mismatch, set aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_numa.state import checkpoint as cp
from nri_numa.state.checkpoint import CheckpointStore, UntrustedCheckpoint, read_envelope
from nri_numa.state.encoding import canonical

MACHINE = "m" * 64
PAYLOAD = {"ledger": {"version": 1, "allocations": {"shared": "0-3", "pods": {}}},
           "records": {"pods": [], "containers": [{"id": "payload", "since": 0.1}]},
           "processes": {"a": {"x": ',"payload":'}, "payload": {"since": 1e-7}}}


def _saved(state_dir: Path, payload: dict = PAYLOAD) -> tuple[CheckpointStore, bytes]:
    store = CheckpointStore(state_dir, MACHINE, clock=lambda: 1_700_000_000.0, fsync=False)
    store.save(payload)
    return store, store.path.read_bytes()


def _encoding_counted(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    encoded: list[object] = []

    def counted(value: object) -> bytes:
        encoded.append(value)
        return canonical(value)

    monkeypatch.setattr(cp, "canonical", counted)
    return encoded


def test_a_saved_file_is_checked_without_encoding_its_payload_again(state_dir, monkeypatch):
    store, raw = _saved(state_dir)
    encoded = _encoding_counted(monkeypatch)
    assert store.load() == PAYLOAD
    assert read_envelope(raw, MACHINE)["payload"] == PAYLOAD
    assert encoded == []


@pytest.mark.parametrize("layout", ["indented", "payload first", "no newline"])
def test_a_file_laid_out_otherwise_is_judged_on_its_payload_encoded_again(
        state_dir, monkeypatch, layout):
    _, raw = _saved(state_dir)
    envelope = json.loads(raw)
    if layout == "indented":
        text = json.dumps(envelope, indent=2).encode()
    elif layout == "payload first":
        text = json.dumps({"payload": envelope.pop("payload"), **envelope}).encode()
    else:
        text = raw.rstrip(b"\n")
    encoded = _encoding_counted(monkeypatch)
    assert read_envelope(text, MACHINE)["payload"] == PAYLOAD
    assert encoded == [PAYLOAD]


@pytest.mark.parametrize("old, new", [(b'"0-3"', b'"0-4"'), (b'"since":0.1', b'"since":0.2'),
                                      (b'"containers"', b'"Containers"')])
def test_a_changed_payload_is_a_checksum_mismatch_and_set_aside(state_dir, old, new):
    store, raw = _saved(state_dir)
    assert raw.count(old) == 1
    damaged = raw.replace(old, new)
    with pytest.raises(UntrustedCheckpoint, match="^checksum mismatch$"):
        read_envelope(damaged, MACHINE)
    store.path.write_bytes(damaged)
    assert store.load() is None
    assert [p.name for p in state_dir.glob("checkpoint.json.corrupt-*")]

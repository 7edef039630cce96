"""The journal's frames (nri_numa.state.journal): records read back as written, a torn tail cut
at any byte dropped, damage before the tail refused, and the file written with 0600 and
without following links."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nri_numa.state import journal
from nri_numa.state.journal import JournalDamaged, frame, parse

HEADER = b'{"format":"nri-numa-journal","snapshot":"t","version":1}'
BODIES = [b'{"ops":[],"seq":1}', b'{"ops":[["pods","a",null]],"seq":2}',
          b'{"ops":[["containers","c",{"id":"c"}]],"seq":3,"shared":{"add":"4","drop":""}}']


def whole() -> bytes:
    return frame(HEADER) + b"".join(frame(b) for b in BODIES)


def test_records_read_back_as_written() -> None:
    contents = parse(whole())
    assert contents.header == HEADER and contents.records == tuple(BODIES)
    assert contents.good_bytes == len(whole()) and contents.torn is None


def test_a_tail_torn_at_every_byte_of_the_last_record_is_dropped() -> None:
    before = frame(HEADER) + b"".join(frame(b) for b in BODIES[:-1])
    last = frame(BODIES[-1])
    for cut in range(1, len(last)):
        contents = parse(before + last[:cut])
        assert contents.records == tuple(BODIES[:-1]), cut
        assert contents.good_bytes == len(before) and contents.torn, cut
    assert parse(before).torn is None


def test_a_last_record_with_a_wrong_checksum_is_a_torn_tail() -> None:
    data = bytearray(whole())
    data[-1] ^= 0x01
    contents = parse(bytes(data))
    assert contents.records == tuple(BODIES[:-1])
    assert contents.torn == "the last record's checksum does not match"


def test_zeros_after_the_last_record_are_a_torn_tail() -> None:
    contents = parse(whole() + bytes(4096))
    assert contents.records == tuple(BODIES) and contents.good_bytes == len(whole())
    assert contents.torn == "4096 zero bytes after the last record"


@pytest.mark.parametrize("record", [0, 1])
def test_a_bad_checksum_in_the_middle_is_damage_not_a_tail(record: int) -> None:
    data = bytearray(whole())
    offset = len(frame(HEADER)) + sum(len(frame(b)) for b in BODIES[:record])
    data[offset + journal.FRAME_BYTES + 3] ^= 0x20  # a byte of that record's body
    with pytest.raises(JournalDamaged, match=f"record {record + 1} at byte {offset}: checksum"):
        parse(bytes(data))


def test_a_length_no_record_can_have_is_damage() -> None:
    data = frame(HEADER) + (journal.MAX_RECORD + 1).to_bytes(4, "big") + bytes(4) + b"x" * 64
    with pytest.raises(JournalDamaged, match="claims"):
        parse(data)


def test_a_missing_or_torn_header_is_damage() -> None:
    with pytest.raises(JournalDamaged, match="header"):
        parse(frame(HEADER)[:5])
    with pytest.raises(JournalDamaged, match="header"):
        parse(b"")


def test_create_append_and_cut_on_disk(tmp_path: Path) -> None:
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = journal.create("j", folder, HEADER, sync=True)
        try:
            for body in BODIES:
                journal.append(fd, body, sync=False)
        finally:
            os.close(fd)
        assert stat.S_IMODE((tmp_path / "j").stat().st_mode) == 0o600
        assert (tmp_path / "j").read_bytes() == whole()
        with open(tmp_path / "j", "ab") as f:
            f.write(frame(b"torn")[:6])
        contents = parse((tmp_path / "j").read_bytes())
        journal.cut("j", folder, contents.good_bytes)
        assert (tmp_path / "j").read_bytes() == whole()
        # A new journal replaces the old one whole; no temp file stays behind.
        os.close(journal.create("j", folder, HEADER, sync=False))
        assert (tmp_path / "j").read_bytes() == frame(HEADER)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["j"]
    finally:
        os.close(folder)


def test_a_symlink_at_the_journal_name_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    (tmp_path / "j").symlink_to(target)
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Exception, match="symlink"):
            journal.read("j", folder, 1 << 20, str(tmp_path / "j"))
        os.close(journal.create("j", folder, HEADER, sync=False))  # replaces the link itself
    finally:
        os.close(folder)
    assert target.read_bytes() == b"keep" and not (tmp_path / "j").is_symlink()


def test_an_append_that_fails_leaves_no_half_record(tmp_path: Path, monkeypatch) -> None:
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fd = journal.create("j", folder, HEADER, sync=False)
    os.close(folder)
    real_write = os.write
    calls = []

    def half_then_fail(fd_: int, data) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd_, bytes(data)[:5])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_fail)
    with pytest.raises(OSError):
        journal.append(fd, BODIES[0], sync=False)
    monkeypatch.undo()
    os.close(fd)
    assert (tmp_path / "j").read_bytes() == frame(HEADER)

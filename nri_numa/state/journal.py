"""An append-only file of framed records: the journal that follows a checkpoint's snapshot.

Each record is a frame: its body's length (4 bytes, big-endian), the body's CRC-32 (4 bytes),
then the body. The first record is the journal's header. A record is appended with one
``write`` on a descriptor opened with ``O_APPEND``, so a kill -9 can only leave a prefix of the
last record (a torn tail); a power cut may leave zeros or garbage past the last whole record.
Reading tells the two kinds of damage apart:

* a torn tail — the file ends inside the last frame, or the last frame's checksum is wrong, or
  only zeros follow the last good frame — is dropped: that record was never acknowledged (the
  writer answers only after its write returned);
* anything wrong before the last frame (a bad checksum with more records after it, a length no
  record could have) means the file was damaged some other way, and it is not trusted at all.

The file layer knows nothing of what the bodies mean (nri_numa.state.plugin_checkpoint does).
Every file is opened relative to the state folder without following links (safeio.safe_files),
mode 0600; a new journal is written under a temp name and renamed into place, so the name
always holds a whole header.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from dataclasses import dataclass

from nri_numa.safeio import safe_files

_FRAME = struct.Struct(">II")  # body length, CRC-32 of the body
FRAME_BYTES = _FRAME.size
# Far past any one record (a Synchronize adopting every container is written as a snapshot,
# not as a record); a length beyond it can only be damage.
MAX_RECORD = 16 << 20


class JournalDamaged(Exception):
    """The journal is damaged before its last record; the message says where and how."""


def frame(body: bytes) -> bytes:
    """The record as it is written: length, checksum, body."""
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


@dataclass(frozen=True, slots=True)
class JournalContents:
    """What a journal file holds: its header's body, the bodies of the records after it, the
    length of the good part (where the next record goes), and why a tail was dropped."""

    header: bytes
    records: tuple[bytes, ...]
    good_bytes: int
    torn: str | None = None  # None: the file ended at a record's end


def parse(data: bytes) -> JournalContents:
    """The frames of ``data``; JournalDamaged when the damage is not a torn tail, or when
    not even the header is whole."""
    bodies: list[bytes] = []
    offset, end = 0, len(data)
    view = memoryview(data)  # slices of it are not copies: the zeros check stays O(1) per record
    torn = None
    while offset < end:
        rest = end - offset
        if not any(view[offset:]):  # zeros only: blocks allocated, never written
            torn = f"{rest} zero bytes after the last record"
            break
        if rest < FRAME_BYTES:
            torn = f"the last record's frame is cut after {rest} of {FRAME_BYTES} bytes"
            break
        length, crc = _FRAME.unpack_from(data, offset)
        if length == 0 or length > MAX_RECORD:
            raise JournalDamaged(f"record {len(bodies)} at byte {offset} claims {length} bytes")
        stop = offset + FRAME_BYTES + length
        if stop > end:
            torn = f"the last record is cut after {rest - FRAME_BYTES} of {length} bytes"
            break
        body = data[offset + FRAME_BYTES:stop]
        if zlib.crc32(body) != crc:
            if stop == end:
                torn = "the last record's checksum does not match"
                break
            raise JournalDamaged(f"record {len(bodies)} at byte {offset}: checksum mismatch "
                                 "with records after it")
        bodies.append(body)
        offset = stop
    if not bodies:
        raise JournalDamaged("its header is missing or damaged")
    return JournalContents(bodies[0], tuple(bodies[1:]), offset, torn)


def read(name: str, folder: int, limit: int, shown: str) -> bytes | None:
    """The journal's bytes; None when there is none. safe_files.UnusableFile when the name
    holds something else (a symlink, a folder, a FIFO) or too much."""
    contents = safe_files.read_regular(name, folder, limit, shown)
    return None if contents is None else contents.data


def cut(name: str, folder: int, length: int) -> None:
    """Drop everything past ``length`` (a torn tail), so that the next record follows the
    last good one. OSError as the system raises it."""
    fd = safe_files.open_file(name, os.O_WRONLY, folder=folder)
    try:
        os.ftruncate(fd, length)
    finally:
        os.close(fd)


def create(name: str, folder: int, header: bytes, *, sync: bool) -> int:
    """A new journal holding only ``header`` at ``name``, replacing what was there, and a
    descriptor to append to it. Written under a temp name, synced when ``sync``, then renamed:
    a kill leaves either the old file or the new one whole. OSError as the system raises it."""
    temp = f"{name}.tmp-{os.getpid()}"
    try:
        os.unlink(temp, dir_fd=folder)  # left by a killed writer: its mode is not ours
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=folder)
    try:
        safe_files.write_all(fd, frame(header))
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        safe_files.unlink_quietly(temp, folder)
        raise
    try:
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        os.close(fd)
        safe_files.unlink_quietly(temp, folder)
        raise
    # The descriptor of the temp file is the new journal's: appends continue at its end.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


def append(fd: int, body: bytes, *, sync: bool) -> int:
    """Append one record; the bytes written. On an error the file is cut back to where it was
    (so no half record stays before the next one) and the OSError raised."""
    data = frame(body)
    before = os.lseek(fd, 0, os.SEEK_END)
    try:
        safe_files.write_all(fd, data)
        if sync:
            os.fdatasync(fd)
    except OSError:
        try:
            os.ftruncate(fd, before)
        except OSError:
            pass  # the reader drops a torn tail; the writer compacts next (its caller's rule)
        raise
    return len(data)


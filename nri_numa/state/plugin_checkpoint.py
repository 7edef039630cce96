"""The NRI plugin's state on disk: a snapshot and the journal of the changes made since.

``checkpoint.json`` is the snapshot: the whole payload in the envelope of
nri_numa.state.checkpoint (format, version, machine, boot id, sha256), plus a payload member
``journal``, a random token naming the journal that follows it. ``checkpoint.journal`` holds
framed, checksummed records (nri_numa.state.journal): first a header carrying that token, then
one record per committed event with only what the event changed. Writing an event costs its own
size, not the ledger's.

A record is ``{"seq": n, "ops": [[table, key, value], ...], "shared": {"add": l, "drop": l}}``:
``value`` null deletes ``key``; a key deleted and set again in one event is written as a delete
and then a set, so that replay keeps the containers' order; ``shared`` is the pool's change as
two CPU lists. Tables: ``pods`` (the ledger's pod allocations), ``entries``, ``machineState``,
``reusable`` (the Memory Manager's state), ``podRecords`` and ``containers`` (the plugin's
records). A shared container's record does not carry the pool: on replay it is given the pool
as it ends up, which is what the snapshot writes for it.

Compaction, once the journal outgrows the snapshot (and at every start-up), writes a new
snapshot with a new token (temp file, fsync, rename) and only then a new journal with that token
(the same way). A kill between the two leaves the new snapshot beside the old journal, whose
token no longer matches: it is ignored, since the snapshot already holds all of it. A kill
inside an append leaves a torn tail, dropped with one warning (that event was never answered).
A journal damaged before its tail, or one whose snapshot was set aside, is set aside too, and the
state is rebuilt from the runtime as for any untrusted checkpoint.

A snapshot without a ``journal`` member is the single-file checkpoint of earlier nri-numa
versions (the same payload, rewritten whole at every event): it is read as a snapshot with an
empty journal, and the first compaction writes it in this format.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.safeio import safe_files
from nri_numa.safeio.bounded_json import JsonShapeError, loads
from nri_numa.safeio.safe_files import UnusableFile
from nri_numa.state import journal
from nri_numa.state.checkpoint import MAX_BYTES, CheckpointError, CheckpointStore
from nri_numa.state.encoding import canonical
from nri_numa.topology.cpulist import ListFormatError, format_list, parse_list

log = logging.getLogger(__name__)

JOURNAL_NAME = "checkpoint.journal"
JOURNAL_FORMAT = "nri-numa-journal"
JOURNAL_VERSION = 1
TOKEN_KEY = "journal"  # the snapshot's payload member naming its journal
# Compaction waits for at least this much journal: a compaction is a whole snapshot written
# before an answer, so on a small ledger it must stay rarer than one event in a few hundred
# (1 MiB is ~800 records).
MIN_COMPACT_BYTES = 1 << 20


class UntrustedState(Exception):
    """Snapshot and journal together cannot be trusted; the message says why."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """A trusted state: the payload as of the journal's last record, and what was found."""

    payload: dict[str, Any]
    records: int  # journal records replayed


class PluginCheckpoint:
    """Snapshot and journal in one state folder. One writer: the plugin holding the folder's
    lock (CheckpointStore.lock)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.journal_path = store.dir / JOURNAL_NAME
        self._fd: int | None = None  # the journal being appended to; None: compact next
        self._seq = 0
        self.journal_bytes = 0
        self.snapshot_bytes = 0

    @property
    def path(self) -> Path:
        return self.store.path

    @property
    def appendable(self) -> bool:
        """Whether the next event can be appended; otherwise it is written by a compaction."""
        return self._fd is not None

    def wants_compaction(self) -> bool:
        return self.journal_bytes > max(self.snapshot_bytes, MIN_COMPACT_BYTES)

    # --- reading --------------------------------------------------------------------------

    def load(self) -> Loaded | None:
        """Snapshot plus journal; None when there is no state or it was set aside (with a
        warning naming why). The journal is never appended to after a load: the caller
        compacts first (``appendable`` is False)."""
        self.close()
        payload = self.store.load()  # a bad snapshot is set aside in there
        if payload is None:  # its warning, if any, is the snapshot's: one line
            self._set_journal_aside("its snapshot is missing or was set aside", warn=False)
            return None
        try:
            data = self._read_journal()
            loaded = restore_payload(payload, data, str(self.journal_path))
        except UntrustedState as e:
            self.set_aside(str(e))
            return None
        return loaded

    def _read_journal(self) -> bytes | None:
        try:
            folder = safe_files.open_folder(self.store.dir)
        except UnusableFile as e:
            raise CheckpointError(f"state folder {e}") from None
        if folder is None:
            return None
        try:
            _remove_stale_temps(folder)
            data = journal.read(JOURNAL_NAME, folder, MAX_BYTES, str(self.journal_path))
            if data is not None:
                good = _good_length(data)
                if good is not None and good < len(data):
                    journal.cut(JOURNAL_NAME, folder, good)
            return data
        except UnusableFile as e:
            raise UntrustedState(e.why) from None
        except OSError as e:
            raise UntrustedState(f"cannot cut its torn tail: {e.strerror}") from None
        finally:
            os.close(folder)

    # --- writing --------------------------------------------------------------------------

    def append(self, ops: list[bytes], shared: tuple[frozenset[int], frozenset[int]] | None
               ) -> None:
        """One event's changes after the last record: ``ops`` already in JSON, ``shared`` the
        CPUs (added, dropped) from the pool. CheckpointError when it cannot be written; the next
        event is then written by a compaction."""
        if self._fd is None:
            raise CheckpointError("the journal is not open")  # the caller compacts instead
        self._seq += 1
        parts = [b'{"ops":[', b",".join(ops), b'],"seq":', str(self._seq).encode()]
        if shared is not None:
            added, dropped = shared
            parts += (b',"shared":{"add":"', format_list(added).encode(), b'","drop":"',
                      format_list(dropped).encode(), b'"}')
        parts.append(b"}")
        try:
            if _PAUSES:
                self.journal_bytes += _append_in_two(self._fd, b"".join(parts))
            else:
                self.journal_bytes += journal.append(self._fd, b"".join(parts),
                                                     sync=self.store.fsyncs)
        except OSError as e:
            self.close()
            raise CheckpointError(f"cannot write {self.journal_path}: {e.strerror}") from None

    def compact(self, payload: Mapping[str, Any]) -> None:
        """Write ``payload`` as the new snapshot, then start an empty journal after it.
        CheckpointError when the snapshot cannot be written (the old snapshot and journal stay
        whole). Once the snapshot is in place the state is on disk: a journal that cannot be
        started then is one warning, and the next event compacts again."""
        grown = self._seq > 0  # not the compaction of a start-up
        self.close()
        token = secrets.token_hex(16)
        self.snapshot_bytes = self.store.save({**payload, TOKEN_KEY: token})
        if grown:
            _pause_here("NRI_NUMA_TEST_PAUSE_COMPACTION")
        header = canonical({"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION,
                            "snapshot": token})
        try:
            folder = self.store.open_folder()
            try:
                fd = journal.create(JOURNAL_NAME, folder, header, sync=self.store.fsyncs)
                if self.store.fsyncs:
                    os.fsync(folder)
            finally:
                os.close(folder)
        except (OSError, CheckpointError) as e:
            log.warning("cannot start a new journal %s after the snapshot: %s; the next change "
                        "writes the snapshot again", self.journal_path,
                        getattr(e, "strerror", None) or e)
            return
        self._fd, self._seq = fd, 0
        self.journal_bytes = journal.FRAME_BYTES + len(header)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def set_aside(self, reason: str) -> None:
        """Snapshot and journal renamed out of the way (kept for a person), one warning."""
        self.close()
        self.store.set_aside(reason)
        self._set_journal_aside(reason, warn=False)

    def _set_journal_aside(self, reason: str, warn: bool = True) -> None:
        try:
            folder = safe_files.open_folder(self.store.dir)
        except UnusableFile:
            return
        if folder is None:
            return
        try:
            if not safe_files.lexists(JOURNAL_NAME, folder):
                return
            name = safe_files.corrupt_name(JOURNAL_NAME, folder, time.time())
            try:
                os.replace(JOURNAL_NAME, name, src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as e:
                log.warning("cannot set %s aside: %s", self.journal_path, e.strerror)
                return
            (log.warning if warn else log.info)("journal %s set aside as %s: %s",
                                                self.journal_path, self.store.dir / name, reason)
        finally:
            os.close(folder)


# --- test pauses -----------------------------------------------------------------------------
# The kill -9 tests (tests/e2e/test_journal_kill.py) stop the plugin in the middle of an append
# and of a compaction. Each pause is a file name in an environment variable: when the variable
# is set at start-up, the plugin writes that file and sleeps there until it is killed. Unset,
# as in every deployment, nothing here runs: ``_PAUSES`` is empty.
_PAUSE_NAMES = ("NRI_NUMA_TEST_PAUSE_APPEND", "NRI_NUMA_TEST_PAUSE_COMPACTION")
_PAUSES = {name: os.environ[name] for name in _PAUSE_NAMES if os.environ.get(name)}


def _pause_here(name: str) -> None:
    marker = _PAUSES.get(name)
    if marker is None:
        return
    Path(marker).write_text(str(os.getpid()))
    while True:
        time.sleep(3600)


def _append_in_two(fd: int, body: bytes) -> int:
    """The record written as two writes with the pause between them: a torn tail when the
    plugin is killed there."""
    data = journal.frame(body)
    half = len(data) // 2
    safe_files.write_all(fd, data[:half])
    _pause_here("NRI_NUMA_TEST_PAUSE_APPEND")
    safe_files.write_all(fd, data[half:])
    return len(data)


# --- replay (pure) --------------------------------------------------------------------------


def restore_payload(payload: dict[str, Any], data: bytes | None, shown: str,
                    quiet: bool = False) -> Loaded:
    """The snapshot's ``payload`` with the journal's bytes ``data`` replayed (None: there is
    no journal). A journal of another snapshot (a compaction cut short after the snapshot's
    rename) is ignored; a torn tail is dropped with one warning; UntrustedState otherwise."""
    info = (lambda *args: None) if quiet else log.info
    token = payload.pop(TOKEN_KEY, None)
    if token is None:
        if data is not None:
            info("%s: ignored, its snapshot is in the single-file format", shown)
        info("checkpoint in the single-file format of an earlier nri-numa: read, and written "
             "again as snapshot and journal")
        return Loaded(payload, 0)
    if data is None:
        return Loaded(payload, 0)  # cut short before the journal's rename
    try:
        contents = journal.parse(data)
    except journal.JournalDamaged as e:
        raise UntrustedState(f"{shown}: {e}") from None
    header = _json(contents.header, f"{shown}: header")
    if header.get("format") != JOURNAL_FORMAT or header.get("version") != JOURNAL_VERSION:
        raise UntrustedState(f"{shown}: not an nri-numa journal of version {JOURNAL_VERSION}")
    if header.get("snapshot") != token:
        info("%s belongs to an earlier snapshot (a compaction was cut short): ignored",
                 shown)
        return Loaded(payload, 0)
    if contents.torn is not None and not quiet:
        log.warning("%s: torn tail dropped (%s): that event was never answered", shown,
                    contents.torn)
    image = _Image(payload, shown)
    for seq, body in enumerate(contents.records, 1):
        image.apply(_json(body, f"{shown}: record {seq}"), seq)
    return Loaded(image.payload(), len(contents.records))


class _Image:
    """The payload as tables by key, for records to change."""

    def __init__(self, payload: dict[str, Any], shown: str) -> None:
        self._payload, self._shown = payload, shown
        try:
            allocations = payload["ledger"]["allocations"]
            memory = allocations.get("memory")
            records = payload["records"]
            self.tables: dict[str, dict[str, Any]] = {
                "pods": dict(allocations["pods"]),
                "podRecords": {p["sandbox_id"]: p for p in records["pods"]},
                "containers": {c["id"]: c for c in records["containers"]}}
            if memory is not None:
                self.tables.update(entries=dict(memory["entries"]),
                                   machineState=dict(memory["machineState"]),
                                   reusable=dict(memory.get("reusable", {})))
            self.shared = parse_list(allocations["shared"])
        except (KeyError, TypeError, AttributeError, ListFormatError) as e:
            raise UntrustedState(f"snapshot's payload has another shape ({e})") from None

    def apply(self, record: dict[str, Any], seq: int) -> None:
        where = f"{self._shown}: record {seq}"
        if record.get("seq") != seq:
            raise UntrustedState(f"{where} is numbered {record.get('seq')!r}")
        ops = record.get("ops")
        if not isinstance(ops, list):
            raise UntrustedState(f"{where} has no list of changes")
        for op in ops:
            if (not isinstance(op, list) or len(op) != 3 or op[0] not in self.tables
                    or not isinstance(op[1], str)):
                raise UntrustedState(f"{where}: a change that cannot be read")
            table = self.tables[op[0]]
            if op[2] is None:
                table.pop(op[1], None)
            else:
                table[op[1]] = op[2]
        shared = record.get("shared")
        if shared is not None:
            try:
                self.shared = (self.shared - parse_list(shared["drop"])) | parse_list(shared["add"])
            except (KeyError, TypeError, ListFormatError):
                raise UntrustedState(f"{where}: the shared pool's change cannot be read") from None

    def payload(self) -> dict[str, Any]:
        payload, t = self._payload, self.tables
        shared = format_list(self.shared)
        allocations = payload["ledger"]["allocations"]
        allocations["pods"] = t["pods"]
        allocations["shared"] = shared
        if allocations.get("memory") is not None:
            allocations["memory"] = {"entries": t["entries"], "machineState": t["machineState"],
                                     "reusable": t["reusable"]}
        containers = list(t["containers"].values())
        for c in containers:
            if isinstance(c, dict) and c.get("exclusive") is False:
                c["cpus"] = shared  # shared containers follow the pool
        payload["records"] = {"pods": list(t["podRecords"].values()), "containers": containers}
        return payload


def _json(body: bytes, where: str) -> dict[str, Any]:
    try:
        value = loads(body)
    except JsonShapeError as e:
        raise UntrustedState(f"{where}: {e}") from None
    if not isinstance(value, dict):
        raise UntrustedState(f"{where} is not an object")
    return value


def _good_length(data: bytes) -> int | None:
    try:
        return journal.parse(data).good_bytes
    except journal.JournalDamaged:
        return None  # left whole: it is set aside as it is


def _remove_stale_temps(folder: int) -> None:
    prefix = JOURNAL_NAME + ".tmp-"
    for name in os.listdir(folder):
        if name.startswith(prefix):
            safe_files.unlink_quietly(name, folder)


def read_state(state_dir: Path, raw_payload: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """For readers that take no lock (``nri-numa state``): the snapshot's payload with its
    journal replayed, and the journal's modification time (0 without one). Nothing is logged
    or changed. UntrustedState when the two cannot be trusted together."""
    shown = str(state_dir / JOURNAL_NAME)
    try:
        folder = safe_files.open_folder(state_dir)
        if folder is None:
            return raw_payload, 0.0
        try:
            contents = safe_files.read_regular(JOURNAL_NAME, folder, MAX_BYTES, shown)
        finally:
            os.close(folder)
    except UnusableFile as e:
        raise UntrustedState(str(e)) from None
    data, written = (None, 0.0) if contents is None else (contents.data, contents.mtime)
    return restore_payload(raw_payload, data, shown, quiet=True).payload, written

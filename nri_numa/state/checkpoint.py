"""The plugin's state on disk: the ledger and the containers it placed, in ``--state-dir``.

One file, ``checkpoint.json``: a small envelope (format, version, the machine's fingerprint, the
kernel's boot id and the sha256 of the payload's canonical JSON) around the payload. It is
replaced atomically (temp file in the same folder, fsync, rename, fsync the folder) with mode
0600, so a kill -9 at any moment leaves either the old file or the new one, never a mix, and a
failed write never touches the good file. A file that cannot be trusted — not JSON, truncated,
checksum wrong, another format version, another machine, an earlier boot — is renamed aside
(``checkpoint.json.corrupt-<time>``) with a warning, and the caller rebuilds its state from the
runtime (NRI Synchronize). So is anything else found at that name: a symlink, a folder, a FIFO,
a file past MAX_BYTES, JSON nested past its bounds (nri_numa.safeio.bounded_json). The lock file
goes the same way when it is not a regular file or cannot be opened (``lock.corrupt-<time>``),
unless another process holds it. Every file here is opened relative to the folder, without
following links (nri_numa.safeio.safe_files), and a state folder that is itself a symlink is
refused.

No container outlives the machine, so a checkpoint only has to outlive the process that wrote
it, and one from an earlier boot is never trusted. A store made with ``fsync=False`` therefore
skips both fsyncs: after a kill -9 the kernel still holds the renamed file; after a power cut
the file, whatever state it is in, belongs to the earlier boot.

The payload's second half, the plugin's records of pods and containers (what the plugin must
remember across restarts besides the ledger), is defined in ``nri_numa.state.plugin_records``.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nri_numa.safeio import safe_files
from nri_numa.safeio.bounded_json import JsonShapeError, loads
from nri_numa.safeio.safe_files import NotAFile, UnusableFile
from nri_numa.state.encoding import canonical, encode_payload
from nri_numa.topology.cpulist import format_list
from nri_numa.topology.model import Topology

log = logging.getLogger(__name__)

FORMAT = "nri-numa-checkpoint"
CHECKPOINT_VERSION = 1
FILE_NAME = "checkpoint.json"
LOCK_NAME = "lock"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_TEMP_PREFIX = FILE_NAME + ".tmp-"
# A file as save writes it: the header, then these around the payload's canonical JSON.
_PAYLOAD_KEY = b',"payload":'
_END = b"}\n"
# Far past any real checkpoint (a few KiB per container), short of what would flood memory.
MAX_BYTES = 64 << 20
REBUILT = "the state will be rebuilt from the runtime"
# Waiting for the lock: flock cannot time out, so poll, 1 ms first, doubling up to 20 ms.
_LOCK_FIRST_WAIT = 0.001
_LOCK_LAST_WAIT = 0.02


class CheckpointError(Exception):
    """The state cannot be written (the good file is untouched) or the folder is in use."""


class LockBusy(CheckpointError):
    """Another process held the state folder's lock for the whole wait."""


def sha256_hex(data: bytes) -> str:
    """SHA-256 of ``data`` in hex."""
    return hashlib.sha256(data).hexdigest()


def machine_fingerprint(topology: Topology) -> str:
    """What a checkpoint's CPU and device ids mean on this machine: CPUs with their core,
    socket and node, and GPUs by UUID. Free hugepages and warnings change while the machine is
    the same, so they are left out."""
    shape = {"cpus": [[c.id, c.numa, c.core, c.socket, c.online] for c in topology.cpus],
             "nodes": [[n.id, format_list(n.cpus)] for n in topology.numa_nodes],
             "gpus": sorted(g.uuid for g in topology.gpus)}
    return sha256_hex(canonical(shape))


class CheckpointStore:
    """``state_dir/checkpoint.json`` for one machine."""

    def __init__(self, state_dir: str | Path, machine: str,
                 clock: Callable[[], float] = time.time, *, fsync: bool = True,
                 boot_id: str | None = None, rebuilt: str = REBUILT) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / FILE_NAME
        self.machine = machine
        self.boot_id = boot_id or current_boot_id()
        self._clock = clock
        self._fsync = fsync
        self._rebuilt = rebuilt  # what becomes of the state once a file is set aside
        self._lock_fd: int | None = None

    def lock(self, timeout: float | None = None) -> None:
        """Hold ``state_dir/lock`` until ``unlock``: two agents on one ledger would hand out
        the same CPUs. Without a timeout a held lock fails at once (one plugin per folder);
        with one, wait up to that many seconds for it (short-lived hook processes take turns).
        The lock is a file of its own, never replaced while it can serve, so it outlives every
        checkpoint; one that cannot serve is set aside (``_open_lock``)."""
        folder = self._folder()
        try:
            fd = self._open_lock(folder)
        finally:
            os.close(folder)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _LOCK_FIRST_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = 0.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    os.close(fd)
                    waited = "" if timeout is None else f" (waited {timeout:.3g} s)"
                    raise LockBusy(f"{self.dir} is in use by another nri-numa{waited}; "
                                   f"it holds {self.dir / LOCK_NAME}") from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, _LOCK_LAST_WAIT)
        self._lock_fd = fd

    def _open_lock(self, folder: int) -> int:
        """The lock file's descriptor, made when missing. Anything at its name that cannot serve
        as the lock — a symlink (never followed), a folder, a FIFO, a socket, a device, or a file
        that cannot be opened — is set aside as ``lock.corrupt-<time>`` with one warning and a
        new lock made: no process can hold a lock on such a thing, so no holder loses its lock,
        and a damaged folder never keeps the agent or a hook from starting. A file that cannot
        be opened but is held (by a process that could open it) is left alone: LockBusy.
        CheckpointError when a new lock cannot be made."""
        shown = self.dir / LOCK_NAME
        for _ in range(3):  # set aside, then replaced by something unusable again at once
            try:
                return safe_files.open_file(LOCK_NAME, safe_files.LOCK, folder=folder,
                                            shown=shown)
            except NotAFile as e:
                why = e.why
            except OSError as e:
                if not safe_files.lexists(LOCK_NAME, folder):  # cannot be made: no room, no right
                    raise CheckpointError(f"cannot open {shown}: {e.strerror}") from None
                try:  # a file not ours to write (mode 0400): a read-only descriptor locks too
                    return safe_files.open_file(LOCK_NAME, safe_files.READ, folder=folder,
                                                shown=shown)
                except (NotAFile, OSError):
                    pass
                why = f"it cannot be opened ({e.strerror})"
            self._set_lock_aside(folder, why)
        raise CheckpointError(f"cannot use {shown}: it keeps being replaced by something "
                              "that is not a lock file")

    def _set_lock_aside(self, folder: int, why: str) -> None:
        """Rename what is at the lock's name aside, as it is, with one warning. Under an flock
        of the folder itself, and only when it is still unusable: two processes finding the
        same damage must not rename the lock the first one made in its place."""
        fcntl.flock(folder, fcntl.LOCK_EX)
        try:
            try:
                info = os.stat(LOCK_NAME, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                return  # set aside by another process, which makes the new one
            if stat.S_ISREG(info.st_mode):
                if _opens(folder):
                    return  # made anew by another process meanwhile: use it
                if _held(info):
                    raise LockBusy(f"{self.dir} is in use by another nri-numa: it holds "
                                   f"{self.dir / LOCK_NAME}, which this process cannot open")
            name = safe_files.corrupt_name(LOCK_NAME, folder, self._clock())
            try:
                os.replace(LOCK_NAME, name, src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as e:
                raise CheckpointError(f"cannot use {self.dir / LOCK_NAME} ({why}) nor set it "
                                      f"aside: {e.strerror}") from None
            log.warning("lock %s set aside as %s: %s; a new lock is made", self.dir / LOCK_NAME,
                        self.dir / name, " ".join(why.split()))
        finally:
            fcntl.flock(folder, fcntl.LOCK_UN)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load(self) -> dict[str, Any] | None:
        """The payload of a good checkpoint; None when there is none or it was set aside.
        CheckpointError only when the folder cannot be used: whatever is wrong with the file
        sets it aside."""
        folder = self._existing_folder()
        if folder is None:
            return None
        try:
            self._remove_stale_temps(folder)
            try:
                contents = safe_files.read_regular(FILE_NAME, folder, MAX_BYTES, self.path)
                if contents is None:
                    return None
                return self._payload(contents.data)
            except UnusableFile as e:
                self._set_aside(folder, e.why)
            except UntrustedCheckpoint as e:
                self._set_aside(folder, str(e))
            return None
        finally:
            os.close(folder)

    @property
    def fsyncs(self) -> bool:
        """Whether writes are synced to the disk (see the module's notes)."""
        return self._fsync

    def open_folder(self) -> int:
        """The state folder's descriptor (made if missing); the caller closes it.
        CheckpointError when it is a symlink, not a folder, or cannot be made."""
        return self._folder()

    def save(self, payload: Mapping[str, Any]) -> int:
        """Replace the checkpoint with ``payload``, whose members may come ``Encoded`` already
        (nri_numa.state.encoding); the bytes written. CheckpointError leaves the old file
        whole."""
        try:
            body = encode_payload(payload)  # fails before anything touches the disk
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"state cannot be written as JSON: {e}") from None
        header = {"format": FORMAT, "version": CHECKPOINT_VERSION, "machine": self.machine,
                  "boot": self.boot_id, "sha256": sha256_hex(body)}
        # The payload is encoded once: handlers wait for this write, and re-encoding (or
        # indenting, which takes json's slow path) costs more than the rest of a decision.
        data = canonical(header)[:-1] + _PAYLOAD_KEY + body + _END
        # One temp name per process and thread, created afresh, instead of mkstemp's
        # random names and buffered file object, which the runtime would wait for. Writers to
        # one folder are one process at a time (the lock).
        temp = f"{_TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}"
        folder, fd = self._open_temp(temp)
        try:
            try:
                try:
                    # Blocks allocated up front: for a file renamed over another, ext4
                    # otherwise allocates them and starts their writeback inside rename()
                    # (auto_da_alloc), while the runtime waits for the answer.
                    os.posix_fallocate(fd, 0, len(data))
                    safe_files.write_all(fd, data)
                    if self._fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                # Renaming replaces whatever has the name, a planted symlink included, and
                # writes through nothing.
                os.replace(temp, FILE_NAME, src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as e:
                safe_files.unlink_quietly(temp, folder)
                raise CheckpointError(f"cannot write {self.path}: {e.strerror}") from None
            if self._fsync:
                self._fsync_dir(folder)
        finally:
            os.close(folder)
        return len(data)

    def set_aside(self, reason: str) -> Path | None:
        """Rename the checkpoint out of the way (kept for a person to look at) and warn."""
        folder = self._existing_folder()
        if folder is None:
            return None
        try:
            return self._set_aside(folder, reason)
        finally:
            os.close(folder)

    def _set_aside(self, folder: int, reason: str) -> Path | None:
        # Whatever the name holds is renamed as it is: a folder or a symlink too, never
        # followed, never opened again.
        name = safe_files.corrupt_name(FILE_NAME, folder, self._clock())
        try:
            os.replace(FILE_NAME, name, src_dir_fd=folder, dst_dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"cannot set {self.path} aside: {e.strerror}") from None
        target = self.dir / name
        log.warning("checkpoint %s set aside as %s: %s; %s", self.path, target,
                    " ".join(reason.split()), self._rebuilt)
        return target

    def _payload(self, raw: bytes) -> dict[str, Any]:
        return read_envelope(raw, self.machine, self.boot_id)["payload"]

    def _open_temp(self, temp: str) -> tuple[int, int]:
        """The folder and a new temp file in it, mode 0600. The folder is made the first time
        (or again, if someone removed it) rather than checked before every write; a file of the
        same name, left by a killed writer, is removed, so that mode and owner are always this
        write's own. O_EXCL|O_NOFOLLOW: a symlink planted at the temp name is not followed."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        error: OSError | None = None
        for _ in range(3):
            folder = self._folder()
            try:
                return folder, os.open(temp, flags, 0o600, dir_fd=folder)
            except FileExistsError:
                safe_files.unlink_quietly(temp, folder)
            except OSError as e:  # the folder was removed after we opened it: made again
                error = e
            os.close(folder)
        why = error.strerror if error is not None else "a file keeps taking the temp file's name"
        raise CheckpointError(f"cannot write in {self.dir}: {why}")

    def _folder(self, create: bool = True) -> int:
        """The state folder's descriptor, the folder made if missing; CheckpointError when it
        is a symlink, not a folder, or cannot be made."""
        folder = self._existing_folder(create)
        if folder is None:  # only without create
            raise CheckpointError(f"state folder {self.dir} does not exist")
        return folder

    def _existing_folder(self, create: bool = False) -> int | None:
        try:
            return safe_files.open_folder(self.dir, create=create)
        except UnusableFile as e:
            raise CheckpointError(f"state folder {e}") from None

    def _fsync_dir(self, folder: int) -> None:
        # Without it the rename itself may not survive a power cut. The new file is already
        # in place, so a failure here is only a warning.
        try:
            os.fsync(folder)
        except OSError as e:
            log.warning("cannot sync folder %s after writing the checkpoint: %s", self.dir,
                        e.strerror)

    def _remove_stale_temps(self, folder: int) -> None:
        # Left by a kill between creating the temp file and the rename; never the live file.
        for name in os.listdir(folder):
            if name.startswith(_TEMP_PREFIX):
                safe_files.unlink_quietly(name, folder)


def _opens(folder: int) -> bool:
    """Whether the lock file in ``folder`` opens now (for reading: a lock needs no more)."""
    try:
        os.close(safe_files.open_file(LOCK_NAME, safe_files.READ, folder=folder))
    except (NotAFile, OSError):
        return False
    return True


def _held(info: os.stat_result) -> bool:
    """Whether some process holds a lock on the file ``info`` describes (/proc/locks: one line
    per lock, its file as ``MAJOR:MINOR:INODE``, the device numbers in hex)."""
    wanted = (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)
    try:
        with open("/proc/locks", "rb") as f:
            text = f.read(1 << 20)
    except OSError:
        return True  # cannot tell: never take a lock someone may hold
    for line in text.splitlines():
        for part in line.split():
            if part.count(b":") == 2:
                major, minor, inode = part.split(b":")
                try:
                    if (int(major, 16), int(minor, 16), int(inode)) == wanted:
                        return True
                except ValueError:
                    pass
                break
    return False


def current_boot_id() -> str | None:
    """The kernel's id of this boot; None where it cannot be read."""
    try:
        return Path(BOOT_ID).read_text().strip() or None
    except OSError:
        return None


class UntrustedCheckpoint(Exception):
    """A checkpoint file that must not be trusted (the plugin sets it aside); the message says
    why."""


def read_envelope(raw: bytes, machine: str | None = None,
                  boot_id: str | None = None) -> dict[str, Any]:
    """The envelope of a checkpoint file's bytes, its payload checked: format, version, checksum,
    this boot (when both boot ids are known) and, when ``machine`` is given, this machine.
    UntrustedCheckpoint otherwise. Changes nothing: ``nri-numa state`` reads through it too."""
    try:
        envelope = loads(raw)  # bounded: no RecursionError, no endless digits
    except JsonShapeError as e:
        raise UntrustedCheckpoint(str(e)) from None
    if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
        raise UntrustedCheckpoint(f"not an nri-numa checkpoint (format {FORMAT!r} missing)")
    if envelope.get("version") != CHECKPOINT_VERSION:
        raise UntrustedCheckpoint(f"checkpoint version {_short(envelope.get('version'))}; this "
                                  f"nri-numa reads version {CHECKPOINT_VERSION}")
    if machine is not None and envelope.get("machine") != machine:
        raise UntrustedCheckpoint("written on another machine (or before its CPUs changed)")
    if None not in (envelope.get("boot"), boot_id) and envelope["boot"] != boot_id:
        raise UntrustedCheckpoint("written before the machine last started: none of its "
                                  "containers still runs")
    payload = envelope.get("payload")
    if not isinstance(payload, dict):
        raise UntrustedCheckpoint("payload missing")
    if not _checksum_holds(raw, payload, envelope.get("sha256")):
        raise UntrustedCheckpoint("checksum mismatch")
    return envelope


def _checksum_holds(raw: bytes, payload: dict[str, Any], checksum: Any) -> bool:
    """Whether ``checksum`` is the sha256 of the payload's canonical JSON.

    ``save`` writes the payload last, as the very bytes it hashed. Bytes between the first
    ``,"payload":`` (a header's strings cannot hold its quotes) and the closing ``}`` that hash
    to ``checksum`` are, short of a forged sha256, those bytes: the payload's canonical JSON,
    which encoding the parsed payload again would only give back. A file laid out any other way
    (indented by hand, keys in another order) is judged on the payload encoded again."""
    start = raw.find(_PAYLOAD_KEY)
    if start >= 0 and raw.endswith(_END) \
            and sha256_hex(raw[start + len(_PAYLOAD_KEY):-len(_END)]) == checksum:
        return True
    return sha256_hex(canonical(payload)) == checksum


def _short(value: Any) -> str:
    """A value from a file, for a message: its repr, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 40 else text[:37] + "..."


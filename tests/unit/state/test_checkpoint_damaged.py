"""A checkpoint nri-numa cannot use never stops it: whatever lies at ``checkpoint.json`` (bytes
nested 100000 deep, a 5000-digit number, a directory, a FIFO, a socket, a symlink, a file past
the size limit) is renamed aside with one warning line naming where it went, and the next save
starts afresh. ``nri-numa state`` reports the same file in one line and leaves it where it is.
A lock file that is not a file or cannot be opened is set aside the same way, unless another
process holds it. Nothing is written through a symlink: not the checkpoint, its lock, or a
state folder that is itself a link."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from nri_numa.state import checkpoint as cp
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore, LockBusy
from nri_numa.views.state_view import StateViewError, read_checkpoint
from tests.damaged_state import DAMAGES, VICTIM_TEXT, damage, snapshot

MACHINE = "m" * 64
PAYLOAD = {"ledger": {"version": 1, "allocations": {"shared": "0-3"}}, "records": {"n": [1]}}


def _store(state_dir: Path) -> CheckpointStore:
    return CheckpointStore(state_dir, MACHINE, clock=lambda: 1_700_000_000.0)


def within(seconds: float, work):
    """``work()``'s result, failing the test when it has not returned after ``seconds`` (a FIFO
    read blocks for ever: the thread is left behind, a daemon)."""
    result: list = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as e:  # handed to the test's thread
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if failure:
        raise failure[0]
    return result[0]


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_set_aside_and_the_next_save_starts_afresh(state_dir, caplog,
                                                                           kind):
    store = _store(state_dir)
    victim = damage(store.path, kind)
    with caplog.at_level(logging.WARNING, logger=cp.__name__):
        assert within(10, store.load) is None
    aside = state_dir / f"{cp.FILE_NAME}.corrupt-20231114T221320Z"
    assert not store.path.exists() and not store.path.is_symlink()
    assert aside.exists() or aside.is_symlink()  # renamed as it was, a link as a link
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (f"checkpoint {store.path} set aside as {aside}: {DAMAGES[kind]}; the state "
                    "will be rebuilt from the runtime")
    if victim is not None:
        assert aside.is_symlink() and victim.read_text() == VICTIM_TEXT
    if kind == "directory":
        assert (aside / "inside").read_text() == "kept\n"
    store.save(PAYLOAD)
    assert store.load() == PAYLOAD


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_the_state_view_names_a_damaged_checkpoint_and_leaves_it(state_dir, kind):
    victim = damage(state_dir / cp.FILE_NAME, kind)
    before = snapshot(state_dir)
    with pytest.raises(StateViewError) as caught:
        within(10, lambda: read_checkpoint(state_dir))
    assert str(caught.value) == f"{state_dir / cp.FILE_NAME}: {DAMAGES[kind]}"
    assert snapshot(state_dir) == before
    if victim is not None:
        assert victim.read_text() == VICTIM_TEXT


def test_a_checkpoint_that_is_a_symlink_is_replaced_not_written_through(state_dir):
    store = _store(state_dir)
    victim = damage(store.path, "symlink")
    store.save(PAYLOAD)
    assert victim.read_text() == VICTIM_TEXT
    assert not store.path.is_symlink() and store.load() == PAYLOAD


LOCK_DAMAGES = ["symlink", "fifo", "directory", "socket"]
LOCK_ASIDE = f"{cp.LOCK_NAME}.corrupt-20231114T221320Z"


def assert_a_lock_again(store: CheckpointStore) -> None:
    """``store`` holds a regular lock file that excludes: another store cannot take it."""
    info = (store.dir / cp.LOCK_NAME).lstat()
    assert stat.S_ISREG(info.st_mode)
    with pytest.raises(LockBusy):
        _store(store.dir).lock()


@pytest.mark.parametrize("kind", LOCK_DAMAGES)
def test_a_lock_that_is_not_a_file_is_set_aside_and_a_new_one_taken(state_dir, caplog, kind):
    victim = damage(state_dir / cp.LOCK_NAME, kind)
    store = _store(state_dir)
    with caplog.at_level(logging.WARNING, logger=cp.__name__):
        within(10, store.lock)  # a FIFO is never opened, so never waited on
    try:
        assert_a_lock_again(store)
    finally:
        store.unlock()
    assert [r.getMessage() for r in caplog.records] == [
        f"lock {state_dir / cp.LOCK_NAME} set aside as {state_dir / LOCK_ASIDE}: "
        f"{DAMAGES[kind]}; a new lock is made"]
    aside = state_dir / LOCK_ASIDE
    if kind == "symlink":  # renamed as a link, never followed: its target untouched
        assert aside.is_symlink() and victim.read_text() == VICTIM_TEXT
    elif kind == "directory":
        assert (aside / "inside").read_text() == "kept\n"
    # And the store works as before: a save and a load.
    store.save(PAYLOAD)
    assert store.load() == PAYLOAD


def test_a_dangling_lock_symlink_makes_nothing_where_it_points(state_dir):
    state_dir.mkdir(parents=True)
    target = state_dir.parent / "made-through-the-lock"
    (state_dir / cp.LOCK_NAME).symlink_to(target)  # dangling: O_CREAT would make it
    store = _store(state_dir)
    store.lock()
    store.unlock()
    assert not target.exists() and not target.is_symlink()
    assert os.readlink(state_dir / LOCK_ASIDE) == str(target)


def refusing(monkeypatch, path: Path) -> None:
    """Opening the file now at ``path`` fails with EACCES, as a file not ours would for a
    user other than root; a new file made there later opens."""
    inode = path.lstat().st_ino
    real = os.open

    def fake_open(name, flags, *args, dir_fd=None, **kwargs):
        if name == cp.LOCK_NAME:
            try:
                here = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_ino
            except FileNotFoundError:
                here = None
            if here == inode:
                raise PermissionError(13, "Permission denied")
        return real(name, flags, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


def test_a_lock_that_cannot_be_opened_is_set_aside(state_dir, caplog, monkeypatch):
    state_dir.mkdir(parents=True)
    (state_dir / cp.LOCK_NAME).write_text("")
    refusing(monkeypatch, state_dir / cp.LOCK_NAME)
    store = _store(state_dir)
    with caplog.at_level(logging.WARNING, logger=cp.__name__):
        store.lock()
    try:
        assert_a_lock_again(store)
    finally:
        store.unlock()
    assert [r.getMessage() for r in caplog.records] == [
        f"lock {state_dir / cp.LOCK_NAME} set aside as {state_dir / LOCK_ASIDE}: it cannot be "
        "opened (Permission denied); a new lock is made"]


def test_a_lock_that_cannot_be_opened_but_is_held_is_left_to_its_holder(state_dir, monkeypatch):
    holder = _store(state_dir)
    holder.lock()  # another agent, which could open it
    try:
        refusing(monkeypatch, state_dir / cp.LOCK_NAME)
        before = snapshot(state_dir)
        with pytest.raises(LockBusy, match="which this process cannot open"):
            _store(state_dir).lock()
        assert snapshot(state_dir) == before
    finally:
        holder.unlock()


@pytest.mark.parametrize("round_", range(10))
def test_processes_finding_the_same_damaged_lock_end_with_one_lock(state_dir, round_):
    """Many stores (each its own open file, as separate processes) take the lock at once over a
    symlink: one set-aside, one lock file, never two holders at a time. (A race: renaming
    without the folder's flock failed one run in a few; hence ten rounds.)"""
    damage(state_dir / cp.LOCK_NAME, "symlink")
    holders, most, errors = [0], [0], []
    guard = threading.Lock()
    start = threading.Barrier(8)

    def take() -> None:
        store = _store(state_dir)
        start.wait()
        try:
            store.lock(timeout=20)
        except Exception as e:  # reported below
            errors.append(e)
            return
        with guard:
            holders[0] += 1
            most[0] = max(most[0], holders[0])
        time.sleep(0.01)
        with guard:
            holders[0] -= 1
        store.unlock()

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and most[0] == 1
    assert sorted(p.name for p in state_dir.iterdir() if p.name.startswith("lock")) == [
        cp.LOCK_NAME, LOCK_ASIDE]


def test_a_state_folder_that_is_a_symlink_is_never_written_through(state_dir):
    elsewhere = state_dir.parent / "elsewhere"
    elsewhere.mkdir(parents=True)
    state_dir.symlink_to(elsewhere)
    store = _store(state_dir)
    why = (f"state folder {state_dir}: it is a symlink: refusing to use it as a folder (give "
           "the folder it points to)")
    for step in (store.lock, lambda: store.save(PAYLOAD), store.load):
        with pytest.raises(CheckpointError) as caught:
            step()
        assert str(caught.value) == why
    assert list(elsewhere.iterdir()) == []

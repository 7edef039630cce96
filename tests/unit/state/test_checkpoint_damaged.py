"""A checkpoint nri-numa cannot use never stops it: whatever lies at ``checkpoint.json`` (bytes
nested 100000 deep, a 5000-digit number, a directory, a FIFO, a socket, a symlink, a file past
the size limit) is renamed aside with one warning line naming where it went, and the next save
starts afresh. ``nri-numa state`` reports the same file in one line and leaves it where it is.
Nothing is written through a symlink: not the checkpoint, its lock, or a state folder that is
itself a link."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from nri_numa.state import checkpoint as cp
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore
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


def test_a_lock_that_is_a_symlink_is_refused_and_nothing_is_made_where_it_points(state_dir):
    state_dir.mkdir(parents=True)
    target = state_dir.parent / "made-through-the-lock"
    (state_dir / cp.LOCK_NAME).symlink_to(target)  # dangling: O_CREAT would make it
    with pytest.raises(CheckpointError) as caught:
        _store(state_dir).lock()
    assert str(caught.value) == (f"cannot use {state_dir / cp.LOCK_NAME}: it is a symlink (not "
                                 "followed); remove it")
    assert not target.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_that_is_not_a_file_is_refused_at_once(state_dir, kind):
    damage(state_dir / cp.LOCK_NAME, kind)
    with pytest.raises(CheckpointError, match="it is a (FIFO|directory), not a regular file"):
        within(10, _store(state_dir).lock)


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

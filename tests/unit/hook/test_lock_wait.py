"""The state folder's lock as hook processes take it: waiting up to a timeout, then failing with
the holder named; a lock given up while waiting is taken at once."""

from __future__ import annotations

import threading
import time

import pytest

from nri_numa.state.checkpoint import CheckpointError, CheckpointStore


def test_a_held_lock_is_waited_for_then_refused(tmp_path):
    holder, waiter = CheckpointStore(tmp_path, "m"), CheckpointStore(tmp_path, "m")
    holder.lock()
    try:
        started = time.monotonic()
        with pytest.raises(CheckpointError, match=r"in use by another nri-numa \(waited 0.3 s\)"):
            waiter.lock(timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 2
    finally:
        holder.unlock()


def test_a_lock_released_while_waiting_is_taken(tmp_path):
    holder, waiter = CheckpointStore(tmp_path, "m"), CheckpointStore(tmp_path, "m")
    holder.lock()
    timer = threading.Timer(0.2, holder.unlock)
    timer.start()
    try:
        started = time.monotonic()
        waiter.lock(timeout=5)
        assert time.monotonic() - started < 2
    finally:
        timer.join()
        waiter.unlock()


def test_without_a_timeout_a_held_lock_fails_at_once(tmp_path):
    holder, other = CheckpointStore(tmp_path, "m"), CheckpointStore(tmp_path, "m")
    holder.lock()
    try:
        started = time.monotonic()
        with pytest.raises(CheckpointError, match="in use by another nri-numa;"):
            other.lock()
        assert time.monotonic() - started < 1  # no waiting (a loaded machine is slow)
    finally:
        holder.unlock()

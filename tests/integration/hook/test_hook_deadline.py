"""A hook running in process never outlasts its --timeout, counted from the start of its
process, and says so in one line, on stderr and in the hook log: while it waits for a turn to
load the engine, for the state lock, or has not even got that far."""

from __future__ import annotations

import fcntl
import os
import re
import time
from pathlib import Path

import pytest

from nri_numa.hook.deadline import BURST_HINT, COUNTED
from nri_numa.hook.entry import LOG_NAME
from nri_numa.hook.turns import TURN_PREFIX, turn_count
from nri_numa.state.checkpoint import CheckpointStore
from tests.integration.hook.fake_host import oci_state
from tests.integration.hook.test_hook_daemon import create
from tests.integration.hook.test_hook_processes import hook, setup  # noqa: F401 (fixture)



def timed_hook(args: list[str], stdin: bytes, timeout: float) -> tuple[int, str, float]:
    started = time.monotonic()
    done = hook("createRuntime", args, stdin, timeout=timeout)
    return done.returncode, done.stderr.decode(), time.monotonic() - started


def assert_one_line_given_up(err: str, state: Path, line: str) -> None:
    assert err.count("\n") == 1, err
    assert err.startswith(f"nri-numa hook createRuntime: gave up {line}"), err
    logged = (state / LOG_NAME).read_text()
    assert re.search(re.escape(err.strip().removeprefix("nri-numa hook ")) + r" \(\d+ ms\)$",
                     logged, re.M), logged


def test_every_turn_taken_gives_up_at_the_deadline_naming_it(setup):
    host, state, args = setup
    state.mkdir(parents=True)
    held = []
    for i in range(turn_count()):  # as many hooks in process as the CPUs allow, all busy
        fd = os.open(state / f"{TURN_PREFIX}{i}", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
    try:
        code, err, took = timed_hook(args, create(host, "c1", 5001, 2), 1.0)
    finally:
        for fd in held:
            os.close(fd)
    assert code == 1 and took < 3
    assert_one_line_given_up(err, state, f"after 1 s {COUNTED} while waiting for a turn to run "
                                         "in process")
    assert err.strip().endswith(BURST_HINT)


def test_a_held_state_lock_gives_up_at_the_deadline_naming_it(setup):
    host, state, args = setup
    holder = CheckpointStore(state, "m")
    holder.lock()
    try:
        code, err, took = timed_hook(args, create(host, "c1", 5001, 2), 1.5)
    finally:
        holder.unlock()
    assert code == 1 and took < 3.5
    # The lock is waited for until half a second before the deadline, left for the work.
    assert_one_line_given_up(err, state, f"waiting for the state lock ({state} is in use by "
                                         "another nri-numa")
    assert f"it holds {state / 'lock'}), to end within 1.5 s {COUNTED}: {BURST_HINT}" in err


@pytest.mark.parametrize("timeout", ["0.001", "0.05"])
def test_a_deadline_spent_before_the_hook_code_runs_still_ends_it_with_a_reason(setup, timeout):
    host, state, args = setup
    code, err, took = timed_hook(args, oci_state("c1", None, host.base), float(timeout))
    assert code == 1 and took < 3
    assert_one_line_given_up(err, state, f"after {timeout} s {COUNTED} while ")

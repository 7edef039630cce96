"""Waiting in tests for what another thread or process does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(condition: Callable[[], T], seconds: float = 15.0, poll_s: float = 0.02) -> T:
    """``condition()``'s first true value, asked every ``poll_s``; AssertionError when it gives
    none within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {seconds:g} s"
        time.sleep(poll_s)
    return found

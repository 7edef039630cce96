"""One line per slow step ("demo: starting containerd 2.1.9 ... 0.31 s"), written before the step
begins so that nobody is left staring at a silent terminal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from demo.cleanup import raise_if_interrupted


class Progress:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def say(self, text: str) -> None:
        self.out.write(f"demo: {text}\n")
        self.out.flush()

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        """Also the place where a Ctrl-C that gRPC swallowed is noticed, before and after."""
        raise_if_interrupted()
        self.out.write(f"demo: {text} ... ")
        self.out.flush()
        began = time.monotonic()
        try:
            yield
        except BaseException:
            self.out.write("stopped\n")
            self.out.flush()
            raise
        self.out.write(f"{time.monotonic() - began:.2f} s\n")
        self.out.flush()
        raise_if_interrupted()

"""How long each e2e step took, per containerd version; conftest prints the table at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StepTimes:
    """(containerd version, step, seconds) for every timed step of the session, in order."""

    rows: list[tuple[str, str, float]] = field(default_factory=list)

    @contextmanager
    def step(self, version: str, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.rows.append((version, name, time.monotonic() - began))

    def add(self, version: str, name: str, seconds: float) -> None:
        self.rows.append((version, name, seconds))

    def totals(self) -> dict[str, float]:
        sums: dict[str, float] = {}
        for version, _, seconds in self.rows:
            sums[version] = sums.get(version, 0.0) + seconds
        return sums

"""The pipe between ``nri-numa run`` and its export process: one JSON object per line.

Agent → export process (its standard input):
  ``{"kind": "nrt", "object": {...}}``       the NodeResourceTopology object the node has now
  ``{"kind": "refusal", ...}``               a container refused (nri_numa.cluster.refusals)
  ``{"kind": "degraded", ...}``              a container run without its exclusive CPUs (same)
Export process → agent (its standard output):
  ``{"kind": "status", "state": "synced" | "failing" | "starting", "message": "...",
     "writes": N, "errors": N, "last_success": UNIX_TIME | null}``
  ``{"kind": "log", "level": "info" | "warning" | "error", "message": "..."}``

A line longer than MAX_LINE or not a JSON object is dropped with one warning: neither side can
make the other fail by what it writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_LINE = 16 * 1024 * 1024  # bytes: the biggest object (node-state annotation included) fits


class BadLine(ValueError):
    """A line that is no message; the text says why, in one line."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE:
        raise BadLine(f"a message of {len(line)} bytes (at most {MAX_LINE})")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise BadLine(f"not JSON: {str(e)[:200]}") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise BadLine("not a JSON object with a \"kind\"")
    return message


@dataclass(frozen=True, slots=True)
class ExportStatus:
    """What the export process last said of itself."""

    state: str = "starting"  # starting, synced, failing, stopped
    message: str = ""
    writes: int = 0  # API calls that changed the object
    errors: int = 0  # API calls that failed
    last_success: float | None = None  # when the object last matched the node (UNIX time)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> ExportStatus:
        def number(key: str) -> int:
            value = message.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        last = message.get("last_success")
        return cls(state=str(message.get("state", "starting"))[:32],
                   message=str(message.get("message", ""))[:500],
                   writes=number("writes"), errors=number("errors"),
                   last_success=float(last) if isinstance(last, int | float) else None)

    def to_message(self) -> dict[str, Any]:
        return {"kind": "status", "state": self.state, "message": self.message,
                "writes": self.writes, "errors": self.errors, "last_success": self.last_success}

"""The checkpoint's payload in canonical JSON, encoded again only where it changed.

The plugin writes its whole state before it answers each event, and encoding all of it was
most of a decision's cost. Between two events one pod's allocation changes, one container
record comes or goes, and at most the shared containers move to a new pool. The values are
immutable, so each encoder keeps the bytes of what it encoded with the object they came from
(holding the object also keeps its identity from being reused) and encodes again only objects it
has not seen. The output is byte for byte ``canonical`` of the whole value, which is what the
checkpoint's checksum is computed over when it is read back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from nri_numa.engine.allocations import Allocations, PodAllocation
from nri_numa.state.ledger import Ledger
from nri_numa.topology.cpulist import format_list

if TYPE_CHECKING:
    from nri_numa.engine.request import ContainerRequest
    from nri_numa.state.checkpoint import ContainerRecord, PodRecord

# Every decision writes every record, and most records carry the same shared pool (one
# frozenset, whose hash Python keeps): formatting it once per pool, not once per record.
cpu_list = lru_cache(maxsize=256)(format_list)


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class Encoded(bytes):
    """A payload member already in canonical JSON: written as it is."""


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """``canonical(payload)``, taking ``Encoded`` members as they are."""
    members = [canonical(key) + b":" + (value if isinstance(value, Encoded) else canonical(value))
               for key, value in sorted(payload.items())]
    return b"{" + b",".join(members) + b"}"


def _with_member(fields: Mapping[str, Any], key: str, encoded: bytes) -> bytes:
    """The canonical JSON object of ``fields`` plus ``key`` with an already encoded value."""
    before = canonical({k: v for k, v in fields.items() if k < key})[1:-1]
    after = canonical({k: v for k, v in fields.items() if k > key})[1:-1]
    return b"{" + b",".join(p for p in (before, canonical(key) + b":" + encoded, after) if p) + b"}"


def _splice(value: Mapping[str, Any], path: tuple[str, ...], encoded: bytes) -> bytes:
    """The canonical JSON of ``value`` with the member at ``path`` given already encoded."""
    key, rest = path[0], path[1:]
    inner = _splice(value[key], rest, encoded) if rest else encoded
    return _with_member({k: v for k, v in value.items() if k != key}, key, inner)


class LedgerEncoder:
    """``Ledger.to_dict()`` in canonical JSON: each pod's allocation is kept encoded until the
    pod changes, and so is the frame around the pods (shared pool, memory, version) until one
    of the allocations' other fields is a new object."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[PodAllocation, bytes]] = {}
        self._frame: tuple[tuple[Any, ...], bytes, bytes] | None = None

    def encode(self, ledger: Ledger) -> Encoded:
        allocations = ledger.allocations
        pods: dict[str, tuple[PodAllocation, bytes]] = {}
        for uid in sorted(allocations.pods):
            pod = allocations.pods[uid]
            known = self._pods.get(uid)
            pods[uid] = known if known is not None and known[0] is pod else (pod, _pod(uid, pod))
        self._pods = pods
        prefix, suffix = self._frame_of(ledger)
        return Encoded(prefix + b",".join(member for _, member in pods.values()) + suffix)

    def _frame_of(self, ledger: Ledger) -> tuple[bytes, bytes]:
        """The ledger's JSON up to the inside of its ``pods`` object, and from its end on."""
        allocations = ledger.allocations
        others = tuple(getattr(allocations, f.name) for f in fields(allocations)
                       if f.name != "pods")
        frame = self._frame
        if frame is None or len(frame[0]) != len(others) or any(
                a is not b for a, b in zip(frame[0], others)):
            rest = Ledger(ledger.ctx, replace(allocations, pods={})).to_dict()
            # JSON text never holds a raw NUL byte (json escapes it): a safe place to cut.
            prefix, suffix = _splice(rest, ("allocations", "pods"), b"{\x00}").split(b"\x00")
            frame = self._frame = (others, prefix, suffix)
        return frame[1], frame[2]


def _pod(uid: str, pod: PodAllocation) -> bytes:
    """``"uid":{…}``, the pod's member of the ledger's ``pods`` object."""
    alone = Allocations(frozenset(), {uid: pod}).to_dict()["pods"][uid]
    return canonical(uid) + b":" + canonical(alone)


class RecordsEncoder:
    """``records_to_dict`` in canonical JSON. A container record is written as its cpus (the
    first key in canonical order) and a cached tail holding the rest, so that moving the shared
    containers to a new pool, which makes new records with the same requests, costs little."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[PodRecord | ContainerRecord, bytes]] = {}
        self._tails: dict[tuple[Any, ...], tuple[ContainerRequest, bytes]] = {}

    def encode(self, pods: Mapping[str, PodRecord],
               containers: Mapping[str, ContainerRecord]) -> Encoded:
        seen = {id(p): self._seen.get(id(p)) or (p, canonical(p.to_dict()))
                for p in pods.values()}
        tails: dict[tuple[Any, ...], tuple[ContainerRequest, bytes]] = {}
        for c in containers.values():
            key = (id(c.request), c.id, c.sandbox_id, c.pod_uid, c.exclusive, c.mems, c.in_ledger)
            tail = tails[key] = self._tails.get(key) or (c.request, _tail_json(c))
            seen[id(c)] = self._seen.get(id(c)) or (
                c, b'{"cpus":"' + cpu_list(c.cpus).encode() + b'",' + tail[1])
        self._seen, self._tails = seen, tails
        return Encoded(b'{"containers":[' + b",".join(seen[id(c)][1] for c in containers.values())
                       + b'],"pods":[' + b",".join(seen[id(p)][1] for p in pods.values()) + b"]}")


def _tail_json(record: ContainerRecord) -> bytes:
    """The canonical JSON of ``record`` after its leading ``{"cpus":"…",``."""
    fields = record.to_dict()
    del fields["cpus"]
    return canonical(fields)[1:]

"""The checkpoint's payload in canonical JSON, encoded again only where it changed.

The plugin writes its whole state before it answers each event, and encoding all of it was
most of a decision's cost. Between two events one pod's allocation changes, one container
record comes or goes, the memory of at most one pod changes, and the shared containers may move
to a new pool. The values are immutable, so the encoders keep the bytes of each member with the
object they came from (holding the object also keeps its identity from being reused) and encode
again only objects they have not seen under that key. The output is byte for byte ``canonical``
of the whole value, which is what the checkpoint's checksum is computed over when it is read
back; tests/unit/state/test_encoding.py and test_ledger_encoding.py hold the two to each
other. Between snapshots, an event's changes are written as a journal record's ops
(``journal_change``), each member's value as the snapshot would hold it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from nri_numa.engine.allocations import Allocations, PodAllocation
from nri_numa.state.ledger import LEDGER_VERSION, LedgerReader
from nri_numa.topology.cpulist import format_cached

if TYPE_CHECKING:
    from nri_numa.engine.memory import MemoryState
    from nri_numa.state.plugin_records import ContainerRecord, PodRecord, Records

# ``json.dumps`` with these options builds a new encoder at every call, which costs more than
# encoding a small value: one encoder, the same output.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def canonical(value: Any) -> bytes:
    return _CANONICAL.encode(value).encode()


class Encoded(bytes):
    """A payload member already in canonical JSON: written as it is."""


@lru_cache(maxsize=64)
def _key(key: str) -> bytes:
    """``"key":``; the payload's few keys are the same at every write."""
    return canonical(key) + b":"


def encode_payload(payload: Mapping[str, Any]) -> bytes:
    """``canonical(payload)``, taking ``Encoded`` members as they are."""
    parts = [b"{"]
    for key, value in sorted(payload.items()):
        parts += (_key(key), value if isinstance(value, Encoded) else canonical(value), b",")
    parts[-1] = b"}" if len(parts) > 1 else b"{}"
    return b"".join(parts)  # one copy of the members, which ``+`` would copy once more


class _Members:
    """The canonical JSON object of a mapping of immutable values by str keys: each member's
    text is kept with the value it was made from."""

    def __init__(self, encode_value: Callable[[str, Any], Any]) -> None:
        self._encode_value = encode_value  # (key, value) -> the value's JSON form, plain
        self._known: dict[str, tuple[Any, bytes]] = {}

    def encode(self, mapping: Mapping[str, Any]) -> bytes:
        known = self._known
        self._known = kept = {
            key: member if (member := known.get(key)) is not None and member[0] is value
            else self._member(key, value)
            for key, value in sorted(mapping.items())}
        return b"{" + b",".join([member for _, member in kept.values()]) + b"}"

    def _member(self, key: str, value: Any) -> tuple[Any, bytes]:
        return value, canonical(key) + b":" + canonical(self._encode_value(key, value))


class LedgerEncoder:
    """``Ledger.to_dict()`` in canonical JSON: each pod's allocation, each NUMA node's memory
    and each pod's memory blocks are kept encoded until they change; so is the whole memory
    state, which only a Guaranteed container's arrival or departure changes.

    The frame around them mirrors ``Ledger.to_dict``, ``Allocations.to_dict`` and
    ``MemoryState.to_dict``; the members come from those methods themselves."""

    def __init__(self) -> None:
        self._pods = _Members(pod_value)
        self._nodes = _Members(node_value)
        self._entries = _Members(blocks_value)
        self._reusable = _Members(reusable_value)
        self._memory: tuple[MemoryState | None, bytes] | None = None

    def encode(self, ledger: LedgerReader) -> Encoded:
        allocations = ledger.allocations
        return Encoded(b"".join((  # one copy of the parts, where ``+`` makes one per step
            b'{"allocations":{"memory":', self._memory_json(allocations.memory),
            b',"pods":', self._pods.encode(allocations.pods),
            b',"shared":"', format_cached(allocations.shared).encode(), b'"},"version":', _VERSION,
            b"}")))

    def _memory_json(self, memory: MemoryState | None) -> bytes:
        if self._memory is None or self._memory[0] is not memory:
            text = b"null" if memory is None else (
                b'{"entries":' + self._entries.encode(memory.blocks)
                + b',"machineState":' + self._nodes.encode(
                    {str(n): node for n, node in memory.nodes.items()})
                + b',"reusable":' + self._reusable.encode(memory.reusable) + b"}")
            self._memory = (memory, text)
        return self._memory[1]


_VERSION = canonical(LEDGER_VERSION)


# The ledger's members as ``Ledger.to_dict`` writes them, one at a time (the journal's records
# hold only the members an event changed).


def pod_value(uid: str, pod: PodAllocation) -> Any:
    """The pod's value in ``Allocations.to_dict()["pods"]``."""
    return Allocations(frozenset(), {uid: pod}).to_dict()["pods"][uid]


def node_value(n: str, node: Any) -> Any:
    """A NUMA node's value in the memory state's ``machineState``."""
    # The memory modules load here, with the first memory state to encode: a ledger kept
    # without the Static memory policy has none.
    from nri_numa.engine.memory import MemoryState

    return MemoryState({int(n): node}).to_dict()["machineState"][n]


def blocks_value(uid: str, blocks: Any) -> Any:
    """A pod's memory blocks in the memory state's ``entries``."""
    from nri_numa.engine.memory import MemoryState

    return MemoryState({}, {uid: blocks}).to_dict()["entries"][uid]


def reusable_value(uid: str, masks: Any) -> Any:
    """A pod's reusable memory in the memory state's ``reusable``."""
    from nri_numa.engine.memory import MemoryState

    return MemoryState({}, reusable={uid: masks}).to_dict()["reusable"][uid]


class RecordsEncoder:
    """``records_to_dict`` in canonical JSON, a shared container's CPUs written as the pool
    ``shared`` (its record does not follow the pool: nri_numa.state.plugin_records). Each record is
    kept encoded, by its key, with the object it came from, as its cpus (the first key in
    canonical order) and a tail holding the rest."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[PodRecord, bytes]] = {}
        self._containers: dict[str, tuple[ContainerRecord, bytes]] = {}

    def encode(self, pods: Mapping[str, PodRecord], containers: Mapping[str, ContainerRecord],
               shared: frozenset[int]) -> Encoded:
        known_pods, known = self._pods, self._containers
        self._pods = kept_pods = {
            key: pod if (pod := known_pods.get(key)) is not None and pod[0] is p
            else (p, canonical(p.to_dict()))
            for key, p in pods.items()}
        self._containers = kept = {
            key: container if (container := known.get(key)) is not None and container[0] is c
            else (c, _tail(c))
            for key, c in containers.items()}
        pool = b'{"cpus":"' + format_cached(shared).encode() + b'",'
        return Encoded(b"".join((
            b'{"containers":[', b",".join([
                (b'{"cpus":"' + format_cached(c.cpus).encode() + b'",' if c.exclusive else pool)
                + tail for c, tail in kept.values()]),
            b'],"pods":[', b",".join([p[1] for p in kept_pods.values()]), b"]}")))


def _tail(record: ContainerRecord) -> bytes:
    """The record's JSON after ``{"cpus":"…",``."""
    fields = record.to_dict()
    del fields["cpus"]
    return canonical(fields)[1:]


# --- an event's changes, as a journal record (nri_numa.state.plugin_checkpoint) -----------------

Ops = list[bytes]
PoolChange = tuple[frozenset[int], frozenset[int]]  # CPUs added to the pool, CPUs taken from it


def op(table: str, key: str, value: Any) -> bytes:
    """One change in a record's ``ops``: ``value`` a plain value, ``Encoded`` JSON, or None
    for a deletion."""
    if isinstance(value, Encoded):
        return b"[" + canonical(table) + b"," + canonical(key) + b"," + value + b"]"
    return canonical([table, key, value])


def journal_change(records: Records, before: Allocations) -> tuple[Ops, PoolChange | None] | None:
    """What changed since the records were last written with the ledger's allocations
    ``before`` (the same ledger), as a journal record's ops and the pool's change; None when
    only a snapshot can say it."""
    ledger = records.ledger
    now = ledger.allocations
    ops: Ops = []
    shared = None
    if now is not before:
        pods = now.pods
        for uid in ledger.touched:
            pod = pods.get(uid)
            if pod is not before.pods.get(uid):
                ops.append(op("pods", uid, None if pod is None else pod_value(uid, pod)))
        memory, memory_before = now.memory, before.memory
        if memory is not memory_before:
            if memory is None or memory_before is None:
                return None  # the Memory Manager turned on or off: a new configuration
            for n, node in memory.nodes.items():
                if memory_before.nodes.get(n) is not node:
                    ops.append(op("machineState", str(n), node_value(str(n), node)))
            for uid in ledger.touched:
                blocks = memory.blocks.get(uid)
                if blocks is not memory_before.blocks.get(uid):
                    ops.append(op("entries", uid,
                                  None if blocks is None else blocks_value(uid, blocks)))
                masks = memory.reusable.get(uid)
                if masks is not memory_before.reusable.get(uid):
                    ops.append(op("reusable", uid,
                                  None if masks is None else reusable_value(uid, masks)))
        if now.shared is not before.shared and now.shared != before.shared:
            shared = (now.shared - before.shared, before.shared - now.shared)
    for table, mapping in (("podRecords", records.pods), ("containers", records.containers)):
        for key, deleted in mapping.changed.items():
            value = mapping.get(key)
            if deleted and value is not None:
                ops.append(op(table, key, None))
            ops.append(op(table, key, None if value is None else value.to_dict()))
    return ops, shared

"""Every node's published state, and the pods the extender has sent there that the node's
publication does not show yet.

Fed by the watch (nri_numa.extender.watch) or directly by tests; no I/O here. A node's entry
keeps its decoded state, the engine context built from it (built once per topology and
configuration: the ledger changes far more often) and the *working* allocations: the published
ledger with the assumed pods admitted on top, in the order they were bound. A new publication
drops the assumed pods it shows (or that are older than the hold), and admits the rest again on
top of it, so that two pods bound in the same second cannot both take the last aligned node.

A publication that frees room on a node already known (a pod gone from its ledger, exclusive
CPUs given back, another machine or configuration) is told to ``on_room(node, generation)``,
outside the cache's lock, once per publication.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nri_numa.cluster.node_state import ANNOTATION, NodeState, NodeStateError, decode
from nri_numa.engine.admit import Admission, admit
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config import ConfigError
from nri_numa.engine.context import EngineContext
from nri_numa.engine.request import PodRequest

log = logging.getLogger(__name__)

DEFAULT_ASSUME_SECONDS = 30.0
MAX_SHARED_CONTEXTS = 16  # kinds of machine and configuration whose contexts are kept


@dataclass(frozen=True, slots=True)
class Assumed:
    pod: PodRequest
    since: float  # monotonic seconds


@dataclass(frozen=True, slots=True)
class NodeEntry:
    state: NodeState
    ctx: EngineContext
    working: Allocations  # published ledger + the assumed pods
    assumed: tuple[Assumed, ...] = ()


def frees_room(before: NodeState, after: NodeState) -> bool:
    """Whether the node's newer state may admit a pod the older one refused: a pod gone from
    the ledger (its CPUs, memory and devices), exclusive CPUs given back (a resize down), or
    another machine or configuration."""
    old, new = before.allocations, after.allocations
    return (not set(old.pods) <= set(new.pods)
            or not old.exclusive_cpus() <= new.exclusive_cpus()
            or before.config != after.config or before.topology != after.topology)


class NodeCache:
    def __init__(self, assume_seconds: float = DEFAULT_ASSUME_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 on_room: Callable[[str, int], None] | None = None) -> None:
        self.assume_seconds = assume_seconds
        self.clock = clock
        self.on_room = on_room
        self._lock = threading.Lock()
        self._entries: dict[str, NodeEntry] = {}
        self._problems: dict[str, str] = {}  # node → why its publication could not be read
        self._contexts: list[EngineContext] = []  # the latest built, newest first

    # --- fed by the watch ------------------------------------------------------------------

    def observe(self, node: str, nrt: Mapping[str, Any] | None) -> None:
        """The node's NRT object as it is now (None: deleted)."""
        text = None
        if nrt is not None:
            text = ((nrt.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
        if text is None:
            with self._lock:
                self._entries.pop(node, None)
                self._problems.pop(node, None)
            return
        try:
            state = decode(text)
            ctx = self._context(node, state)
        except (NodeStateError, ConfigError) as e:
            log.warning("node %s: its published state is unusable, the extender refuses pods "
                        "there until it is mended: %s", node, e)
            with self._lock:
                self._entries.pop(node, None)
                self._problems[node] = f"nri-numa: the node's published state is unusable: {e}"
            return
        with self._lock:
            self._problems.pop(node, None)
            before = self._entries.get(node)
            if before is not None and before.state.generation > state.generation:
                return  # an older object delivered late
            kept = before.assumed if before is not None else ()
            self._entries[node] = self._replay(state, ctx, kept)
        if (self.on_room is not None and before is not None
                and before.state.generation != state.generation
                and frees_room(before.state, state)):
            self.on_room(node, state.generation)

    def forget(self, node: str) -> None:
        self.observe(node, None)

    def _context(self, node: str, state: NodeState) -> EngineContext:
        """An engine context for the node's machine and configuration: the node's own while
        they stay the same, else one built for another node with the same (a fleet has few
        kinds of machine; building one costs far more than replaying a ledger)."""
        with self._lock:
            before = self._entries.get(node)
            known = ([before.ctx] if before is not None else []) + self._contexts
        for ctx in known:
            if ctx.config == state.config and ctx.topology == state.topology:
                return ctx
        ctx = EngineContext.build(state.topology, state.config)
        with self._lock:
            self._contexts = [ctx, *self._contexts[:MAX_SHARED_CONTEXTS - 1]]
        return ctx

    def _replay(self, state: NodeState, ctx: EngineContext,
                assumed: tuple[Assumed, ...]) -> NodeEntry:
        now = self.clock()
        working = state.allocations
        kept = []
        for a in assumed:
            if a.pod.uid in working.pods or now - a.since > self.assume_seconds:
                continue
            result = admit(ctx, working, a.pod)
            if result.decision.admitted:
                working = result.allocations
                kept.append(a)
        return NodeEntry(state, ctx, working, tuple(kept))

    # --- used by the verbs -------------------------------------------------------------------

    def entry(self, node: str) -> NodeEntry | None:
        with self._lock:
            entry = self._entries.get(node)
        if entry is not None and any(self.clock() - a.since > self.assume_seconds
                                     for a in entry.assumed):
            with self._lock:
                entry = self._entries[node] = self._replay(entry.state, entry.ctx, entry.assumed)
        return entry

    def problem(self, node: str) -> str | None:
        with self._lock:
            return self._problems.get(node)

    def assume(self, node: str, pod: PodRequest) -> Admission | None:
        """Admit ``pod`` on the node's working allocations and hold it there; None when the node
        has no published state. The admission is refused, and nothing held, when it no longer
        fits."""
        with self._lock:
            entry = self._entries.get(node)
            if entry is None:
                return None
            result = admit(entry.ctx, entry.working, pod)
            if result.decision.admitted:
                self._entries[node] = NodeEntry(
                    entry.state, entry.ctx, result.allocations,
                    (*entry.assumed, Assumed(pod, self.clock())))
            return result

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

"""The ledger: the current allocations, changed only by whole transactions.

Two faces, as the kubelet's ``state.Reader`` and ``state.State``: ``LedgerReader`` shows the
allocations and never changes them (what the metrics, the checkpoint's encoder and the NRI
plugin's ``ledger`` view take); ``Ledger`` is the writer that admissions commit through.
Every change goes through the engine, which returns a complete new ``Allocations`` value; the
ledger swaps it in only when the engine admits, so a refusal or an exception leaves it exactly
as it was. Snapshots serialise to JSON and are checked against the machine when restored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from nri_numa.engine.admit import Admission, admit, release
from nri_numa.engine.allocations import Allocations, AllocationsError
from nri_numa.engine.context import EngineContext
from nri_numa.engine.request import ContainerRequest, PodRequest

LEDGER_VERSION = 1


class LedgerError(ValueError):
    """A snapshot that cannot be restored; the message names the problem."""


class LedgerReader(Protocol):
    """The ledger as its readers see it; ``allocations`` is an immutable value, so one read
    of it is a consistent snapshot."""

    @property
    def ctx(self) -> EngineContext: ...

    @property
    def allocations(self) -> Allocations: ...

    def to_dict(self) -> dict[str, Any]: ...


class Ledger:
    """The writer: admissions, resizes and releases, each swapped in whole."""

    def __init__(self, ctx: EngineContext, allocations: Allocations | None = None) -> None:
        self.ctx = ctx
        self._allocations = ctx.empty_allocations() if allocations is None else allocations
        # The pods whose allocation may have changed since the journal last wrote this ledger
        # (nri_numa.nri.persistence): the engine changes only the pod it admits, resizes or
        # releases, so an event's record holds those and not the whole ledger.
        self.touched: set[str] = set()

    @property
    def allocations(self) -> Allocations:
        return self._allocations

    def admit(self, pod: PodRequest, containers: Iterable[str] | None = None) -> Admission:
        result = admit(self.ctx, self._allocations, pod, containers)
        if result.decision.admitted:
            self._allocations = result.allocations
            self.touched.add(pod.uid)
        return result

    def resize(self, pod: PodRequest, before: ContainerRequest,
               after: ContainerRequest) -> Admission:
        """An in-place resize (nri_numa.engine.resize, loaded on the first); swapped in only
        when admitted."""
        from nri_numa.engine.resize import resize

        result = resize(self.ctx, self._allocations, pod, before, after)
        if result.decision.admitted:
            self._allocations = result.allocations
            self.touched.add(pod.uid)
        return result

    def release(self, pod_id: str, container: str | None = None) -> Allocations:
        self._allocations = release(self.ctx, self._allocations, pod_id, container)
        self.touched.add(pod_id)
        return self._allocations

    def reset(self, allocations: Allocations, touched: set[str]) -> None:
        """Back to ``allocations`` (an event rolled back), with the pods touched then."""
        self._allocations, self.touched = allocations, touched

    def to_dict(self) -> dict[str, Any]:
        return {"version": LEDGER_VERSION, "allocations": self._allocations.to_dict()}

    @classmethod
    def restore(cls, ctx: EngineContext, data: Any) -> Ledger:
        """A ledger from ``to_dict``'s output; LedgerError unless it fits this machine."""
        if not isinstance(data, dict) or data.get("version") != LEDGER_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise LedgerError(f"ledger version is {version!r}; this nri-numa reads {LEDGER_VERSION}")
        try:
            allocations = Allocations.from_dict(data.get("allocations"))
            ctx.check(allocations)
        except (AllocationsError, ValueError) as e:
            raise LedgerError(f"ledger does not fit this machine: {e}") from None
        return cls(ctx, allocations)

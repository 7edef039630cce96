"""What the plugin knows between events: the ledger, and its records of the pods and the
containers it manages, which change together.

A record keeps what the engine's request for a container needs (the pod's identity and
annotations, the container's request) and its exclusive CPUs; a shared container runs on the
shared pool, which moves whenever an exclusive container comes or goes, and its record holds
no CPUs (``ON_THE_POOL``): ``Records.cpus_of`` gives the CPUs either kind runs on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import ContainerRequest
from nri_numa.nri import translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.record_tables import ContainerTable, TrackedDict, Undo
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_records import ContainerRecord, PodRecord


# The CPUs a shared container's record holds: none of its own, it runs on the pool. The pool
# is not copied into every shared record (each would then change whenever it moves); the
# checkpoint writes the pool for them (nri_numa.state.encoding.RecordsEncoder).
ON_THE_POOL: frozenset[int] = frozenset()


def on_the_pool(containers: Mapping[str, ContainerRecord]) -> dict[str, ContainerRecord]:
    """Records read from a checkpoint, the shared ones holding no CPUs (``ON_THE_POOL``)."""
    return {key: _with_cpus(c, ON_THE_POOL) if not c.exclusive and c.cpus else c
            for key, c in containers.items()}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The records as they were, to go back to when an event does not commit: the tables
    keep what the event changes (record_tables.Undo), so taking one costs nothing per
    container."""

    ledger: Ledger
    allocations: Allocations
    touched: frozenset[str]
    pods: Undo
    containers: Undo
    pool_sent: frozenset[int]


class Records:
    """The ledger and the records, changed in step: a record ``in_ledger`` has its allocation
    in the ledger; one that is not (adopted, it did not fit) may still hold there the devices it
    had (sync.adopt). Ledger entries no record explains are dropped when containers go.

    A shared container's record does not follow the pool: its CPUs are the pool, whatever
    ``cpus`` says (``cpus_of``). ``pool_sent`` is the pool the shared containers were last
    sent; when the pool moves, all of them are sent the new one (``shared_updates``)."""

    def __init__(self, ledger: Ledger, pods: Mapping[str, PodRecord] | None = None,
                 containers: Mapping[str, ContainerRecord] | None = None) -> None:
        self.ledger = ledger
        self.pods: TrackedDict = TrackedDict(pods)  # by sandbox id
        self.containers: ContainerTable = ContainerTable(containers)  # by id, creation order
        self.pool_sent = ledger.allocations.shared

    @property
    def shared(self) -> frozenset[int]:
        return self.ledger.allocations.shared

    def cpus_of(self, record: ContainerRecord) -> frozenset[int]:
        """The CPUs a managed container should run on now: its own, or the shared pool."""
        return record.cpus if record.exclusive else self.shared

    def snapshot(self) -> Snapshot:
        ledger = self.ledger
        return Snapshot(ledger, ledger.allocations, frozenset(ledger.touched), self.pods.begin(),
                        self.containers.begin(), self.pool_sent)

    def roll_back(self, snapshot: Snapshot) -> None:
        self.ledger = snapshot.ledger
        self.ledger.reset(snapshot.allocations, set(snapshot.touched))
        self.pods.roll_back(snapshot.pods)
        self.containers.roll_back(snapshot.containers)
        self.pool_sent = snapshot.pool_sent

    def saved(self) -> None:
        """The journal holds every change so far."""
        self.pods.changed.clear()
        self.containers.changed.clear()
        self.ledger.touched.clear()

    # --- what comes in ------------------------------------------------------------------------

    def pod(self, pod: PodRecord) -> PodRecord:
        """``pod`` recorded; the record already there when it is the same (its identity keeps
        its encoding in the checkpoint, state/encoding.py)."""
        known = self.pods.get(pod.sandbox_id)
        if known != pod:
            self.pods[pod.sandbox_id] = known = pod
        return known

    def known_requests(self, sandbox_id: str, but: str) -> list[ContainerRequest]:
        """The requests of the pod's containers but ``but``, in creation order."""
        return [c.request for c in self.containers.of_sandbox(sandbox_id) if c.name != but]

    def forget_stale(self, pod: PodRecord, name: str, container_id: str) -> None:
        # A pod runs one container per name: an older one of that name has exited (its stop
        # may have been missed while we were away), so what it held is free again.
        for stale in [c for c in self.containers.of_sandbox(pod.sandbox_id)
                      if c.name == name and c.id != container_id]:
            del self.containers[stale.id]
            self.ledger.release(stale.pod_uid, stale.name)  # a no-op where it holds nothing

    def remember(self, container_id: str, pod: PodRecord, request: ContainerRequest,
                 placement: Placement) -> None:
        self._replace(ContainerRecord(
            container_id, pod.sandbox_id, pod.uid, request,
            placement.cpus if placement.exclusive else ON_THE_POOL, placement.exclusive,
            placement.mems))

    def remember_unplaced(self, container_id: str, pod: PodRecord,
                          request: ContainerRequest) -> None:
        """A running container that did not fit: not placed, it follows the shared pool."""
        self._replace(ContainerRecord(
            container_id, pod.sandbox_id, pod.uid, request, ON_THE_POOL, exclusive=False,
            in_ledger=False))

    def _replace(self, record: ContainerRecord) -> None:
        """``record`` in; what an older record under its id (another pod's or name's, as only
        a confused runtime sends) held is released with it."""
        old = self.containers.get(record.id)
        self.containers[record.id] = record
        if old is not None and (old.pod_uid, old.name) != (record.pod_uid, record.name):
            self.drop_orphans((old.sandbox_id,), (old.pod_uid,))

    # --- what goes ----------------------------------------------------------------------------

    def in_sandbox(self, sandbox_id: str) -> list[str]:
        return list(self.containers.by_sandbox.get(sandbox_id, ()))

    def release(self, ids: Iterable[str]) -> list[ContainerRecord]:
        """The records of ``ids`` we had, gone with what they held, and their pods when empty."""
        released = [self.containers.pop(i) for i in ids if i in self.containers]
        for record in released:
            self.ledger.release(record.pod_uid, record.name)  # a no-op where it holds nothing
        if released:
            self.drop_orphans({r.sandbox_id for r in released}, {r.pod_uid for r in released})
        return released

    def drop_orphans(self, sandboxes: Iterable[str] | None = None,
                     uids: Iterable[str] | None = None) -> None:
        """Pods with no container left, and ledger entries no record explains; only among
        ``sandboxes`` and ``uids`` when given (those of the containers just released)."""
        index = self.containers
        for sandbox in list(self.pods) if sandboxes is None else sandboxes:
            if sandbox in self.pods and sandbox not in index.by_sandbox:
                del self.pods[sandbox]
        pods = self.ledger.allocations.pods
        for uid in list(pods) if uids is None else uids:
            held = pods.get(uid)
            if held is None:
                continue
            placed = {index[i].request.name for i in index.by_uid.get(uid, ())}
            for name in [n for n in held.containers if n not in placed]:
                self.ledger.release(uid, name)

    # --- cpusets ------------------------------------------------------------------------------

    def shared_updates(self, skip: str | None = None) -> list[api.ContainerUpdate]:
        """When the pool moved since the shared containers were last sent it: the new pool for
        every shared container we manage (but ``skip``, whose own answer carries it)."""
        wire = self.shared_updates_wire(1, skip)
        return list(api.UpdateContainersRequest.FromString(wire).update) if wire else []

    def shared_updates_wire(self, field: int, skip: str | None = None) -> bytes:
        """``shared_updates`` as the protobuf encoding of a repeated ``ContainerUpdate`` field
        number ``field``, for a reply to parse in one call: a thousand shared containers are a
        thousand updates, not to be built one message at a time."""
        shared, sent = self.shared, self.pool_sent
        # ``is`` first: two equal frozensets compare member by member.
        if shared is sent or shared == sent:
            return b""
        self.pool_sent = shared
        return translate.updates_wire(field, self.containers.shared_ids, shared, skip)

    def move(self, record: ContainerRecord, cpus: frozenset[int]) -> None:
        """An exclusive container's record, now on ``cpus``; a shared one follows the pool
        and keeps its record."""
        if record.exclusive and record.cpus != cpus:
            self.containers[record.id] = _with_cpus(record, cpus)


def _with_cpus(record: ContainerRecord, cpus: frozenset[int]) -> ContainerRecord:
    return ContainerRecord(record.id, record.sandbox_id, record.pod_uid, record.request, cpus,
                           record.exclusive, record.mems, record.in_ledger)

"""What the plugin knows between events: the ledger, and its records of the pods and the
containers it manages, which change together.

A record keeps what the engine's request for a container needs (the pod's identity and
annotations, the container's request) and the cpuset the container was last given: its
exclusive CPUs, or the shared pool, which moves whenever an exclusive container comes or goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import ContainerRequest
from nri_numa.nri import translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_records import ContainerRecord, PodRecord


@dataclass(frozen=True)
class Snapshot:
    """The records as they were, to go back to when an event does not commit."""

    allocations: Allocations
    pods: dict[str, PodRecord]
    containers: dict[str, ContainerRecord]


class Records:
    """The ledger and the records, changed in step: a record ``in_ledger`` has its allocation
    in the ledger; one that is not (adopted, it did not fit) may still hold there the devices it
    had (sync.adopt). Ledger entries no record explains are dropped when containers go."""

    def __init__(self, ledger: Ledger, pods: dict[str, PodRecord] | None = None,
                 containers: dict[str, ContainerRecord] | None = None) -> None:
        self.ledger = ledger
        self.pods: dict[str, PodRecord] = pods or {}  # by sandbox id
        self.containers: dict[str, ContainerRecord] = containers or {}  # by id, creation order

    @property
    def shared(self) -> frozenset[int]:
        return self.ledger.allocations.shared

    def cpus_of(self, record: ContainerRecord) -> frozenset[int]:
        """The CPUs a managed container should run on now: its own, or the shared pool."""
        return record.cpus if record.exclusive else self.shared

    def snapshot(self) -> Snapshot:
        return Snapshot(self.ledger.allocations, dict(self.pods), dict(self.containers))

    def roll_back(self, snapshot: Snapshot) -> None:
        self.ledger = Ledger(self.ledger.ctx, snapshot.allocations)
        self.pods, self.containers = snapshot.pods, snapshot.containers

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
        return [c.request for c in self.containers.values()
                if c.sandbox_id == sandbox_id and c.name != but]

    def forget_stale(self, pod: PodRecord, name: str, container_id: str) -> None:
        # A pod runs one container per name: an older one of that name has exited (its stop
        # may have been missed while we were away), so what it held is free again.
        for stale in [c for c in self.containers.values() if c.sandbox_id == pod.sandbox_id
                      and c.name == name and c.id != container_id]:
            del self.containers[stale.id]
            self.ledger.release(stale.pod_uid, stale.name)  # a no-op where it holds nothing

    def remember(self, container_id: str, pod: PodRecord, request: ContainerRequest,
                 placement: Placement) -> None:
        self.containers[container_id] = ContainerRecord(
            container_id, pod.sandbox_id, pod.uid, request, placement.cpus,
            placement.exclusive, placement.mems)

    def remember_unplaced(self, container_id: str, pod: PodRecord, request: ContainerRequest,
                          cpus: frozenset[int]) -> None:
        """A running container that did not fit: not placed, it follows the shared pool."""
        self.containers[container_id] = ContainerRecord(
            container_id, pod.sandbox_id, pod.uid, request, cpus, exclusive=False,
            in_ledger=False)

    # --- what goes ----------------------------------------------------------------------------

    def in_sandbox(self, sandbox_id: str) -> list[str]:
        return [c.id for c in self.containers.values() if c.sandbox_id == sandbox_id]

    def release(self, ids: Iterable[str]) -> list[ContainerRecord]:
        """The records of ``ids`` we had, gone with what they held, and their pods when empty."""
        released = [self.containers.pop(i) for i in ids if i in self.containers]
        for record in released:
            self.ledger.release(record.pod_uid, record.name)  # a no-op where it holds nothing
        if released:
            self.drop_orphans()
        return released

    def drop_orphans(self) -> None:
        """Pods with no container left, and ledger entries no record explains."""
        containers = self.containers.values()
        in_use = {c.sandbox_id for c in containers}
        if self.pods.keys() - in_use:
            self.pods = {k: p for k, p in self.pods.items() if k in in_use}
        placed = {(c.pod_uid, c.request.name) for c in containers}
        orphans = [(uid, name) for uid, pod in self.ledger.allocations.pods.items()
                   for name in pod.containers if (uid, name) not in placed]
        for uid, name in orphans:
            self.ledger.release(uid, name)

    # --- cpusets ------------------------------------------------------------------------------

    def shared_updates(self, skip: str | None = None) -> list[api.ContainerUpdate]:
        """Move every shared container we manage whose cpuset is not the shared pool now."""
        shared = self.shared
        # ``is`` first: two equal frozensets compare member by member, and most shared
        # records hold the pool's own object.
        moving = [r for r in self.containers.values() if not r.exclusive
                  and r.cpus is not shared and r.cpus != shared and r.id != skip]
        if not moving:
            return []
        # One message built, the others copied from it (in C) with their own container id.
        template = translate.cpuset_update(moving[0].id, shared)
        updates = []
        for record in moving:
            self.move(record, shared)
            update = api.ContainerUpdate()
            update.CopyFrom(template)
            update.container_id = record.id
            updates.append(update)
        return updates

    def move(self, record: ContainerRecord, cpus: frozenset[int]) -> None:
        """The container's record, now on ``cpus``."""
        self.containers[record.id] = _with_cpus(record, cpus)


def _with_cpus(record: ContainerRecord, cpus: frozenset[int]) -> ContainerRecord:
    return ContainerRecord(record.id, record.sandbox_id, record.pod_uid, record.request, cpus,
                           record.exclusive, record.mems, record.in_ledger)

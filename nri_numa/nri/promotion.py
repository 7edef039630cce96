"""Degraded containers, and their promotion once room appears.

A container is *degraded* when the plugin manages it without having admitted it (its record is
not ``in_ledger``: it was running when Synchronize adopted it, and did not fit, sync.adopt)
although the kubelet's managers would pin it: a Guaranteed container asking for whole CPUs
under the static CPU policy, or any container of a Guaranteed pod under the Static memory
policy. It runs in the shared pool. The kubelet never runs such a container without its
exclusive CPUs; nri-numa cannot refuse one that already runs, so it finishes the job when
room appears.

Which containers are degraded is derived from the records, never stored: a restart reads it
back from the checkpoint with them. ``promote`` admits each again, oldest first, and commits
those that fit; the plugin calls it whenever something may have freed room (a release, a
resize, Synchronize, the periodic drift check), never on CreateContainer. With nothing
degraded it costs one look at an empty index (``ContainerTable.unplaced_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import (ContainerRequest, PodRequest, QosClass, RequestError,
                                     guaranteed_cpus)
from nri_numa.nri import decision_log
from nri_numa.nri.decision_log import log
from nri_numa.runtime import qos_from_cgroup_parent
from nri_numa.state.plugin_records import ContainerRecord, PodRecord, Records


@dataclass(frozen=True, slots=True)
class Promotion:
    """A degraded container admitted: its new record, where it runs now, and the policy."""

    record: ContainerRecord
    placement: Placement
    policy: str


def pod_request(records: Records, pod: PodRecord, request: ContainerRequest) -> PodRequest:
    """The pod as far as the records know it, ``request`` last: what the engine admitted the
    container against when it was created (nri_numa.nri.translate.pod_as_known)."""
    known = records.known_requests(pod.sandbox_id, request.name)
    return PodRequest(uid=pod.uid, namespace=pod.namespace, name=pod.name,
                      app_containers=(*known, request), annotations=pod.annotations,
                      qos_override=qos_from_cgroup_parent(pod.cgroup_parent))


def wants_pinning(ctx: EngineContext, pod: PodRequest, request: ContainerRequest) -> bool:
    """Whether the kubelet's managers would pin the container: exclusive CPUs (static CPU
    policy, Guaranteed, whole CPUs) or memory nodes (Static memory policy, Guaranteed pod)."""
    if ctx.cpu_static and guaranteed_cpus(pod, request) > 0:
        return True
    return ctx.memory_static and pod.qos is QosClass.GUARANTEED


def degraded(records: Records) -> list[ContainerRecord]:
    """The degraded containers, in the order they were recorded (oldest first)."""
    table = records.containers
    if not table.unplaced_ids:
        return []
    ctx = records.ledger.ctx
    found = []
    for container_id in list(table.unplaced_ids):
        record = table[container_id]
        pod = records.pods.get(record.sandbox_id)
        if pod is None:
            continue
        try:
            if wants_pinning(ctx, pod_request(records, pod, record.request), record.request):
                found.append(record)
        except RequestError:  # a pod its records cannot describe: never admitted either
            continue
    return found


def promote(records: Records) -> list[Promotion]:
    """Admit the degraded containers again, oldest first; those that fit are committed to the
    ledger and recorded where the engine placed them, each with one decision line
    (``promoted``). One that does not fit stays as it is, silently (it was said when it was
    adopted). A placement that would give the running container devices it does not have is
    not taken: a running container's devices cannot change."""
    promoted = []
    for record in degraded(records):
        pod = records.pods[record.sandbox_id]
        ledger = records.ledger
        before, touched = ledger.allocations, set(ledger.touched)
        held = before.container(record.pod_uid, record.name)
        try:
            result = ledger.admit(pod_request(records, pod, record.request), [record.name])
        except (RequestError, ValueError) as e:
            log.debug("degraded %s not admitted: %s",
                      decision_log.describe(pod, record.name), e)
            continue
        if not result.decision.admitted:
            continue
        placement = result.decision.placements[0]
        if dict(placement.devices) != (dict(held.devices) if held is not None else {}):
            ledger.reset(before, touched)  # it would need devices it cannot be given now
            continue
        records.remember(record.id, pod, record.request, placement)
        decision_log.placed(pod, result.decision.policy, placement, record.id, "promoted")
        promoted.append(Promotion(records.containers[record.id], placement,
                                  result.decision.policy))
    return promoted

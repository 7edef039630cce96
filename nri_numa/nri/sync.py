"""Synchronize: the records made to match the containers the runtime has.

Containers gone while the plugin was away are released. Running containers the plugin does not
know are adopted: kept on their CPUs when those are exclusive-worthy and free, else placed, and
one that does not fit only follows the shared pool. Then every managed container is put back on
the cpuset the records expect, where the runtime says it runs elsewhere.
"""

from __future__ import annotations

from nri_numa.engine.admit import admit
from nri_numa.engine.allocations import AllocationsError, ContainerAllocation
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import ContainerRequest, PodRequest, RequestError, guaranteed_cpus
from nri_numa.nri import decision_log, translate
from nri_numa.nri.container_requests import RequestReader, pod_as_known
from nri_numa.nri.decision_log import log
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.records import Records
from nri_numa.runtime import RuntimeContainer
from nri_numa.state.ledger import Ledger
from nri_numa.topology.cpulist import format_list


def release_missing(records: Records, live_ids: set[str]) -> None:
    """Release the containers the runtime no longer has, and whatever no record explains."""
    released = records.release([cid for cid in records.containers if cid not in live_ids])
    for record in released:
        log.info("container %s (%s) is gone: released", record.name, record.id)
    if not released:  # release() has dropped them already
        records.drop_orphans()


def adopt(records: Records, reader: RequestReader, container: RuntimeContainer) -> None:
    """A running container we did not place: keep its CPUs when they are already
    exclusive and free, else place it; one that does not fit only follows the shared pool."""
    pod, request = reader.read(container, records)
    pod_req = pod_as_known(records, container, request)
    placement = _adopt_in_place(records, pod_req, request, container.cpuset_cpus)
    if placement is not None:
        log.info("adopted %s on its own CPUs %s", decision_log.describe(pod, request.name),
                 format_list(placement.cpus))
        records.remember(container.id, pod, request, placement)
        return
    try:
        result = records.ledger.admit(pod_req, [request.name])
        reason = result.decision.rejection and result.decision.rejection.message
    except (RequestError, ValueError) as e:
        reason = str(e)
    if reason:
        log.warning("running %s does not fit (%s); it stays in the shared pool",
                    decision_log.describe(pod, request.name), reason)
        records.remember_unplaced(container.id, pod, request, container.cpuset_cpus or frozenset())
        return
    placement = result.decision.placements[0]
    decision_log.placed(pod, result.decision.policy, placement, container.id, "adopted")
    records.remember(container.id, pod, request, placement)


def _adopt_in_place(records: Records, pod: PodRequest, request: ContainerRequest,
                    cpus: frozenset[int] | None) -> Placement | None:
    """Admit a Guaranteed container on the CPUs it runs on, when they are as many as it
    asks for, all free and none reserved; None when it cannot stay where it is."""
    ctx, allocs = records.ledger.ctx, records.ledger.allocations
    count = guaranteed_cpus(pod, request) if ctx.cpu_static else 0
    if (not count or not cpus or len(cpus) != count or not cpus < allocs.shared
            or cpus & ctx.reserved_cpus):
        return None
    # Seeded as already held, the engine checks the CPUs against the policy and places
    # memory and devices around them instead of picking new CPUs.
    held = allocs.pod(pod.uid).with_container(request.name, ContainerAllocation(cpus))
    seeded = allocs.with_pod(pod.uid, held).with_shared(allocs.shared - cpus)
    result = admit(ctx, seeded, pod, [request.name])
    if not result.decision.admitted:
        return None
    try:
        ctx.check(result.allocations)
    except AllocationsError:
        return None
    records.ledger = Ledger(ctx, result.allocations)
    return result.decision.placements[0]


def restore_cpusets(records: Records, live: dict[str, RuntimeContainer],
                    online: frozenset[int]) -> list[api.ContainerUpdate]:
    """Synchronize's updates: each container onto the cpuset we expect, from what the
    runtime says it has now; a differing exclusive container is logged as drift."""
    shared = records.shared
    updates = []
    for record in list(records.containers.values()):
        expected = record.cpus if record.exclusive else shared
        if record.id not in live:
            continue  # unreadable: nothing to compare with
        # No cpuset from the runtime: the container may use every CPU.
        actual = live[record.id].cpuset_cpus or online
        if actual == expected:
            continue
        if record.exclusive:
            log.warning("drift: container %s (%s) runs on CPUs %s, expected %s; restoring",
                        record.name, record.id, format_list(actual), format_list(expected))
        updates.append(translate.cpuset_update(record.id, expected, record.mems))
        records.move(record, expected)
    return updates

"""Synchronize: the records made to match the containers the runtime has.

Containers gone while the plugin was away are released. Running containers the plugin does not
know are adopted: kept on their CPUs when those are exclusive-worthy and free, else placed, and
one that does not fit only follows the shared pool (degraded, until room appears:
nri_numa.nri.promotion); the devices nri-numa gave them (asked for by annotation) stay theirs.
Then every managed container is put back on the cpuset the records expect, where the runtime
says it runs elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from nri_numa.engine.admit import admit
from nri_numa.engine.allocations import Allocations, AllocationsError, ContainerAllocation
from nri_numa.engine.annotations import AnnotationError, isolated_cpus_mode
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.devices import sorted_ids
from nri_numa.engine.devices.requested import with_annotated_devices
from nri_numa.engine.memory import Block, MemoryAllocationError
from nri_numa.engine.memory import adopt as adopt_memory
from nri_numa.engine.quantity import format_binary
from nri_numa.engine.request import (ContainerRequest, PodRequest, QosClass, RequestError,
                                     guaranteed_cpus)
from nri_numa.nri import decision_log, dra_cpu, translate
from nri_numa.nri.decision_log import log
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.translate import RequestReader, pod_as_known
from nri_numa.runtime import RuntimeContainer, requested_devices
from nri_numa.state.kubelet_checkpoints import MemoryBlock
from nri_numa.state.ledger import Ledger
from nri_numa.state.plugin_records import PodRecord, Records
from nri_numa.topology.cpulist import format_list


def release_missing(records: Records, live_ids: set[str]) -> None:
    """Release the containers the runtime no longer has, and whatever no record explains."""
    released = records.release([cid for cid in records.containers if cid not in live_ids])
    for record in released:
        log.info("container %s (%s) is gone: released", record.name, record.id)
    if not released:  # release() has dropped them already
        records.drop_orphans()


def to_adopt(records: Records, reader: RequestReader,
             live: list[RuntimeContainer]) -> list[RuntimeContainer]:
    """The live containers without a record, in the order to adopt them: those that show
    devices of the resources nri-numa hands out first, so that a container which shows none
    (created while the plugin was away) cannot be given one of theirs before they are seen;
    each group in the runtime's creation order."""
    # A container a DRA CPU driver gave its CPUs is that driver's (nri_numa.nri.dra_cpu).
    unknown = [c for c in live if c.id not in records.containers
               and not dra_cpu.cpu_claims(c.env)]
    resources = records.ledger.ctx.devices
    if not resources:
        return unknown
    return sorted(unknown, key=lambda c: not reader.held_devices(c, resources))


def adopt(records: Records, reader: RequestReader, container: RuntimeContainer,
          kubelet_cpus: frozenset[int] | None = None,
          kubelet_memory: tuple[MemoryBlock, ...] | None = None) -> None:
    """A running container we did not place: keep its CPUs when they are already
    exclusive and free, else place it; one that does not fit only follows the shared pool.
    Either way the devices it was given for its ``numa.nri.io/devices`` request stay its own
    (``held_devices``), so they are not handed to another container. ``kubelet_cpus``: the
    CPUs the kubelet's CPU Manager checkpoint gives it, kept instead of those it runs on when
    they pass the same checks (on this machine, free, not reserved, as many as it asks for).
    ``kubelet_memory``: the blocks the kubelet's Memory Manager checkpoint gives it, held as
    they are when nri-numa's static Memory Manager can take them; the CPUs then follow them."""
    pod, request = reader.read(container, records)
    request = _with_own_devices(records, container, request)
    pod_req = pod_as_known(records, container, request)
    held = _held_devices(records, reader, container, pod_req, request.name)
    allocs = _with_kubelet_memory(records, pod, pod_req, request, kubelet_memory)
    cpus = container.cpuset_cpus if kubelet_cpus is None else kubelet_cpus
    placement = _adopt_in_place(records, allocs, pod_req, request, cpus, held)
    if placement is None and kubelet_cpus is not None:
        log.warning("running %s: the kubelet's checkpoint gives it CPUs %s, which are not free "
                    "exclusive CPUs of this machine as many as it asks for; placed anew",
                    decision_log.describe(pod, request.name), format_list(kubelet_cpus))
    if placement is not None:
        log.info("adopted %s on %s CPUs %s", decision_log.describe(pod, request.name),
                 "its own" if kubelet_cpus is None else "the kubelet's",
                 format_list(placement.cpus))
        records.remember(container.id, pod, request, placement)
        return
    ctx = records.ledger.ctx
    seeded = _seeded(allocs, pod_req.uid, request.name, frozenset(), held)
    try:
        result = admit(ctx, seeded, pod_req, [request.name])
        reason = result.decision.rejection and result.decision.rejection.message
    except (RequestError, ValueError) as e:
        reason = str(e)
    if reason:
        log.warning("running %s does not fit (%s); it stays in the shared pool",
                    decision_log.describe(pod, request.name), reason)
        if held:  # its devices stay held even so
            records.ledger = Ledger(ctx, _seeded(records.ledger.allocations, pod_req.uid,
                                                 request.name, frozenset(), held))
        records.remember_unplaced(container.id, pod, request)
        return
    records.ledger = Ledger(ctx, result.allocations)
    placement = result.decision.placements[0]
    decision_log.placed(pod, result.decision.policy, placement, container.id, "adopted")
    records.remember(container.id, pod, request, placement)


def _with_own_devices(records: Records, container: RuntimeContainer,
                      request: ContainerRequest) -> ContainerRequest:
    """The request with the devices of the container's own annotation; a bad one, which the
    container was created with before nri-numa saw it, is logged and left out."""
    ctx = records.ledger.ctx
    try:
        devices = requested_devices(container, ctx.devices, ctx.device_classes)
    except AnnotationError as e:
        log.warning("running container %s (%s): %s; not used", container.name, container.id, e)
        return request
    return replace(request, devices=devices) if devices else request


def _held_devices(records: Records, reader: RequestReader, container: RuntimeContainer,
                  pod: PodRequest, name: str) -> dict[str, tuple[str, ...]]:
    """The devices the container has for the resources it asks nri-numa for, when it has
    exactly as many as it asks for and no other pod holds them; else the engine chooses."""
    ctx, allocs = records.ledger.ctx, records.ledger.allocations
    try:
        asked = with_annotated_devices(pod, ctx.devices, ctx.device_classes).container(
            name).devices
    except AnnotationError:
        return {}  # the engine refuses the request with the reason
    held = {}
    for resource, ids in sorted(reader.held_devices(container, ctx.devices).items()):
        count = asked.get(resource, 0)
        if not count:
            continue  # given by someone else (a device plugin): not ours to hold
        taken = ids & allocs.devices_in_use(resource, except_pod=pod.uid)
        if len(ids) != count or taken:
            log.warning("running container %s (%s) has %s %s and asks for %d%s: %s chosen anew",
                        container.name, container.id, resource, ", ".join(sorted_ids(ids)),
                        count, f"; {', '.join(sorted_ids(taken))} held by another pod"
                        if taken else "", resource)
            continue
        held[resource] = tuple(sorted_ids(ids))
    return held


def _seeded(allocs: Allocations, pod_uid: str, name: str, cpus: frozenset[int],
            devices: dict[str, tuple[str, ...]]) -> Allocations:
    """``allocs`` with the container already holding ``cpus`` and ``devices``: the engine then
    checks them against the policy and places the rest around them."""
    if not cpus and not devices:
        return allocs
    held = allocs.pod(pod_uid).with_container(name, ContainerAllocation(cpus, devices))
    return allocs.with_pod(pod_uid, held).with_shared(allocs.shared - cpus)


def _adoptable(ctx: EngineContext, allocs: Allocations, pod: PodRequest,
               request: ContainerRequest) -> frozenset[int]:
    """CPUs a running container may keep: free shared ones, and free isolated ones when it
    asks for isolated CPUs (the shared pool must keep a CPU, which admission checks)."""
    try:
        mode = isolated_cpus_mode(pod.annotations, request.name, request.isolated_cpus)
    except AnnotationError:
        mode = None
    if mode is None:
        return allocs.shared - ctx.isolated_cpus
    free = ctx.free_isolated_mask(allocs)
    free_isolated = frozenset(c for c in ctx.isolated_cpus if free >> c & 1)
    return (allocs.shared | free_isolated) if mode == "prefer" else free_isolated


def _with_kubelet_memory(records: Records, pod: PodRecord, pod_req: PodRequest,
                         request: ContainerRequest,
                         blocks: tuple[MemoryBlock, ...] | None) -> Allocations:
    """The ledger's allocations with the container holding the memory the kubelet's checkpoint
    gives it; unchanged (and a warning: the engine places the memory) when nri-numa's Memory
    Manager cannot take those blocks as they are."""
    allocs = records.ledger.allocations
    if blocks is None:
        return allocs
    given = ", ".join(f"{b.resource} {format_binary(b.size)} on NUMA nodes "
                      f"{format_list(b.numa_nodes)}" for b in blocks)
    who = decision_log.describe(pod, request.name)
    if allocs.memory is None or pod_req.qos is not QosClass.GUARANTEED:
        log.warning("running %s: the kubelet's checkpoint gives it %s, which nri-numa's Memory "
                    "Manager does not place (memoryManagerPolicy None, or not Guaranteed)",
                    who, given)
        return allocs
    engine_blocks = [Block(b.numa_nodes, b.resource, b.size) for b in blocks]
    try:
        memory = adopt_memory(allocs.memory, pod_req.uid, request.name, engine_blocks,
                              request.memory_requests())
    except MemoryAllocationError as e:
        log.warning("running %s: the kubelet's checkpoint gives it %s, not kept (%s); its "
                    "memory is placed anew", who, given, e)
        return allocs
    log.info("running %s keeps the kubelet's %s", who, given)
    return allocs.with_memory(memory)


def _adopt_in_place(records: Records, allocs: Allocations, pod: PodRequest,
                    request: ContainerRequest, cpus: frozenset[int] | None,
                    devices: dict[str, tuple[str, ...]]) -> Placement | None:
    """Admit a Guaranteed container on the CPUs it runs on, when they are as many as it
    asks for, all free and none reserved; None when it cannot stay where it is. ``allocs``:
    the ledger's, with the memory the container keeps."""
    ctx = records.ledger.ctx
    count = guaranteed_cpus(pod, request) if ctx.cpu_static else 0
    if (not count or not cpus or len(cpus) != count
            or not cpus <= _adoptable(ctx, allocs, pod, request) or cpus & ctx.reserved_cpus):
        return None
    result = admit(ctx, _seeded(allocs, pod.uid, request.name, cpus, devices), pod,
                   [request.name])
    if not result.decision.admitted:
        return None
    try:
        ctx.check(result.allocations)
    except AllocationsError:
        return None
    records.ledger = Ledger(ctx, result.allocations)
    return result.decision.placements[0]


def restore_cpusets(records: Records, live: dict[str, RuntimeContainer],
                    online: frozenset[int], placed_now: Iterable[str] = ()
                    ) -> list[api.ContainerUpdate]:
    """Synchronize's updates: each container onto the cpuset we expect, from what the
    runtime says it has now; a differing exclusive container is logged as drift, but for those
    of ``placed_now`` (promoted in this Synchronize: they are only now given their CPUs)."""
    placed_now = frozenset(placed_now)
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
        if record.exclusive and record.id not in placed_now:
            log.warning("drift: container %s (%s) runs on CPUs %s, expected %s; restoring",
                        record.name, record.id, format_list(actual), format_list(expected))
        updates.append(translate.cpuset_update(record.id, expected, record.mems))
        records.move(record, expected)
    records.pool_sent = shared  # every shared container is on it now, or is being sent it
    return updates

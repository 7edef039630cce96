"""The static CPU Manager as a provider (docs/kubelet-algorithms.md §4.2–4.5, 4.9).

Guaranteed containers asking for whole CPUs get exclusive CPUs taken from the shared pool
(minus reserved CPUs); everything else runs in the shared pool. With ``cpuManagerPolicy: none``
this provider has no preference and allocates nothing.

Isolated CPUs (isolcpus) are never in the shared pool unless sharedPoolIncludesIsolcpus says so,
and are given exclusively only to containers that ask by annotation (``numa.nri.io/isolated-cpus``):
``require`` takes only isolated CPUs, ``prefer`` takes isolated ones first, no annotation never
takes them. The kubelet's static policy makes no such difference (docs/engine.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.annotations import is_isolated_cpus_annotation, isolated_cpus_mode
from nri_numa.engine.context import EngineContext
from nri_numa.engine.cpu import (CPUAllocationError, checked_mask, cpu_hints_for_masks, set_of,
                                 take_cpu_mask)
from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import AllocationFailure, ProviderHints, ResourceDemand
from nri_numa.engine.request import (ContainerKind, ContainerRequest, PodRequest,
                                     guaranteed_cpus, pod_guaranteed_cpus)

CPU = "cpu"


class CpuProvider:
    name = CPU

    def container_hints(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                        container: ContainerRequest) -> ProviderHints:
        request = guaranteed_cpus(pod, container) if ctx.cpu_static else 0
        if request == 0:
            return None
        held = _held(allocs, pod.uid, container.name)
        if held:
            if len(held) != request:
                return {CPU: []}
            return {CPU: _hints(ctx, checked_mask(held, "held"), 0, request)}
        kinds = _kinds(ctx, pod, (container,))
        reusable = checked_mask(allocs.pod(pod.uid).reusable_cpus, "reusable") & kinds
        return {CPU: _hints(ctx, _available(ctx, allocs, kinds), reusable, request)}

    def pod_hints(self, ctx: EngineContext, allocs: Allocations,
                  pod: PodRequest) -> ProviderHints:
        request = pod_guaranteed_cpus(pod) if ctx.cpu_static else 0
        if request == 0:
            return None
        collected: frozenset[int] = frozenset()
        for c in pod.containers:
            held = _held(allocs, pod.uid, c.name)
            if held:
                if len(held) != guaranteed_cpus(pod, c):
                    return {CPU: []}
                collected |= held
        if len(collected) == request:
            return {CPU: _hints(ctx, checked_mask(collected, "held"), 0, request)}
        kinds = _kinds(ctx, pod, pod.containers)
        reusable = checked_mask(allocs.pod(pod.uid).reusable_cpus | collected, "reusable")
        return {CPU: _hints(ctx, _available(ctx, allocs, kinds), reusable & kinds, request)}

    def allocate(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                 container: ContainerRequest, hint: Hint) -> Allocations:
        count = guaranteed_cpus(pod, container) if ctx.cpu_static else 0
        if count == 0 or _held(allocs, pod.uid, container.name):
            return allocs
        mode = _mode(pod, container)
        if ctx.config.cpu_options.full_pcpus_only:
            _check_smt_alignment(ctx, allocs, count, mode)
        pod_alloc = allocs.pod(pod.uid)
        reusable = checked_mask(pod_alloc.reusable_cpus, "reusable")
        # In the order they are taken from: isolated CPUs first for prefer.
        pools = tuple((_available(ctx, allocs, kinds) | reusable) & kinds
                      for kinds in _pool_kinds(ctx, mode))
        if mode == "require" and sum(p.bit_count() for p in pools) < count:
            raise AllocationFailure(CPU, ISOLATED_REFUSAL, _isolated_shortfall(ctx, count, pools[0]))
        try:
            taken = _take_aligned(ctx, pools, count, hint)
        except (CPUAllocationError, ValueError) as e:
            raise AllocationFailure(CPU, "UnexpectedAdmissionError", str(e)) from None
        if not allocs.shared_mask & ~taken:
            # Burstable and BestEffort containers run on the shared pool: it must keep a CPU.
            raise AllocationFailure(CPU, "UnexpectedAdmissionError",
                                    f"not enough cpus available to satisfy request: taking {count} "
                                    f"exclusive CPUs would leave the shared pool empty")
        cpus = set_of(taken)
        reusable = pod_alloc.reusable_cpus
        if container.kind is ContainerKind.INIT:
            reusable |= cpus
        else:
            reusable -= cpus
        entry = pod_alloc.entry(container.name)
        pod_alloc = pod_alloc.with_container(
            container.name, entry.with_exclusive_cpus(cpus)).with_reusable_cpus(reusable)
        return allocs.with_pod(pod.uid, pod_alloc).with_shared(
            allocs.shared - cpus, allocs.shared_mask & ~taken)

    def release(self, ctx: EngineContext, allocs: Allocations, pod_id: str,
                container_name: str) -> Allocations:
        pod_alloc = allocs.pod(pod_id)
        entry = pod_alloc.containers.get(container_name)
        if entry is None or not entry.exclusive_cpus:
            return allocs
        freed = entry.exclusive_cpus - pod_alloc.cpus_in_use(except_container=container_name)
        pod_alloc = pod_alloc.with_container(
            container_name, entry.with_exclusive_cpus(frozenset())).with_reusable_cpus(
            pod_alloc.reusable_cpus - freed)
        freed -= ctx.withheld_cpus  # free isolated CPUs stay out of the shared pool
        return allocs.with_pod(pod_id, pod_alloc).with_shared(
            allocs.shared | freed, allocs.shared_mask | checked_mask(freed, "freed"))

    def demands(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest | None) -> list[ResourceDemand]:
        if not ctx.cpu_static:
            return []
        count = guaranteed_cpus(pod, container) if container else pod_guaranteed_cpus(pod)
        if count == 0:
            return []
        kinds = _kinds(ctx, pod, (container,) if container else pod.containers)
        available = (_available(ctx, allocs, kinds)
                     | checked_mask(allocs.pod(pod.uid).reusable_cpus, "reusable")) & kinds
        what = ("isolated CPUs" if kinds == ctx.isolated_mask and ctx.isolated_mask
                else "CPUs")
        return [ResourceDemand(CPU, f"{count} exclusive {what}", {
            n: f"{(available & ctx.cpus.numa_nodes_mask([n])).bit_count()} CPUs"
            for n in ctx.numa_ids})]


def isolated_shortfall(ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                       containers: Iterable[ContainerRequest]) -> tuple[str, str] | None:
    """(container, why) for the first of ``containers`` that requires more isolated CPUs than
    are free once the ones before it have theirs; checked before any merge, so that the reason
    is this and not a topology error."""
    if not ctx.cpu_static or not _asks_for_isolated(pod):
        return None
    free = None
    wanted = 0
    for c in containers:
        count = guaranteed_cpus(pod, c)
        if not count or _held(allocs, pod.uid, c.name) or _mode(pod, c) != "require":
            continue
        if free is None:
            reusable = checked_mask(allocs.pod(pod.uid).reusable_cpus, "reusable")
            free = (_available(ctx, allocs, ctx.isolated_mask) | reusable) & ctx.isolated_mask
        wanted += count
        if wanted > free.bit_count():
            return c.name, _isolated_shortfall(ctx, count, free)
    return None


def _asks_for_isolated(pod: PodRequest) -> bool:
    return (any(c.isolated_cpus is not None for c in pod.containers)
            or any(is_isolated_cpus_annotation(k) for k in pod.annotations))


def _held(allocs: Allocations, pod_id: str, name: str) -> frozenset[int]:
    entry = allocs.container(pod_id, name)
    return entry.exclusive_cpus if entry else frozenset()


# CPU sets below are bit masks (bit n = CPU n): the pool is one already (``shared_mask``), and
# the algorithms take and give masks.

ISOLATED_REFUSAL = "NotEnoughIsolatedCPUs"


def _mode(pod: PodRequest, container: ContainerRequest) -> str | None:
    """prefer, require or None; the admission checked the annotations before."""
    return isolated_cpus_mode(pod.annotations, container.name, container.isolated_cpus)


def _pool_kinds(ctx: EngineContext, mode: str | None) -> tuple[int, ...]:
    """Masks of the CPUs each pool may hold, in the order CPUs are taken from them."""
    isolated = ctx.isolated_mask
    everything = ctx.cpus.all_cpus
    if mode == "require":
        return (isolated,)
    if mode == "prefer" and isolated:
        return (isolated, everything & ~isolated)
    return (everything & ~isolated,)


def _kinds(ctx: EngineContext, pod: PodRequest, containers: Iterable[ContainerRequest]) -> int:
    """Every CPU some of ``containers`` may hold exclusively."""
    if not ctx.isolated_mask:
        return ctx.cpus.all_cpus  # the common machine: nothing to tell apart
    kinds = 0
    for c in containers:
        for k in _pool_kinds(ctx, _mode(pod, c)):
            kinds |= k
    return kinds


def _available(ctx: EngineContext, allocs: Allocations, kinds: int) -> int:
    """Free CPUs of ``kinds`` that may be given exclusively (reserved ones never)."""
    free = allocs.shared_mask & ~ctx.reserved_mask
    if kinds & ctx.isolated_mask:
        free |= ctx.free_isolated_mask(allocs)
    return free & kinds


def _isolated_shortfall(ctx: EngineContext, count: int, free: int) -> str:
    if not ctx.isolated_mask:
        return (f"annotation numa.nri.io/isolated-cpus is require but this node has no isolated "
                f"CPUs (isolcpus); {count} asked")
    per_node = ", ".join(f"node {n}: {(free & ctx.cpus.numa_nodes_mask([n])).bit_count()}"
                         for n in ctx.numa_ids)
    return (f"annotation numa.nri.io/isolated-cpus is require: {count} exclusive isolated CPUs "
            f"asked, {free.bit_count()} free ({per_node})")


def _hints(ctx: EngineContext, available: int, reusable: int, request: int) -> list[Hint]:
    return cpu_hints_for_masks(ctx.cpus, available, reusable, request,
                               align_by_socket=ctx.config.cpu_options.align_by_socket) or []


def _take(ctx: EngineContext, available: int, count: int) -> int:
    options = ctx.config.cpu_options
    return take_cpu_mask(ctx.cpus, available, count,
                         distribute_across_numa=options.distribute_cpus_across_numa,
                         cpu_group_size=ctx.cpus.cpus_per_core if options.full_pcpus_only else 1,
                         spread_across_cores=options.distribute_cpus_across_cores,
                         align_by_uncore_cache=options.prefer_align_cpus_by_uncorecache)


def _take_aligned(ctx: EngineContext, pools: tuple[int, ...], count: int, hint: Hint) -> int:
    """As many CPUs as fit on the hint's NUMA nodes (or their sockets), the rest anywhere;
    each time from the pools in order."""
    within = -1
    if hint.affinity is not None:
        if ctx.config.cpu_options.align_by_socket:
            within = ctx.cpus.sockets_mask(ctx.cpus.sockets_of_numa_nodes(hint.affinity))
        else:
            within = ctx.cpus.numa_nodes_mask(hint.affinity)
    allocatable = 0
    for pool in pools:
        allocatable |= pool
    if allocatable.bit_count() < count:
        return _take(ctx, allocatable, count)  # raises, with the kubelet's message
    result = 0
    for region in ((within, -1) if within != -1 else (-1,)):
        for pool in pools:
            wanted = count - result.bit_count()
            if not wanted:
                return result
            candidates = pool & region & ~result
            result |= _take(ctx, candidates, min(wanted, candidates.bit_count()))
    return result


def _check_smt_alignment(ctx: EngineContext, allocs: Allocations, count: int,
                         mode: str | None) -> None:
    per_core = ctx.cpus.cpus_per_core
    if count % per_core:
        raise AllocationFailure(CPU, "SMTAlignmentError",
                                f"SMT Alignment Error: requested {count} cpus not multiple cpus "
                                f"per core = {per_core}")
    reserved_physical = ctx.cpus.siblings(ctx.reserved_cpus)
    candidates = allocs.shared
    if mode is not None:  # a container that asked for isolated CPUs counts the free ones
        free_isolated = set_of(ctx.free_isolated_mask(allocs))
        candidates = free_isolated if mode == "require" else candidates | free_isolated
    available_physical = candidates - reserved_physical
    if count > len(available_physical):
        raise AllocationFailure(CPU, "SMTAlignmentError",
                                f"SMT Alignment Error: not enough free physical CPUs: available "
                                f"physical CPUs = {len(available_physical)}, requested CPUs = "
                                f"{count}, CPUs per core = {per_core}")


def take_more(ctx: EngineContext, allocs: Allocations, pod: PodRequest,
              container: ContainerRequest, held: frozenset[int], extra: int,
              strict: bool) -> frozenset[int]:
    """``extra`` more free CPUs for a container growing in place, from the pools its
    admission could use, on the NUMA nodes of the CPUs it holds first; ``strict`` (policies
    restricted and single-numa-node) takes them only there. AllocationFailure when they are
    not free; the shared pool must keep a CPU."""
    pools = tuple(_available(ctx, allocs, kinds) for kinds in _pool_kinds(ctx, _mode(pod, container)))
    nodes = ctx.nodes_of_cpus(held)
    if strict:
        within = ctx.cpus.numa_nodes_mask(nodes)
        pools = tuple(p & within for p in pools)
    free = 0
    for p in pools:
        free |= p
    if free.bit_count() < extra:
        where = f" on NUMA node(s) {', '.join(map(str, sorted(nodes)))}" if strict else ""
        raise AllocationFailure(CPU, "UnexpectedAdmissionError",
                                f"not enough cpus available to satisfy the resize: {extra} more "
                                f"asked, {free.bit_count()} free{where}")
    try:
        taken = _take_aligned(ctx, pools, extra, Hint(frozenset(nodes), True))
    except (CPUAllocationError, ValueError) as e:
        raise AllocationFailure(CPU, "UnexpectedAdmissionError", str(e)) from None
    if not allocs.shared_mask & ~taken:
        raise AllocationFailure(CPU, "UnexpectedAdmissionError",
                                f"not enough cpus available to satisfy the resize: taking {extra} "
                                f"more exclusive CPUs would leave the shared pool empty")
    return set_of(taken)

"""The static CPU Manager as a provider (docs/kubelet-algorithms.md §4.2–4.5, 4.9).

Guaranteed containers asking for whole CPUs get exclusive CPUs taken from the shared pool
(minus reserved CPUs); everything else runs in the shared pool. With ``cpuManagerPolicy: none``
this provider has no preference and allocates nothing.
"""

from __future__ import annotations

from nri_numa.engine.allocations import Allocations
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
        reusable = checked_mask(allocs.pod(pod.uid).reusable_cpus, "reusable")
        return {CPU: _hints(ctx, _available(ctx, allocs), reusable, request)}

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
        reusable = checked_mask(allocs.pod(pod.uid).reusable_cpus | collected, "reusable")
        return {CPU: _hints(ctx, _available(ctx, allocs), reusable, request)}

    def allocate(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                 container: ContainerRequest, hint: Hint) -> Allocations:
        count = guaranteed_cpus(pod, container) if ctx.cpu_static else 0
        if count == 0 or _held(allocs, pod.uid, container.name):
            return allocs
        options = ctx.config.cpu_options
        if options.full_pcpus_only:
            _check_smt_alignment(ctx, allocs, count)
        pod_alloc = allocs.pod(pod.uid)
        try:
            allocatable = _available(ctx, allocs) | checked_mask(pod_alloc.reusable_cpus,
                                                                 "reusable")
            taken = _take_aligned(ctx, allocatable, count, hint)
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
        return allocs.with_pod(pod_id, pod_alloc).with_shared(
            allocs.shared | freed, allocs.shared_mask | checked_mask(freed, "freed"))

    def demands(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest | None) -> list[ResourceDemand]:
        if not ctx.cpu_static:
            return []
        count = guaranteed_cpus(pod, container) if container else pod_guaranteed_cpus(pod)
        if count == 0:
            return []
        available = _available(ctx, allocs) | checked_mask(allocs.pod(pod.uid).reusable_cpus,
                                                           "reusable")
        return [ResourceDemand(CPU, f"{count} exclusive CPUs", {
            n: f"{(available & ctx.cpus.numa_nodes_mask([n])).bit_count()} CPUs"
            for n in ctx.numa_ids})]


def _held(allocs: Allocations, pod_id: str, name: str) -> frozenset[int]:
    entry = allocs.container(pod_id, name)
    return entry.exclusive_cpus if entry else frozenset()


# CPU sets below are bit masks (bit n = CPU n): the pool is one already (``shared_mask``), and
# the algorithms take and give masks.

def _available(ctx: EngineContext, allocs: Allocations) -> int:
    return allocs.shared_mask & ~ctx.reserved_mask


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


def _take_aligned(ctx: EngineContext, allocatable: int, count: int, hint: Hint) -> int:
    """As many CPUs as fit on the hint's NUMA nodes (or their sockets), the rest anywhere."""
    result = 0
    if hint.affinity is not None:
        if ctx.config.cpu_options.align_by_socket:
            sockets = ctx.cpus.sockets_of_numa_nodes(hint.affinity)
            aligned = allocatable & ctx.cpus.sockets_mask(sockets)
        else:
            aligned = allocatable & ctx.cpus.numa_nodes_mask(hint.affinity)
        result = _take(ctx, aligned, min(count, aligned.bit_count()))
    if result.bit_count() < count:
        result |= _take(ctx, allocatable & ~result, count - result.bit_count())
    return result


def _check_smt_alignment(ctx: EngineContext, allocs: Allocations, count: int) -> None:
    per_core = ctx.cpus.cpus_per_core
    if count % per_core:
        raise AllocationFailure(CPU, "SMTAlignmentError",
                                f"SMT Alignment Error: requested {count} cpus not multiple cpus "
                                f"per core = {per_core}")
    reserved_physical = ctx.cpus.siblings(ctx.reserved_cpus)
    available_physical = allocs.shared - reserved_physical
    if count > len(available_physical):
        raise AllocationFailure(CPU, "SMTAlignmentError",
                                f"SMT Alignment Error: not enough free physical CPUs: available "
                                f"physical CPUs = {len(available_physical)}, requested CPUs = "
                                f"{count}, CPUs per core = {per_core}")

"""Admission: a pod (or some of its containers) against a snapshot, as one transaction.

``admit`` returns the decision and the allocations to commit; when it refuses, the allocations
returned are the ones it was given, untouched. Nothing here does I/O or keeps state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.annotations import AnnotationError, isolated_cpus_mode, pod_topology
from nri_numa.engine.config import TopologyPolicy, TopologyScope
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import (Decision, Placement, PreferredNuma, Rejection,
                                      refusal_message)
from nri_numa.engine.devices.requested import with_annotated_devices
from nri_numa.engine.providers.cpu import CPU, ISOLATED_REFUSAL, CpuProvider, isolated_shortfall
from nri_numa.engine.providers.devices import DeviceProvider
from nri_numa.engine.providers.memory import MemoryProvider
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.engine.scope import MergeStep, Refused, ScopeRun
from nri_numa.engine.scope import container as container_scope
from nri_numa.topology.cpulist import format_list

PROVIDERS = (CpuProvider(), MemoryProvider(), DeviceProvider())


@dataclass(frozen=True, slots=True)
class Admission:
    decision: Decision
    allocations: Allocations  # to commit when admitted; the input when refused
    steps: tuple[MergeStep, ...] = ()  # every merge, for explain


def admit(ctx: EngineContext, allocs: Allocations, pod: PodRequest,
          containers: Iterable[str] | None = None) -> Admission:
    """Place ``containers`` of ``pod`` (all of them when None), in the pod's spec order.

    With ``pod.preferred_numa`` (the scheduler's choice), the merges first count only hints
    inside those NUMA nodes; when that admits, it is the answer. Otherwise the pod is decided
    anew, exactly as without a preference, and the decision says why the choice was stale.
    The preference only picks among the alignments the pod's resources and the policy allow:
    when the plain run's best hint lies inside the choice, both runs give the same answer.
    """
    try:
        chosen = (pod_topology(ctx.config, pod.annotations) if pod.annotations
                  else ctx.node_topology)
        pod = with_annotated_devices(pod, ctx.devices, ctx.device_classes)
        for c in pod.containers:
            isolated_cpus_mode(pod.annotations, c.name, c.isolated_cpus)
    except AnnotationError as e:
        rejection = Rejection(None, "InvalidAnnotation", str(e), str(ctx.config.topology_manager_policy))
        return Admission(Decision(pod.uid, str(ctx.config.topology_manager_policy),
                                  str(ctx.config.topology_manager_scope), rejection=rejection,
                                  shared_pool=allocs.shared), allocs)
    names = None if containers is None else set(containers)
    if names is not None and (unknown := names - {c.name for c in pod.containers}):
        raise ValueError(f"pod {pod.uid} has no container named {', '.join(sorted(unknown))}")
    wanted = [c for c in pod.containers if names is None or c.name in names]
    preferred = pod.preferred_numa
    if preferred is None or chosen.policy is TopologyPolicy.NONE:
        return _admit(ctx, allocs, pod, wanted, chosen.policy, chosen.scope, None)
    if not preferred <= ctx.machine_merge.default_affinity:
        stale = (f"NUMA node {format_list(preferred - ctx.machine_merge.default_affinity)} is "
                 "not on this machine")
    else:
        inside = _admit(ctx, allocs, pod, wanted, chosen.policy, chosen.scope, preferred)
        if inside.decision.admitted:
            return _noted(inside, PreferredNuma(preferred, True))
        stale = inside.decision.rejection.message
    anew = _admit(ctx, allocs, pod, wanted, chosen.policy, chosen.scope, None)
    return _noted(anew, PreferredNuma(preferred, False, stale))


def _noted(result: Admission, preferred: PreferredNuma) -> Admission:
    return replace(result, decision=replace(result.decision, preferred_numa=preferred))


def _admit(ctx: EngineContext, allocs: Allocations, pod: PodRequest,
           wanted: list[ContainerRequest], policy: TopologyPolicy, scope: TopologyScope,
           within: frozenset[int] | None) -> Admission:
    run = ScopeRun(ctx, PROVIDERS, str(policy), within=within)
    if scope is TopologyScope.POD:  # loaded on first use: most nodes run the container scope
        from nri_numa.engine.scope import pod as pod_scope

        admit_containers = pod_scope.admit_containers
    else:
        admit_containers = container_scope.admit_containers
    try:
        if short := isolated_shortfall(ctx, allocs, pod, wanted):
            raise Refused(short[0], ISOLATED_REFUSAL, short[1], CPU)
        after = admit_containers(run, allocs, pod, wanted)
    except Refused as e:
        container = next((c for c in wanted if c.name == e.container), None)
        demands = tuple(d for p in PROVIDERS for d in p.demands(ctx, allocs, pod, container)
                        if e.resource is None or d.resource == e.resource)
        message = refusal_message(e.reason, str(policy), demands,
                                  f"container {e.container}: {e.detail}" if e.container
                                  else f"pod: {e.detail}")
        rejection = Rejection(e.container, e.reason, message, str(policy), e.resource, demands)
        decision = Decision(pod.uid, str(policy), str(scope), rejection=rejection,
                            shared_pool=allocs.shared)
        return Admission(decision, allocs, tuple(run.steps))
    placements = tuple(placement(ctx, after, pod.uid, c.name) for c in wanted)
    decision = Decision(pod.uid, str(policy), str(scope), placements, shared_pool=after.shared)
    return Admission(decision, after, tuple(run.steps))


def placement(ctx: EngineContext, allocs: Allocations, pod_id: str, name: str) -> Placement:
    """Where an admitted container runs, as the allocations say now."""
    entry = allocs.container(pod_id, name)
    if entry is None:
        raise KeyError(f"pod {pod_id} has no admitted container {name}")
    exclusive = bool(entry.exclusive_cpus)
    blocks = allocs.memory.container_blocks(pod_id, name) if allocs.memory else None
    # Like the kubelet, memory nodes only where the static Memory Manager placed the memory:
    # the CPUs' node may not have the memory the container may use.
    mems = frozenset(n for b in blocks for n in b.numa_affinity) if blocks else None
    return Placement(name, entry.exclusive_cpus if exclusive else allocs.shared, exclusive, mems,
                     entry.devices, entry.hint)


def release(ctx: EngineContext, allocs: Allocations, pod_id: str,
            container: str | None = None) -> Allocations:
    """Give back one container's resources, or the whole pod's; unknown names are no-ops."""
    pod_alloc = allocs.pods.get(pod_id)
    if pod_alloc is None:
        return allocs
    names = list(pod_alloc.containers) if container is None else [container]
    for name in names:
        if name not in allocs.pod(pod_id).containers:
            continue
        for provider in PROVIDERS:
            allocs = provider.release(ctx, allocs, pod_id, name)
        pod_alloc = allocs.pod(pod_id)
        remaining = {k: v for k, v in pod_alloc.containers.items() if k != name}
        allocs = allocs.with_pod(pod_id, replace(pod_alloc, containers=remaining))
    if not allocs.pod(pod_id).containers:
        allocs = allocs.without_pod(pod_id)
    return allocs

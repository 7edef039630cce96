"""The Device Manager as a provider (docs/kubelet-algorithms.md §6), for the resources the context
knows (GPUs by UUID, plus any the caller registers), with NVIDIA-style GPU choice.

Two kinds of hint come from devices: for resources a container asks for (limits), the kubelet's
device hints; for devices a container already holds from another party (``device_numa_hints``),
one preferred hint on the NUMA nodes of those devices, so CPUs and memory follow the devices.
Resources the context does not know are left to whoever owns them: no preference, nothing
allocated. Past ``EXACT_NODE_LIMIT`` nodes, hints come from ``bounded_hints``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.engine.devices import Resource
from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import AllocationFailure, ProviderHints, ResourceDemand
from nri_numa.engine.request import (ContainerKind, ContainerRequest, PodRequest,
                                     pod_device_requests)

HELD_PREFIX = "held:"  # slot name for devices a container already holds

# The Device Manager's hints and allocation (nri_numa.engine.devices.hints, .allocate) and
# bounded_hints are imported by the methods that reach them: a container that asks for no
# device and holds none never loads them.


class DeviceProvider:
    name = "devices"

    def container_hints(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                        container: ContainerRequest) -> ProviderHints:
        if not container.devices and not container.device_numa_hints:
            return None
        from nri_numa.engine.bounded_hints import EXACT_NODE_LIMIT
        from nri_numa.engine.devices.hints import device_hints

        hints: dict[str, list[Hint] | None] = _held_hints(container)
        pod_alloc = allocs.pod(pod.uid)
        entry = pod_alloc.containers.get(container.name)
        for name, count in sorted(container.devices.items()):
            resource = ctx.devices.get(name)
            if resource is None or count == 0:
                continue
            here = entry.devices.get(name, ()) if entry else ()
            others = allocs.devices_in_use(name, except_pod=pod.uid) | _siblings_devices(
                pod_alloc.containers, container.name, name)
            reusable = pod_alloc.reusable_devices.get(name, frozenset())
            if len(ctx.numa_ids) > EXACT_NODE_LIMIT and not here:
                hints[name] = _bounded(ctx, resource, count, others, reusable)
            else:
                hints[name] = device_hints(resource, count, ctx.numa_ids, allocated_to_others=others,
                                           allocated_here=here, reusable=reusable)
        return hints or None

    def pod_hints(self, ctx: EngineContext, allocs: Allocations,
                  pod: PodRequest) -> ProviderHints:
        from nri_numa.engine.bounded_hints import EXACT_NODE_LIMIT
        from nri_numa.engine.devices.hints import pod_device_hints

        hints: dict[str, list[Hint] | None] = {}
        for c in pod.containers:
            hints.update(_held_hints(c))
        pod_alloc = allocs.pod(pod.uid)
        for name, count in sorted(pod_device_requests(pod).items()):
            resource = ctx.devices.get(name)
            if resource is None or count == 0:
                continue
            held = frozenset(d for c in pod_alloc.containers.values() for d in c.devices.get(name, ()))
            others = allocs.devices_in_use(name, except_pod=pod.uid)
            if len(ctx.numa_ids) > EXACT_NODE_LIMIT and not held:
                hints[name] = _bounded(ctx, resource, count, others, frozenset())
            else:
                hints[name] = pod_device_hints(resource, count, ctx.numa_ids,
                                               allocated_to_others=others, allocated_to_pod=held)
        return hints or None

    def allocate(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                 container: ContainerRequest, hint: Hint) -> Allocations:
        if not container.devices:
            return allocs
        from nri_numa.engine.devices.allocate import (DeviceAllocationError, DeviceRequest,
                                                      devices_to_allocate)

        pod_alloc = allocs.pod(pod.uid)
        entry = pod_alloc.entry(container.name)
        given = dict(entry.devices)
        reusable = dict(pod_alloc.reusable_devices)
        for name, count in sorted(container.devices.items(),
                                  key=lambda item: ctx.device_order(item[0])):
            resource = ctx.devices.get(name)
            if resource is None or count == 0 or name in given:
                continue
            others = allocs.devices_in_use(name, except_pod=pod.uid) | _siblings_devices(
                pod_alloc.containers, container.name, name)
            chooser = ctx.device_chooser(name, given)
            try:
                ids = devices_to_allocate(
                    DeviceRequest(pod.uid, container.name, name, count), resource,
                    hint=None if hint.affinity is None else frozenset(hint.affinity),
                    allocated_to_others=others, reusable=reusable.get(name, frozenset()),
                    **({"chooser": chooser} if chooser else {}))
            except DeviceAllocationError as e:
                raise AllocationFailure(name, "UnexpectedAdmissionError", str(e)) from None
            given[name] = ids
            if container.kind is ContainerKind.INIT:
                reusable[name] = reusable.get(name, frozenset()) | frozenset(ids)
            else:
                reusable[name] = reusable.get(name, frozenset()) - frozenset(ids)
        if given == dict(entry.devices):
            return allocs
        pod_alloc = replace(pod_alloc.with_container(container.name, replace(entry, devices=given)),
                            reusable_devices=reusable)
        return allocs.with_pod(pod.uid, pod_alloc)

    def release(self, ctx: EngineContext, allocs: Allocations, pod_id: str,
                container_name: str) -> Allocations:
        # The container's devices go back when its entry is dropped; they must not stay
        # reusable for the pod's later containers either, unless a sibling still holds them.
        pod_alloc = allocs.pod(pod_id)
        entry = pod_alloc.containers.get(container_name)
        if entry is None or not entry.devices:
            return allocs
        reusable = {name: ids - (frozenset(entry.devices.get(name, ())) - _siblings_devices(
            pod_alloc.containers, container_name, name))
            for name, ids in pod_alloc.reusable_devices.items()}
        return allocs.with_pod(pod_id, replace(pod_alloc, reusable_devices=reusable))

    def demands(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest | None) -> list[ResourceDemand]:
        wanted = container.devices if container else pod_device_requests(pod)
        out = []
        for name, count in sorted(wanted.items()):
            resource = ctx.devices.get(name)
            if resource is None or count == 0:
                continue
            free = resource.healthy_ids - allocs.devices_in_use(name, except_pod=pod.uid)
            per_node = Counter(n for d in free for n in resource.numa_nodes_of(d))
            out.append(ResourceDemand(name, f"{count} devices",
                                      {n: f"{per_node[n]} free" for n in ctx.numa_ids}))
        return out


def _held_hints(container: ContainerRequest) -> dict[str, list[Hint] | None]:
    return {HELD_PREFIX + name: [Hint(nodes, True)]
            for name, nodes in sorted(container.device_numa_hints.items()) if nodes}


def _siblings_devices(containers, name: str, resource: str) -> frozenset[str]:
    """Devices other containers of the same pod hold (init containers' count unless reused)."""
    return frozenset(d for n, c in containers.items() if n != name
                     for d in c.devices.get(resource, ()))


def _bounded(ctx: EngineContext, resource: Resource, count: int, others: frozenset[str],
             reusable: frozenset[str]) -> list[Hint] | None:
    if not resource.has_topology:
        return None
    from nri_numa.engine.bounded_hints import Demand, bounded_hints

    free_ids = (resource.healthy_ids - others) | reusable
    if len(free_ids) < count:
        return []
    capacity = Counter(n for d in resource.devices for n in resource.numa_nodes_of(d.id))
    free = Counter(n for d in free_ids for n in resource.numa_nodes_of(d))
    required = frozenset(n for d in reusable for n in resource.numa_nodes_of(d))
    return bounded_hints(ctx.numa_ids, [Demand(count, capacity, free)], ctx.distance_map,
                         required=required)

"""The static Memory Manager as a provider (docs/kubelet-algorithms.md §5).

Guaranteed pods get their memory and hugepages reserved on the chosen NUMA nodes. With
``memoryManagerPolicy: None`` this provider has no preference and reserves nothing. Past
``EXACT_NODE_LIMIT`` nodes the hints come from ``bounded_hints`` under the same group rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import AllocationFailure, ProviderHints, ResourceDemand
from nri_numa.engine.request import (ContainerKind, ContainerRequest, PodRequest, QosClass,
                                     pod_memory_requests)

if TYPE_CHECKING:
    from nri_numa.engine.memory import MemoryState

# The Memory Manager's modules (nri_numa.engine.memory, bounded_hints) are imported by the
# methods that reach them, past ``_state``: a container the Memory Manager ignores (every one
# without the Static memory policy) never loads them.


class MemoryProvider:
    name = "memory"

    def container_hints(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                        container: ContainerRequest) -> ProviderHints:
        state = _state(allocs, pod)
        request = container.memory_requests()
        if state is None or not request:
            return None
        if state.container_blocks(pod.uid, container.name) is not None:
            from nri_numa.engine import memory

            return memory.container_hints(state, pod.uid, container.name, request)
        return _hints(ctx, state, pod.uid, request)

    def pod_hints(self, ctx: EngineContext, allocs: Allocations,
                  pod: PodRequest) -> ProviderHints:
        state = _state(allocs, pod)
        request = pod_memory_requests(pod)
        if state is None or not request:
            return None
        names = [c.name for c in pod.containers]
        if any(state.container_blocks(pod.uid, n) is not None for n in names):
            from nri_numa.engine import memory

            return memory.pod_hints(state, pod.uid, names, request)
        return _hints(ctx, state, pod.uid, request)

    def allocate(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                 container: ContainerRequest, hint: Hint) -> Allocations:
        state = _state(allocs, pod)
        request = container.memory_requests()
        if state is None or not request:
            return allocs
        from nri_numa.engine import memory

        inits = [memory.InitContainer(c.name, c.kind is ContainerKind.SIDECAR)
                 for c in pod.init_containers]
        try:
            state = memory.allocate(state, pod.uid, container.name, request, hint,
                                    init_containers=inits,
                                    hints_for=lambda st, pod_id, req: _hints(ctx, st, pod_id, req))
        except (memory.MemoryAllocationError, memory.MemoryRequestError) as e:
            raise AllocationFailure("memory", "UnexpectedAdmissionError", str(e)) from None
        return allocs.with_memory(state)

    def release(self, ctx: EngineContext, allocs: Allocations, pod_id: str,
                container_name: str) -> Allocations:
        if allocs.memory is None or allocs.memory.container_blocks(pod_id, container_name) is None:
            return allocs
        from nri_numa.engine import memory

        state = memory.remove(allocs.memory, pod_id, container_name)
        if not state.blocks.get(pod_id) and pod_id in state.reusable:
            # The pod's last blocks are gone: what its init containers left for reuse goes too.
            state = state.derive(state.nodes, pod_id, {},
                                 {p: r for p, r in state.reusable.items() if p != pod_id})
        return allocs.with_memory(state)

    def demands(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest | None) -> list[ResourceDemand]:
        state = _state(allocs, pod)
        request = container.memory_requests() if container else pod_memory_requests(pod)
        if state is None:
            return []
        return [ResourceDemand(resource, _gib(amount), {
            n: _gib(node.tables[resource].free) if resource in node.tables else "none"
            for n, node in state.nodes.items()}) for resource, amount in sorted(request.items())]


def _state(allocs: Allocations, pod: PodRequest) -> MemoryState | None:
    """The state this pod is placed against, or None when the Memory Manager ignores it."""
    if allocs.memory is None or pod.qos is not QosClass.GUARANTEED:
        return None
    return allocs.memory


def _hints(ctx: EngineContext, state: MemoryState, pod_id: str,
           request: Mapping[str, int]) -> ProviderHints:
    from nri_numa.engine import memory
    from nri_numa.engine.bounded_hints import EXACT_NODE_LIMIT, Demand, bounded_hints

    if len(state.nodes) <= EXACT_NODE_LIMIT:
        return memory.memory_hints(state, pod_id, request)
    demands = [Demand(amount,
                      {n: node.tables[r].allocatable for n, node in state.nodes.items() if r in node.tables},
                      {n: node.tables[r].free for n, node in state.nodes.items() if r in node.tables})
               for r, amount in sorted(request.items())]
    groups = {tuple(node.cells) for node in state.nodes.values() if len(node.cells) > 1}
    hints = bounded_hints(list(state.nodes), demands, ctx.distance_map,
                          allow=lambda group: _respects_groups(state, group),
                          joinable=lambda n: not state.nodes[n].assignments, groups=groups)
    # Like the kubelet: no mask at all is "no preference", and allocation then reports it.
    return {r: hints for r in request} if hints else {}


def _respects_groups(state: MemoryState, group: tuple[int, ...]) -> bool:
    """A node used alone never joins a group; a grouped node is used with exactly its group."""
    for n in group:
        node = state.nodes[n]
        if len(group) == 1:
            if len(node.cells) > 1:
                return False
        elif node.assignments and tuple(node.cells) != group:
            return False
    return True


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"

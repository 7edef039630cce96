"""In-place resize of a running container (Kubernetes in-place pod resize), as one transaction.

The kubelet's semantics with KEP-5554 (InPlacePodVerticalScalingExclusiveCPUs):

* a container in the shared pool stays there: its quota changes, its cpuset does not;
* an exclusive container that grows keeps its CPUs and gets the new ones next to them, on its
  NUMA nodes first (only there under the restricted and single-numa-node policies);
* one that shrinks gives back CPUs it got by growing, never the CPUs it was admitted with;
* a resize that would move a container between the shared pool and exclusive CPUs (a request
  becoming or ceasing to be a whole number of CPUs), shrink it below its admitted CPUs, change
  memory the Memory Manager placed, or grow past the free CPUs is refused with a reason, and
  the allocations stay as they were.

Pure: ``resize`` returns the decision and the allocations to commit, the input when refused.
"""

from __future__ import annotations

from nri_numa.engine.admit import Admission, placement
from nri_numa.engine.allocations import Allocations
from nri_numa.engine.config import TopologyPolicy
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Decision, Rejection
from nri_numa.engine.providers import AllocationFailure
from nri_numa.engine.providers.cpu import CPU, take_more
from nri_numa.engine.request import ContainerRequest, PodRequest, guaranteed_cpus
from nri_numa.topology.cpulist import format_list as _fmt

INFEASIBLE = "InfeasibleResize"  # the reason of every refused resize but a lack of free CPUs
_STRICT = {TopologyPolicy.RESTRICTED, TopologyPolicy.SINGLE_NUMA_NODE}


def resize(ctx: EngineContext, allocs: Allocations, pod: PodRequest,
           before: ContainerRequest, after: ContainerRequest) -> Admission:
    """Resize container ``after.name`` of ``pod`` from ``before`` to ``after``; ``pod`` holds
    the container as ``after``."""
    policy = str(ctx.config.topology_manager_policy)
    scope = str(ctx.config.topology_manager_scope)

    def refused(reason: str, detail: str, resource: str | None = CPU) -> Admission:
        message = f"{reason}: container {after.name}: {detail}"
        rejection = Rejection(after.name, reason, message, policy, resource)
        return Admission(Decision(pod.uid, policy, scope, rejection=rejection,
                                  shared_pool=allocs.shared), allocs)

    entry = allocs.container(pod.uid, after.name)
    if entry is None:
        raise ValueError(f"pod {pod.uid} has no admitted container {after.name}")
    if allocs.memory is not None and allocs.memory.container_blocks(pod.uid, after.name) and (
            before.memory_request != after.memory_request
            or dict(before.hugepages_requests) != dict(after.hugepages_requests)):
        return refused(INFEASIBLE, "the Memory Manager placed its memory, which cannot be "
                       "resized in place (the kubelet's static Memory Manager refuses it too)",
                       "memory")
    wanted = guaranteed_cpus(pod, after) if ctx.cpu_static else 0
    held = entry.exclusive_cpus
    if not held:
        if wanted:
            return refused(INFEASIBLE, f"it runs in the shared pool and would need {wanted} "
                           "exclusive CPUs; a container cannot move to exclusive CPUs in place")
        return _admitted(ctx, allocs, pod, after.name, policy, scope)
    original = entry.original_cpus
    if not wanted:
        return refused(INFEASIBLE, f"it holds exclusive CPUs {_fmt(held)} and would run in the "
                       f"shared pool ({after.cpu_request}m asked); a container cannot leave its "
                       "exclusive CPUs in place")
    if wanted < len(original):
        return refused(INFEASIBLE, f"{wanted} CPUs asked, fewer than the {len(original)} it was "
                       f"admitted with ({_fmt(original)}), which it keeps")
    if wanted == len(held):
        return _admitted(ctx, allocs, pod, after.name, policy, scope)
    pod_alloc = allocs.pod(pod.uid)
    if wanted < len(held):
        # Give back the CPUs taken last by growing: highest ids of the added ones first.
        added = sorted(held - original, reverse=True)
        given_back = frozenset(added[:len(held) - wanted])
        freed = given_back - ctx.withheld_cpus  # free isolated CPUs stay out of the pool
        new_pod = pod_alloc.with_container(after.name, entry.resized(held - given_back))
        after_allocs = allocs.with_pod(pod.uid, new_pod).with_shared(allocs.shared | freed)
        return _admitted(ctx, after_allocs, pod, after.name, policy, scope)
    try:
        more = take_more(ctx, allocs, pod, after, held, wanted - len(held),
                         ctx.config.topology_manager_policy in _STRICT)
    except AllocationFailure as e:
        return refused(e.reason, str(e), e.resource)
    new_pod = pod_alloc.with_container(after.name, entry.resized(held | more))
    after_allocs = allocs.with_pod(pod.uid, new_pod).with_shared(allocs.shared - more)
    return _admitted(ctx, after_allocs, pod, after.name, policy, scope)


def _admitted(ctx: EngineContext, allocs: Allocations, pod: PodRequest, name: str,
              policy: str, scope: str) -> Admission:
    return Admission(Decision(pod.uid, policy, scope, (placement(ctx, allocs, pod.uid, name),),
                              shared_pool=allocs.shared), allocs)


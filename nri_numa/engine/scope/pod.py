"""Pod scope: one merge for the whole pod; every container is placed on that hint.

Containers may arrive one at a time (NRI creates them one by one): the first one merges the
pod's hints and the hint is kept with the pod, so later containers land on the same NUMA nodes.
A later container must fit there — each resource it asks for must have a hint inside the kept
nodes — or, under the policies that demand alignment (restricted, single-numa-node), it is
refused rather than spilled onto other nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.hints import Hint
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.engine.scope import Refused, ScopeRun

_ALIGNMENT_REQUIRED = frozenset({"restricted", "single-numa-node"})


def admit_containers(run: ScopeRun, allocs: Allocations, pod: PodRequest,
                     containers: Sequence[ContainerRequest]) -> Allocations:
    kept = allocs.pod(pod.uid).pod_hint
    if kept is None:
        hint = run.merge("pod", lambda p: p.pod_hints(run.ctx, allocs, pod))
        allocs = allocs.with_pod(pod.uid, replace(allocs.pod(pod.uid), pod_hint=hint))
    else:
        hint = kept
        if run.within is not None and _outside(run, kept):
            nodes = ",".join(map(str, sorted(kept.affinity)))
            raise Refused(containers[0].name if containers else None, "TopologyAffinityError",
                          f"the pod's NUMA nodes {{{nodes}}} were chosen at an earlier "
                          "container")
    for container in containers:
        if kept is not None and run.policy in _ALIGNMENT_REQUIRED:
            _check_fits(run, allocs, pod, container, kept)
        allocs = run.place(allocs, pod, container, hint)
    return allocs


def _outside(run: ScopeRun, kept: Hint) -> bool:
    """Whether the pod's kept hint lies outside ``run.within`` for a reason other than that
    nothing asked for alignment (which merges to every node, preferred)."""
    if kept.affinity is None or kept.affinity <= run.within:
        return False
    return not (kept.preferred and kept.affinity == run.ctx.machine_merge.default_affinity)


def _check_fits(run: ScopeRun, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest, kept: Hint) -> None:
    if kept.affinity is None:
        return
    for provider in run.providers:
        for resource, hints in (provider.container_hints(run.ctx, allocs, pod, container) or {}).items():
            if hints is not None and not any(h.affinity is None or h.affinity <= kept.affinity
                                             for h in hints):
                nodes = ",".join(map(str, sorted(kept.affinity)))
                raise Refused(container.name, "TopologyAffinityError",
                              f"{resource} no longer fits on the pod's NUMA nodes {{{nodes}}}",
                              resource)

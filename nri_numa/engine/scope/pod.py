"""Pod scope: one merge for the whole pod; every container is placed on that hint.

Containers may arrive one at a time (NRI creates them one by one): the first one merges the
pod's hints and the hint is kept with the pod, so later containers land on the same NUMA nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.engine.scope import ScopeRun


def admit_containers(run: ScopeRun, allocs: Allocations, pod: PodRequest,
                     containers: Sequence[ContainerRequest]) -> Allocations:
    hint = allocs.pod(pod.uid).pod_hint
    if hint is None:
        hint = run.merge("pod", lambda p: p.pod_hints(run.ctx, allocs, pod))
        allocs = allocs.with_pod(pod.uid, replace(allocs.pod(pod.uid), pod_hint=hint))
    for container in containers:
        allocs = run.place(allocs, pod, container, hint)
    return allocs

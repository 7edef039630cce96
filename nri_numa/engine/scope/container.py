"""Container scope: one merge per container, in spec order."""

from __future__ import annotations

from collections.abc import Sequence

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.engine.scope import ScopeRun


def admit_containers(run: ScopeRun, allocs: Allocations, pod: PodRequest,
                     containers: Sequence[ContainerRequest]) -> Allocations:
    for container in containers:
        hint = run.merge(container.name, lambda p, c=container: p.container_hints(
            run.ctx, allocs, pod, c))
        allocs = run.place(allocs, pod, container, hint)
    return allocs

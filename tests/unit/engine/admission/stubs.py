"""A provider that answers fixed hints: the kubelet's mockHintProvider, for the scope tests.

It implements the ``Provider`` protocol, records every call in order, and can be told to fail
its allocation, so that a test sees exactly what the scope asked and what reached the merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import AllocationFailure, ProviderHints, ResourceDemand
from nri_numa.engine.request import ContainerRequest, PodRequest


def hint(*nodes: int, preferred: bool = True) -> Hint:
    return Hint(frozenset(nodes), preferred)


@dataclass
class StubProvider:
    name: str = "stub"
    hints: ProviderHints = None
    failure: AllocationFailure | None = None
    demand: ResourceDemand | None = None
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def container_hints(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                        container: ContainerRequest) -> ProviderHints:
        self.calls.append(("container_hints", container.name))
        return self.hints

    def pod_hints(self, ctx: EngineContext, allocs: Allocations,
                  pod: PodRequest) -> ProviderHints:
        self.calls.append(("pod_hints", pod.uid))
        return self.hints

    def allocate(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                 container: ContainerRequest, hint: Hint) -> Allocations:
        self.calls.append(("allocate", container.name, hint))
        if self.failure is not None:
            raise self.failure
        return allocs

    def release(self, ctx: EngineContext, allocs: Allocations, pod_id: str,
                container_name: str) -> Allocations:
        self.calls.append(("release", container_name))
        return allocs

    def demands(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest | None) -> list[ResourceDemand]:
        return [] if self.demand is None else [self.demand]

"""Hint providers: each answers "where could this go?" and then places it (kubelet's HintProvider).

A provider is stateless; what it allocates lives in the ``Allocations`` value it is handed and
returns. ``container_hints``/``pod_hints`` return ``None`` for "no preference" or
``{resource: [Hint, ...] | None}``; ``allocate`` returns new allocations or raises
``AllocationFailure``; ``release`` gives a removed container's resources back; ``demands`` says,
for a refusal, what was asked and what each NUMA node had free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint
from nri_numa.engine.request import ContainerRequest, PodRequest

ProviderHints = Mapping[str, list[Hint] | None] | None


class AllocationFailure(Exception):
    """A provider could not place what the container asks for."""

    def __init__(self, resource: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.resource = resource
        self.reason = reason  # the kubelet's admission reason, e.g. SMTAlignmentError


@dataclass(frozen=True, slots=True)
class ResourceDemand:
    resource: str
    asked: str  # in people's units: "4 CPUs", "8.0 GiB"
    free_per_node: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "free_per_node", MappingProxyType(dict(self.free_per_node)))


class Provider(Protocol):
    name: str

    def container_hints(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                        container: ContainerRequest) -> ProviderHints: ...

    def pod_hints(self, ctx: EngineContext, allocs: Allocations,
                  pod: PodRequest) -> ProviderHints: ...

    def allocate(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                 container: ContainerRequest, hint: Hint) -> Allocations: ...

    def release(self, ctx: EngineContext, allocs: Allocations, pod_id: str,
                container_name: str) -> Allocations: ...

    def demands(self, ctx: EngineContext, allocs: Allocations, pod: PodRequest,
                container: ContainerRequest | None) -> list[ResourceDemand]: ...

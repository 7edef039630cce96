"""Scopes decide what is aligned together (the kubelet's topologymanager scopes).

``container``: every container gets its own merged hint, asked for in spec order (init
containers first). ``pod``: one merged hint for the pod's totals, shared by all its containers.
Both place a container the same way: record the hint, then let every provider allocate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import AllocationFailure, Provider, ProviderHints
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.topology.cpulist import format_list


@dataclass(frozen=True, slots=True)
class MergeStep:
    """One merge, kept for ``explain``: who hinted what, and what came out."""

    subject: str  # a container name, or "pod"
    hints: tuple[tuple[str, ProviderHints], ...]  # (provider, its hints)
    merged: Hint
    admitted: bool


class Refused(Exception):
    """The policy or a provider refused; the scope stops and nothing is committed."""

    def __init__(self, container: str | None, reason: str, detail: str,
                 resource: str | None = None) -> None:
        super().__init__(detail)
        self.container, self.reason, self.detail, self.resource = container, reason, detail, resource


@dataclass(frozen=True, slots=True)
class ScopeRun:
    ctx: EngineContext
    providers: Sequence[Provider]
    policy: str
    steps: list[MergeStep] = field(default_factory=list)
    within: frozenset[int] | None = None  # merge only inside these NUMA nodes (the scheduler's)

    def merge(self, subject: str, ask: Callable[[Provider], ProviderHints]) -> Hint:
        hints = tuple((p.name, ask(p)) for p in self.providers)
        merged, admitted = self.ctx.machine_merge.merge(self.policy, [h for _, h in hints],
                                                        self.within)
        self.steps.append(MergeStep(subject, hints, merged, admitted))
        if not admitted:
            raise Refused(None if subject == "pod" else subject, "TopologyAffinityError",
                          "Resources cannot be allocated with Topology locality" + (
                              "" if self.within is None
                              else f" inside NUMA nodes {format_list(self.within)}"))
        if (self.within is not None and not merged.preferred and merged.affinity is not None
                and not merged.affinity <= self.within):
            # Only "nothing merged inside" gives a non-preferred hint outside (a preferred one
            # outside means nothing asked for alignment): best-effort would admit it.
            raise Refused(None if subject == "pod" else subject, "TopologyAffinityError",
                          f"no merged hint inside NUMA nodes {format_list(self.within)}")
        return merged

    def place(self, allocs: Allocations, pod: PodRequest, container: ContainerRequest,
              hint: Hint) -> Allocations:
        pod_alloc = allocs.pod(pod.uid)
        entry = pod_alloc.entry(container.name)
        allocs = allocs.with_pod(pod.uid, pod_alloc.with_container(
            container.name, entry.with_hint(hint)))
        for provider in self.providers:
            try:
                allocs = provider.allocate(self.ctx, allocs, pod, container, hint)
            except AllocationFailure as e:
                raise Refused(container.name, e.reason, str(e), e.resource) from None
        return allocs

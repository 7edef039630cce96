"""What the engine answers: where each container goes, or why the pod cannot be placed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from nri_numa.engine.hints import Hint
from nri_numa.engine.providers import ResourceDemand
from nri_numa.topology.cpulist import format_list


@dataclass(frozen=True, slots=True)
class Placement:
    container: str
    cpus: frozenset[int]  # exclusive CPUs, or the shared pool as it is after this decision
    exclusive: bool
    mems: frozenset[int] | None  # NUMA nodes for cpuset.mems; None: leave the runtime's value
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    hint: Hint = Hint(None, False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", MappingProxyType(dict(self.devices)))

    def to_dict(self) -> dict[str, Any]:
        return {"container": self.container, "cpus": format_list(self.cpus),
                "exclusive": self.exclusive,
                "mems": None if self.mems is None else format_list(self.mems),
                "devices": {k: list(v) for k, v in self.devices.items()},
                "hint": {"affinity": None if self.hint.affinity is None
                         else sorted(self.hint.affinity), "preferred": self.hint.preferred}}


@dataclass(frozen=True, slots=True)
class Rejection:
    container: str | None  # None: the whole pod (pod scope)
    reason: str  # the kubelet's admission reason: TopologyAffinityError, SMTAlignmentError, ...
    message: str  # one line a person can act on
    policy: str
    resource: str | None = None
    demands: tuple[ResourceDemand, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"container": self.container, "reason": self.reason, "message": self.message,
                "policy": self.policy, "resource": self.resource,
                "demands": [{"resource": d.resource, "asked": d.asked,
                             "free_per_node": {str(k): v for k, v in d.free_per_node.items()}}
                            for d in self.demands]}


@dataclass(frozen=True, slots=True)
class PreferredNuma:
    """What became of the pod's preferred NUMA nodes (``PodRequest.preferred_numa``)."""

    nodes: frozenset[int]
    honoured: bool  # placed inside them; else decided anew
    stale_because: str = ""  # why not, one line, when not honoured

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": format_list(self.nodes), "honoured": self.honoured,
                "stale_because": self.stale_because or None}


@dataclass(frozen=True, slots=True)
class Decision:
    pod: str
    policy: str
    scope: str
    placements: tuple[Placement, ...] = ()
    rejection: Rejection | None = None
    shared_pool: frozenset[int] = frozenset()
    preferred_numa: PreferredNuma | None = None  # None: the pod had no preferred NUMA nodes

    @property
    def admitted(self) -> bool:
        return self.rejection is None

    def to_dict(self) -> dict[str, Any]:
        out = {"pod": self.pod, "admitted": self.admitted, "policy": self.policy,
               "scope": self.scope, "placements": [p.to_dict() for p in self.placements],
               "rejection": None if self.rejection is None else self.rejection.to_dict(),
               "shared_pool": format_list(self.shared_pool)}
        if self.preferred_numa is not None:
            out["preferred_numa"] = self.preferred_numa.to_dict()
        return out


def refusal_message(rejection_reason: str, policy: str, demands: tuple[ResourceDemand, ...],
                    detail: str) -> str:
    """One line: what was refused, by which policy, what was asked and what each node had."""
    parts = [f"{rejection_reason}: {detail} (topology policy {policy})"]
    for d in demands:
        free = ", ".join(f"node {n}: {v}" for n, v in sorted(d.free_per_node.items()))
        parts.append(f"{d.resource}: asked {d.asked}; free {free}")
    return "; ".join(parts)

"""What is allocated, as one immutable value: the engine reads a snapshot and returns a new one.

The shared pool (the kubelet's "default cpuset") holds every CPU no container owns exclusively,
reserved CPUs included unless strict reservation is on. Within one pod, a container may hold CPUs
or devices that a finished init container of the same pod also holds (reuse, as the kubelet
does); across pods nothing is held twice. Memory and hugepages live in the Memory Manager's own
state value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from nri_numa.engine.cpu.topology import checked_mask
from nri_numa.engine.hints import Hint
from nri_numa.topology.cpulist import MAX_ID, ListFormatError, format_list, parse_list

if TYPE_CHECKING:
    from nri_numa.engine.memory import MemoryState


class AllocationsError(ValueError):
    """A snapshot that breaks an invariant or cannot be read; the message names the problem."""


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


def _evolve(value: Any, **changes: Any) -> Any:
    """``replace(value, **changes)`` for changes already in the form ``__post_init__`` gives.

    Admission derives several new values per container; ``replace`` re-runs ``__init__`` and
    re-copies every mapping of the value, which was a measurable share of an admission. (The
    mappings are read-only views of dicts: ``view.copy()`` copies the dict in C, where
    ``dict(view)`` or ``{**view}`` go key by key.)"""
    evolved = object.__new__(type(value))
    evolved.__dict__.update(value.__dict__, **changes)
    return evolved


_NO_HINT = Hint(None, False)
_NO_CPUS: frozenset[int] = frozenset()


# Not slots: _evolve uses the instance's __dict__.
@dataclass(frozen=True)
class ContainerAllocation:
    exclusive_cpus: frozenset[int] = _NO_CPUS  # empty: the container runs in the shared pool
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # resource → ids
    hint: Hint = _NO_HINT  # the Topology Manager's choice for this container
    # After an in-place resize: the CPUs admitted at creation, which a shrink never gives back
    # (KEP-5554). Empty: never resized, the admitted CPUs are ``exclusive_cpus``.
    admitted_cpus: frozenset[int] = _NO_CPUS

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclusive_cpus", frozenset(self.exclusive_cpus))
        object.__setattr__(self, "admitted_cpus", frozenset(self.admitted_cpus))
        object.__setattr__(self, "devices", _frozen({k: tuple(v) for k, v in self.devices.items()}))

    def with_hint(self, hint: Hint) -> ContainerAllocation:
        return _evolve(self, hint=hint)

    def with_exclusive_cpus(self, cpus: frozenset[int]) -> ContainerAllocation:
        return _evolve(self, exclusive_cpus=frozenset(cpus))

    @property
    def original_cpus(self) -> frozenset[int]:
        """The exclusive CPUs the container was admitted with."""
        return self.admitted_cpus or self.exclusive_cpus

    def resized(self, cpus: frozenset[int]) -> ContainerAllocation:
        """Holding ``cpus`` now, keeping the record of the admitted ones."""
        original = self.original_cpus
        return _evolve(self, exclusive_cpus=frozenset(cpus),
                       admitted_cpus=frozenset() if original == cpus else original)


_NO_CONTAINER = ContainerAllocation()  # what ``PodAllocation.entry`` answers for a new container


# Not slots: _evolve uses the instance's __dict__.
@dataclass(frozen=True)
class PodAllocation:
    containers: Mapping[str, ContainerAllocation] = field(default_factory=dict)  # in admission order
    pod_hint: Hint | None = None  # pod scope: the one hint every container of the pod gets
    reusable_cpus: frozenset[int] = _NO_CPUS  # held by finished init containers
    reusable_devices: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "containers", _frozen(self.containers))
        object.__setattr__(self, "reusable_cpus", frozenset(self.reusable_cpus))
        object.__setattr__(self, "reusable_devices", _frozen(
            {k: frozenset(v) for k, v in self.reusable_devices.items() if v}))

    def entry(self, name: str) -> ContainerAllocation:
        """The container's allocation, or an empty one (shared, not copied) when it has none."""
        return self.containers.get(name) or _NO_CONTAINER

    def with_container(self, name: str, allocation: ContainerAllocation) -> PodAllocation:
        containers = self.containers.copy()
        containers[name] = allocation
        return _evolve(self, containers=MappingProxyType(containers))

    def with_reusable_cpus(self, cpus: frozenset[int]) -> PodAllocation:
        return _evolve(self, reusable_cpus=frozenset(cpus))

    def cpus_in_use(self, except_container: str | None = None) -> frozenset[int]:
        return frozenset().union(*(c.exclusive_cpus for n, c in self.containers.items()
                                   if n != except_container))


_NO_POD = PodAllocation()  # what ``Allocations.pod`` answers for a pod it does not hold


# Not slots: cached_property and _evolve use the instance's __dict__.
@dataclass(frozen=True)
class Allocations:
    shared: frozenset[int]
    pods: Mapping[str, PodAllocation] = field(default_factory=dict)
    memory: MemoryState | None = None  # None: the Memory Manager policy is None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shared", frozenset(self.shared))
        object.__setattr__(self, "pods", _frozen(self.pods))

    def pod(self, pod_id: str) -> PodAllocation:
        return self.pods.get(pod_id) or _NO_POD

    def container(self, pod_id: str, name: str) -> ContainerAllocation | None:
        return self.pod(pod_id).containers.get(name)

    def with_pod(self, pod_id: str, pod: PodAllocation) -> Allocations:
        pods = self.pods.copy()
        pods[pod_id] = pod
        return _evolve(self, pods=MappingProxyType(pods))

    def without_pod(self, pod_id: str) -> Allocations:
        pods = self.pods.copy()
        pods.pop(pod_id, None)
        return _evolve(self, pods=MappingProxyType(pods))

    @cached_property
    def shared_mask(self) -> int:
        """``shared`` as a bit mask (bit n = CPU n), the form the CPU algorithms take."""
        return checked_mask(self.shared, "the shared pool")

    def with_shared(self, cpus: frozenset[int], mask: int | None = None) -> Allocations:
        """``mask``: the same CPUs as a bit mask, when the caller has it; it is kept for
        ``shared_mask``, so a chain of admissions never converts the pool back to a mask."""
        evolved = _evolve(self, shared=frozenset(cpus))
        if mask is None:
            evolved.__dict__.pop("shared_mask", None)
        else:
            evolved.__dict__["shared_mask"] = mask
        return evolved

    def with_memory(self, memory: MemoryState | None) -> Allocations:
        return _evolve(self, memory=memory)

    def exclusive_cpus(self) -> frozenset[int]:
        return frozenset().union(*(p.cpus_in_use() for p in self.pods.values()))

    def devices_in_use(self, resource: str, except_pod: str | None = None) -> frozenset[str]:
        return frozenset(d for pod_id, p in self.pods.items() if pod_id != except_pod
                         for c in p.containers.values() for d in c.devices.get(resource, ()))

    # --- invariants ---------------------------------------------------------------------------

    def check(self, online: frozenset[int], reserved: frozenset[int], strict: bool,
              withheld: frozenset[int] = frozenset()) -> None:
        """Raise AllocationsError unless this snapshot could have come from the engine.
        ``withheld``: CPUs never in the shared pool (isolated ones), free when no container
        holds them."""
        owner: dict[int, str] = {}
        device_owner: dict[tuple[str, str], str] = {}
        for pod_id, pod in self.pods.items():
            for cpu in pod.cpus_in_use():
                if cpu in owner:
                    raise AllocationsError(f"CPU {cpu} is exclusive to both pod {owner[cpu]} "
                                           f"and pod {pod_id}")
                owner[cpu] = pod_id
            for name, c in pod.containers.items():
                for resource, ids in c.devices.items():
                    for d in ids:
                        if device_owner.setdefault((resource, d), pod_id) != pod_id:
                            raise AllocationsError(
                                f"{resource} device {d} is held by pods "
                                f"{device_owner[(resource, d)]} and {pod_id}")
        exclusive = frozenset(owner)
        if exclusive & self.shared:
            raise AllocationsError(f"CPUs {format_list(exclusive & self.shared)} are both "
                                   "exclusive and in the shared pool")
        if exclusive & reserved:
            raise AllocationsError(f"reserved CPUs {format_list(exclusive & reserved)} are "
                                   "allocated exclusively")
        if withheld & self.shared:
            raise AllocationsError(f"isolated CPUs {format_list(withheld & self.shared)} are in "
                                   "the shared pool")
        expected = (online - reserved if strict else online) - (withheld - exclusive)
        if exclusive | self.shared != expected:
            missing = expected - exclusive - self.shared
            extra = (exclusive | self.shared) - expected
            raise AllocationsError(
                "shared pool and exclusive CPUs do not cover the CPUs exactly"
                + (f"; missing {format_list(missing)}" if missing else "")
                + (f"; unexpected {format_list(extra)}" if extra else ""))
        if not self.shared and exclusive:
            raise AllocationsError("the shared pool is empty while CPUs are allocated")

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "shared": format_list(self.shared),
            "pods": {pod_id: _pod_to_dict(p) for pod_id, p in self.pods.items()},
            "memory": None if self.memory is None else self.memory.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Allocations:
        """``to_dict``'s output, read field by field: an error names the field."""
        d = _obj(data, "allocations")
        pods = {str(k): _pod_from_dict(v, f"pods.{k}")
                for k, v in _obj(d.get("pods", {}), "pods").items()}
        memory = None
        if d.get("memory") is not None:
            # Loaded here: without the Static memory policy there is no memory state to read.
            from nri_numa.engine.memory import MemoryState, MemoryStateError

            try:
                memory = MemoryState.from_dict(d["memory"])
            except MemoryStateError as e:
                raise AllocationsError(f"memory: {e}") from None
        return cls(shared=_cpus(d.get("shared"), "shared"), pods=pods, memory=memory)


def _pod_to_dict(p: PodAllocation) -> dict[str, Any]:
    return {
        "containers": {name: _container_to_dict(c) for name, c in p.containers.items()},
        "pod_hint": None if p.pod_hint is None else _hint_to_dict(p.pod_hint),
        "reusable_cpus": format_list(p.reusable_cpus),
        "reusable_devices": {k: sorted(v) for k, v in p.reusable_devices.items()},
    }


def _container_to_dict(c: ContainerAllocation) -> dict[str, Any]:
    d = {"exclusive_cpus": format_list(c.exclusive_cpus),
         "devices": {k: list(v) for k, v in c.devices.items()},
         "hint": _hint_to_dict(c.hint)}
    if c.admitted_cpus:  # only after a resize: older checkpoints stay byte for byte the same
        d["admitted_cpus"] = format_list(c.admitted_cpus)
    return d


def _pod_from_dict(raw: Any, where: str) -> PodAllocation:
    p = _obj(raw, where)
    containers = {}
    for name, c in _obj(p.get("containers", {}), f"{where}.containers").items():
        w = f"{where}.containers.{name}"
        c = _obj(c, w)
        containers[str(name)] = ContainerAllocation(
            exclusive_cpus=_cpus(c.get("exclusive_cpus", ""), f"{w}.exclusive_cpus"),
            devices={str(k): tuple(_strs(v, f"{w}.devices.{k}"))
                     for k, v in _obj(c.get("devices", {}), f"{w}.devices").items()},
            hint=_hint_from_dict(c.get("hint"), f"{w}.hint"),
            admitted_cpus=_cpus(c.get("admitted_cpus", ""), f"{w}.admitted_cpus"))
        if not containers[str(name)].admitted_cpus <= containers[str(name)].exclusive_cpus:
            raise AllocationsError(f"{w}.admitted_cpus must be among its exclusive_cpus")
    pod_hint = p.get("pod_hint")
    return PodAllocation(
        containers=containers,
        pod_hint=None if pod_hint is None else _hint_from_dict(pod_hint, f"{where}.pod_hint"),
        reusable_cpus=_cpus(p.get("reusable_cpus", ""), f"{where}.reusable_cpus"),
        reusable_devices={str(k): frozenset(_strs(v, f"{where}.reusable_devices.{k}"))
                          for k, v in _obj(p.get("reusable_devices", {}),
                                           f"{where}.reusable_devices").items()})


def _hint_to_dict(h: Hint) -> dict[str, Any]:
    return {"affinity": None if h.affinity is None else sorted(h.affinity),
            "preferred": h.preferred}


def _hint_from_dict(raw: Any, where: str) -> Hint:
    h = _obj(raw, where)
    affinity = h.get("affinity")
    # Bounded as CPU lists are: a mask of node 4000000000 would take 500 MB.
    if affinity is not None and not (isinstance(affinity, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_ID
            for i in affinity)):
        raise AllocationsError(f"{where}.affinity must be null or a list of NUMA node ids")
    if not isinstance(h.get("preferred"), bool):
        raise AllocationsError(f"{where}.preferred must be true or false")
    return Hint(affinity, h["preferred"])


def _obj(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise AllocationsError(f"{where} must be an object, not {type(v).__name__}")
    return v


def _strs(v: Any, where: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise AllocationsError(f"{where} must be a list of strings")
    return v


def _cpus(v: Any, where: str) -> frozenset[int]:
    if not isinstance(v, str):
        raise AllocationsError(f"{where} must be a CPU list such as \"0-3\", not {v!r}")
    try:
        return parse_list(v)
    except ListFormatError as e:
        raise AllocationsError(f"{where}: {e}") from None

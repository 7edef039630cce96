"""What a pod asks for: containers, their resources, the QoS class, and the pod-scope totals.

Units are the kubelet's integers: CPU in millicores, memory and hugepages in bytes, devices as
counts. Requests are stored *after* the API server's defaulting: a resource given only a limit
has request = limit (``container_from_resources`` in manifest.py applies that rule), so
``cpu: 2`` in limits alone makes a Guaranteed container, exactly as on a real cluster.

The pod totals follow the kubelet's init/sidecar rule (docs/kubelet-algorithms.md §7, used by
§4.2, §5.1, §6): init containers run one at a time, each alongside the sidecars (restartable init
containers) started before it; app containers run together with every sidecar. The pod needs
``max(Σ app + Σ sidecars, max over regular init containers of (sidecars so far + its own))``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType
from typing import Any

from nri_numa.safeio.bounds import quote
from nri_numa.topology.cpulist import MAX_ID

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
HUGEPAGES_PREFIX = "hugepages-"


class RequestError(ValueError):
    """A pod or container that cannot be a request; the message names the field."""


class ContainerKind(StrEnum):
    INIT = "init"
    SIDECAR = "sidecar"  # an init container with restartPolicy: Always
    APP = "app"


class QosClass(StrEnum):
    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BEST_EFFORT = "BestEffort"


def hugepage_resource_name(page_size_kib: int) -> str:
    """2048 → "hugepages-2Mi", 1048576 → "hugepages-1Gi": the kubelet's resource names."""
    # Quantities are imported by the two functions that read or write them: a container
    # placed without hugepages or a Memory Manager needs neither.
    from nri_numa.engine.quantity import format_binary

    return HUGEPAGES_PREFIX + format_binary(page_size_kib * 1024)


def hugepage_size_kib(resource: str) -> int:
    """"hugepages-2Mi" → 2048; the size part is a quantity, so "hugepages-2048Ki" is the same."""
    from nri_numa.engine.quantity import QuantityError, bytes_value

    size_text = resource.removeprefix(HUGEPAGES_PREFIX)
    try:
        size = bytes_value(size_text)
    except QuantityError as e:
        raise RequestError(f"bad hugepages resource name {quote(resource)}: {e}") from None
    if size <= 0 or size % 1024:
        raise RequestError(f"bad hugepages resource name {quote(resource)}: the page size must "
                           "be a positive whole number of KiB")
    return size // 1024


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


_AMOUNTS = ("cpu_request", "cpu_limit", "memory_request", "memory_limit")


def _check_amount(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{what} must be a non-negative integer, not {quote(value)}")


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's resources in the kubelet's units, requests already defaulted."""

    name: str
    kind: ContainerKind = ContainerKind.APP
    cpu_request: int = 0  # millicores
    cpu_limit: int = 0  # millicores; 0 = no limit
    memory_request: int = 0  # bytes
    memory_limit: int = 0  # bytes; 0 = no limit
    hugepages_requests: Mapping[int, int] = field(default_factory=dict)  # page size KiB → bytes
    hugepages_limits: Mapping[int, int] = field(default_factory=dict)
    devices: Mapping[str, int] = field(default_factory=dict)  # resource → count (from limits)
    # resource → NUMA nodes of the devices of that resource the container already holds
    device_numa_hints: Mapping[str, frozenset[int]] = field(default_factory=dict)
    # The container's own numa.nri.io/isolated-cpus value, as written (the engine checks it)
    isolated_cpus: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RequestError(f"container name must be a non-empty string, not "
                               f"{quote(self.name)}")
        if type(self.kind) is not ContainerKind:
            try:
                object.__setattr__(self, "kind", ContainerKind(self.kind))
            except ValueError:
                raise RequestError(f"container {self.name}: kind {quote(self.kind)} is not one "
                                   f"of {', '.join(ContainerKind)}") from None
        where = f"container {self.name}"
        for attr in _AMOUNTS:
            _check_amount(getattr(self, attr), f"{where}: {attr}")
        setattr_ = object.__setattr__
        for attr in ("hugepages_requests", "hugepages_limits", "devices"):
            mapping = _frozen(getattr(self, attr))
            setattr_(self, attr, mapping)
            for key, amount in mapping.items():
                _check_amount(amount, f"{where}: {attr}[{quote(key)}]")
        for size in (*self.hugepages_requests, *self.hugepages_limits):
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise RequestError(f"{where}: hugepage size {quote(size)} must be a positive KiB "
                                   "count")
        hints = _frozen({res: frozenset(nodes) for res, nodes in self.device_numa_hints.items()})
        setattr_(self, "device_numa_hints", hints)
        for res, nodes in hints.items():
            # Bounded: a hint's mask of node 4000000000 would take 500 MB (a damaged record).
            if any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_ID
                   for n in nodes):
                raise RequestError(f"{where}: device_numa_hints[{quote(res)}] must hold NUMA node "
                                   "ids")
        self._check_within_limits(where)

    def _check_within_limits(self, where: str) -> None:
        pairs = [(CPU, self.cpu_request, self.cpu_limit),
                 (MEMORY, self.memory_request, self.memory_limit)]
        pairs += [(hugepage_resource_name(size), amount, self.hugepages_limits.get(size, 0))
                  for size, amount in self.hugepages_requests.items()]
        for resource, request, limit in pairs:
            if limit and request > limit:
                raise RequestError(f"{where}: {resource} request {request} must be less than or "
                                   f"equal to the limit {limit}")

    @property
    def is_init(self) -> bool:
        """A container of spec.initContainers, sidecar or not."""
        return self.kind is not ContainerKind.APP

    def memory_requests(self) -> dict[str, int]:
        """The memory manager's view (§5.1): ``memory`` and each ``hugepages-<size>`` requested."""
        requested = {MEMORY: self.memory_request} if self.memory_request else {}
        requested.update((hugepage_resource_name(size), amount)
                         for size, amount in sorted(self.hugepages_requests.items()))
        return requested


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True)
class PodRequest:
    """A pod: its identity, containers in spec order, and annotations."""

    uid: str
    namespace: str
    name: str
    init_containers: tuple[ContainerRequest, ...] = ()  # spec order; kinds init and sidecar
    app_containers: tuple[ContainerRequest, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The class the runtime was told (the kubelet's cgroup parent), for a pod seen one
    # container at a time; None: computed from the containers.
    qos_override: QosClass | None = None
    # NUMA nodes to place inside when they still fit (the scheduler extender's choice, which a
    # front door read from numa.nri.io/scheduled-numa-nodes); None: no preference. It only
    # narrows the merge's candidates, never what the pod may have (engine.admit).
    preferred_numa: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if self.qos_override is not None:
            try:
                object.__setattr__(self, "qos_override", QosClass(self.qos_override))
            except ValueError:
                raise RequestError(f"pod qos_override {quote(self.qos_override)} is not one of "
                                   f"{', '.join(QosClass)}") from None
        for attr in ("uid", "namespace", "name"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr):
                raise RequestError(f"pod {attr} must be a non-empty string")
        object.__setattr__(self, "init_containers", tuple(self.init_containers))
        object.__setattr__(self, "app_containers", tuple(self.app_containers))
        object.__setattr__(self, "annotations", _frozen(self.annotations))
        if self.preferred_numa is not None:
            if isinstance(self.preferred_numa, (set, frozenset, list, tuple)):
                object.__setattr__(self, "preferred_numa", frozenset(self.preferred_numa))
            if not isinstance(self.preferred_numa, frozenset) or not self.preferred_numa or any(
                    isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_ID
                    for n in self.preferred_numa):
                raise RequestError(f"pod {self.name}: preferred_numa must be a non-empty set of "
                                   f"NUMA node ids, not {quote(self.preferred_numa)}")
        for c in self.init_containers:
            if not c.is_init:
                raise RequestError(f"pod {self.name}: init container {c.name} has kind app")
        for c in self.app_containers:
            if c.is_init:
                raise RequestError(f"pod {self.name}: app container {c.name} has kind {c.kind}")
        seen: set[str] = set()
        for c in self.containers:
            if c.name in seen:
                raise RequestError(f"pod {self.name}: two containers are named {c.name}")
            seen.add(c.name)
        for key, value in self.annotations.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise RequestError(f"pod {self.name}: annotation {quote(key)} must map a string "
                                   f"to a string, not {quote(value)}")

    @property
    def containers(self) -> tuple[ContainerRequest, ...]:
        """Every container in the order the kubelet admits them: init containers, then apps."""
        return self.init_containers + self.app_containers

    def container(self, name: str) -> ContainerRequest:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(f"pod {self.namespace}/{self.name} has no container {quote(name)}")

    @cached_property
    def qos(self) -> QosClass:
        return self.qos_override or qos_class(self)

    @cached_property
    def _totals(self) -> dict[str, Any]:
        """The pod totals below, each computed once per request: one admission asks for them
        several times, and the scheduler extender asks every node about the same request."""
        return {}


def qos_class(pod: PodRequest) -> QosClass:
    """The Kubernetes QoS class from CPU and memory of every container (init ones included).

    As the kubelet computes it: BestEffort when no container asks for or caps CPU or memory;
    Guaranteed when every container has both limits and the pod's summed requests equal its
    summed limits (a request left out already equals its limit, see the module docstring);
    Burstable otherwise. Zero counts as "not set".
    """
    requests: Counter[str] = Counter()
    limits: Counter[str] = Counter()
    every_container_capped = True
    for c in pod.containers:
        requests.update({CPU: c.cpu_request, MEMORY: c.memory_request})
        limits.update({CPU: c.cpu_limit, MEMORY: c.memory_limit})
        every_container_capped &= c.cpu_limit > 0 and c.memory_limit > 0
    requests, limits = +requests, +limits  # drop zeros
    if not requests and not limits:
        return QosClass.BEST_EFFORT
    if every_container_capped and requests == limits:
        return QosClass.GUARANTEED
    return QosClass.BURSTABLE


def guaranteed_cpus(pod: PodRequest, container: ContainerRequest) -> int:
    """Exclusive CPUs the static CPU manager gives ``container`` (§4.2): its CPU request when
    the pod is Guaranteed and the request is a whole number of CPUs, else 0 (shared pool)."""
    if pod.qos is not QosClass.GUARANTEED or container.cpu_request % 1000:
        return 0
    return container.cpu_request // 1000


def pod_guaranteed_cpus(pod: PodRequest) -> int:
    """Exclusive CPUs the pod needs as a whole (pod scope, §4.2); 0 unless Guaranteed."""
    if pod.qos is not QosClass.GUARANTEED:
        return 0
    memo = pod._totals
    if CPU not in memo:
        memo[CPU] = pod_totals(pod, lambda c: {CPU: guaranteed_cpus(pod, c)}).get(CPU, 0)
    return memo[CPU]


def pod_memory_requests(pod: PodRequest) -> dict[str, int]:
    """The memory manager's pod request (§5.1): per resource name (``memory``,
    ``hugepages-2Mi``, ...); only resources that app containers request appear."""
    memo = pod._totals
    if MEMORY not in memo:
        totals = pod_totals(pod, ContainerRequest.memory_requests)
        asked_by_apps = {res for c in pod.app_containers for res in c.memory_requests()}
        memo[MEMORY] = {res: amount for res, amount in totals.items() if res in asked_by_apps}
    return dict(memo[MEMORY])


def pod_device_requests(pod: PodRequest) -> dict[str, int]:
    """The device manager's pod request (§6): per device resource, from limits."""
    memo = pod._totals
    if "devices" not in memo:
        memo["devices"] = pod_totals(pod, lambda c: c.devices)
    return dict(memo["devices"])


def pod_totals(pod: PodRequest,
               amounts: Callable[[ContainerRequest], Mapping[str, int]]) -> dict[str, int]:
    """Per resource: max(Σ app + Σ sidecars, max over init of (sidecars so far + own))."""
    sidecars: Counter[str] = Counter()
    init_peak: dict[str, int] = {}
    for c in pod.init_containers:
        for res, amount in amounts(c).items():
            if c.kind is ContainerKind.SIDECAR:
                sidecars[res] += amount
            else:
                init_peak[res] = max(init_peak.get(res, 0), sidecars[res] + amount)
    long_running: Counter[str] = Counter()
    for c in pod.app_containers:
        for res, amount in amounts(c).items():
            long_running[res] += amount
    for res, amount in sidecars.items():
        long_running[res] += amount
    names = sorted({*long_running, *init_peak})
    return {res: max(long_running[res], init_peak.get(res, 0)) for res in names}

"""What a pod asks for: containers, their resources, the QoS class, and the pod-scope totals.

Units are the kubelet's integers: CPU in millicores, memory and hugepages in bytes, devices as
counts. Requests are stored *after* the API server's defaulting: a resource given only a limit
has request = limit (``container_from_resources`` applies that rule), so ``cpu: 2`` in limits
alone makes a Guaranteed container, exactly as on a real cluster.

The pod totals follow the kubelet's init/sidecar rule (docs/kubelet-semantics.md §4.2, §5.1,
§6): init containers run one at a time, each alongside the sidecars (restartable init
containers) started before it; app containers run together with every sidecar. The pod needs
``max(Σ app + Σ sidecars, max over regular init containers of (sidecars so far + its own))``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from types import MappingProxyType
from typing import Any

from nri_numa.engine.quantity import (QuantityError, bytes_value, cpu_millicores,
                                      format_binary, format_millicores, whole_count)

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
    return HUGEPAGES_PREFIX + format_binary(page_size_kib * 1024)


def hugepage_size_kib(resource: str) -> int:
    """"hugepages-2Mi" → 2048; the size part is a quantity, so "hugepages-2048Ki" is the same."""
    size_text = resource.removeprefix(HUGEPAGES_PREFIX)
    try:
        size = bytes_value(size_text)
    except QuantityError as e:
        raise RequestError(f"bad hugepages resource name {resource!r}: {e}") from None
    if size <= 0 or size % 1024:
        raise RequestError(f"bad hugepages resource name {resource!r}: the page size must be a "
                           "positive whole number of KiB")
    return size // 1024


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


def _check_amount(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{what} must be a non-negative integer, not {value!r}")


@dataclass(frozen=True)
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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise RequestError(f"container name must be a non-empty string, not {self.name!r}")
        try:
            object.__setattr__(self, "kind", ContainerKind(self.kind))
        except ValueError:
            raise RequestError(f"container {self.name}: kind {self.kind!r} is not one of "
                               f"{', '.join(ContainerKind)}") from None
        where = f"container {self.name}"
        for attr in ("cpu_request", "cpu_limit", "memory_request", "memory_limit"):
            _check_amount(getattr(self, attr), f"{where}: {attr}")
        for attr in ("hugepages_requests", "hugepages_limits", "devices"):
            object.__setattr__(self, attr, _frozen(getattr(self, attr)))
            for key, amount in getattr(self, attr).items():
                _check_amount(amount, f"{where}: {attr}[{key!r}]")
        for size in (*self.hugepages_requests, *self.hugepages_limits):
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise RequestError(f"{where}: hugepage size {size!r} must be a positive KiB count")
        object.__setattr__(self, "device_numa_hints", _frozen(
            {res: frozenset(nodes) for res, nodes in self.device_numa_hints.items()}))
        for res, nodes in self.device_numa_hints.items():
            if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in nodes):
                raise RequestError(f"{where}: device_numa_hints[{res!r}] must hold NUMA node ids")
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

    def __post_init__(self) -> None:
        if self.qos_override is not None:
            try:
                object.__setattr__(self, "qos_override", QosClass(self.qos_override))
            except ValueError:
                raise RequestError(f"pod qos_override {self.qos_override!r} is not one of "
                                   f"{', '.join(QosClass)}") from None
        for attr in ("uid", "namespace", "name"):
            if not isinstance(getattr(self, attr), str) or not getattr(self, attr):
                raise RequestError(f"pod {attr} must be a non-empty string")
        object.__setattr__(self, "init_containers", tuple(self.init_containers))
        object.__setattr__(self, "app_containers", tuple(self.app_containers))
        object.__setattr__(self, "annotations", _frozen(self.annotations))
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
                raise RequestError(f"pod {self.name}: annotation {key!r} must map a string to a "
                                   f"string, not {value!r}")

    @property
    def containers(self) -> tuple[ContainerRequest, ...]:
        """Every container in the order the kubelet admits them: init containers, then apps."""
        return self.init_containers + self.app_containers

    def container(self, name: str) -> ContainerRequest:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(f"pod {self.namespace}/{self.name} has no container {name!r}")

    @cached_property
    def qos(self) -> QosClass:
        return self.qos_override or qos_class(self)


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
    return pod_totals(pod, lambda c: {CPU: guaranteed_cpus(pod, c)}).get(CPU, 0)


def pod_memory_requests(pod: PodRequest) -> dict[str, int]:
    """The memory manager's pod request (§5.1): per resource name (``memory``,
    ``hugepages-2Mi``, ...); only resources that app containers request appear."""
    totals = pod_totals(pod, ContainerRequest.memory_requests)
    asked_by_apps = {res for c in pod.app_containers for res in c.memory_requests()}
    return {res: amount for res, amount in totals.items() if res in asked_by_apps}


def pod_device_requests(pod: PodRequest) -> dict[str, int]:
    """The device manager's pod request (§6): per device resource, from limits."""
    return pod_totals(pod, lambda c: c.devices)


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


# --- building requests from Kubernetes resource lists ------------------------------------


def is_extended_resource(name: str) -> bool:
    """``vendor.example/thing``: a domain outside kubernetes.io, as device plugins register."""
    domain, slash, _ = name.partition("/")
    native = domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    return bool(slash) and not native and not name.startswith("requests.")


def container_from_resources(name: str, kind: ContainerKind | str,
                             requests: Mapping[str, Any], limits: Mapping[str, Any], *,
                             where: str = "resources",
                             device_numa_hints: Mapping[str, Iterable[int]] | None = None,
                             ) -> ContainerRequest:
    """A container from Kubernetes ``requests``/``limits`` lists of quantities, validated as the
    API server does (errors name ``where.requests.<resource>``), with its defaulting applied: a
    resource that has a limit and no request gets request = limit."""
    req = _amounts(requests, f"{where}.requests")
    lim = _amounts(limits, f"{where}.limits")
    for res, amount in lim.items():
        req.setdefault(res, amount)
    for res, amount in req.items():
        _check_request_against_limit(res, amount, lim.get(res), f"{where}.requests.{res}")
    hugepages = _hugepage_sizes({*req, *lim}, where)
    return ContainerRequest(
        name=name, kind=kind,
        cpu_request=req.get(CPU, 0), cpu_limit=lim.get(CPU, 0),
        memory_request=req.get(MEMORY, 0), memory_limit=lim.get(MEMORY, 0),
        hugepages_requests={size: req[res] for res, size in hugepages.items() if res in req},
        hugepages_limits={size: lim[res] for res, size in hugepages.items() if res in lim},
        devices={res: n for res, n in lim.items() if is_extended_resource(res)},
        device_numa_hints=dict(device_numa_hints or {}),
    )


def _amounts(resources: Any, where: str) -> dict[str, int]:
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise RequestError(f"{where}: must be a map of resource name to quantity, not "
                           f"{type(resources).__name__}")
    amounts = {}
    for res, value in resources.items():
        path = f"{where}.{res}"
        _check_resource_name(res, path)
        try:
            if res == CPU:
                amounts[res] = cpu_millicores(value)
            elif is_extended_resource(res):
                amounts[res] = whole_count(value)
            else:
                amounts[res] = bytes_value(value)
        except QuantityError as e:
            raise RequestError(f"{path}: {e}") from None
        if res.startswith(HUGEPAGES_PREFIX):
            try:
                hugepage_size_kib(res)
            except RequestError as e:
                raise RequestError(f"{path}: {e}") from None
    return amounts


def _check_resource_name(res: Any, path: str) -> None:
    if not isinstance(res, str):
        raise RequestError(f"{path}: resource names are strings")
    if res in (CPU, MEMORY, EPHEMERAL_STORAGE) or res.startswith(HUGEPAGES_PREFIX):
        return
    if not is_extended_resource(res):
        raise RequestError(f"{path}: {res!r} is not a resource a container can ask for; use cpu, "
                           "memory, ephemeral-storage, hugepages-<size> or an extended resource "
                           "such as nvidia.com/gpu")


def _check_request_against_limit(res: str, request: int, limit: int | None, path: str) -> None:
    # Hugepages and extended resources cannot be overcommitted: a limit is required and the
    # request must equal it.
    exact = res.startswith(HUGEPAGES_PREFIX) or is_extended_resource(res)
    if exact and limit is None:
        raise RequestError(f"{path}: a limit must be set for {res}, which cannot be overcommitted")
    if exact and request != limit:
        raise RequestError(f"{path}: {_human(res, request)} must be equal to the {res} limit of "
                           f"{_human(res, limit)}")
    if limit is not None and request > limit:
        raise RequestError(f"{path}: {_human(res, request)} must be less than or equal to the "
                           f"{res} limit of {_human(res, limit)}")


def _human(res: str, amount: int | None) -> str:
    if amount is None:
        return "none"
    if res == CPU:
        return format_millicores(amount)
    return str(amount) if is_extended_resource(res) else format_binary(amount)


def _hugepage_sizes(resources: Iterable[str], where: str) -> dict[str, int]:
    """hugepages-<size> resource → page size in KiB; two names for one size are an error."""
    sizes: dict[str, int] = {}
    for res in sorted(r for r in resources if r.startswith(HUGEPAGES_PREFIX)):
        size = hugepage_size_kib(res)
        twin = next((other for other, s in sizes.items() if s == size), None)
        if twin is not None:
            raise RequestError(f"{where}: {twin} and {res} name the same page size")
        sizes[res] = size
    return sizes



# --- building a pod from a Kubernetes Pod manifest ---------------------------------------

_INIT_RESTART_POLICIES = {"Always": ContainerKind.SIDECAR, "OnFailure": ContainerKind.INIT,
                          "Never": ContainerKind.INIT}


def pod_from_manifest(obj: Mapping[str, Any]) -> PodRequest:
    """A pod from a Kubernetes Pod manifest (already parsed from YAML or JSON).

    Reads metadata (name, namespace — default "default" —, uid — default "namespace/name" —,
    annotations) and spec.initContainers / spec.containers with their resources. Errors name
    the path of the bad field, e.g. ``spec.containers[1].resources.limits.cpu: bad quantity
    "abc"``. Pod-level resources (spec.resources) are refused rather than misread.
    """
    pod = _map(obj, "pod")
    if pod.get("kind", "Pod") != "Pod":
        raise RequestError(f"kind: expected Pod, not {pod['kind']!r}")
    meta = _map(pod.get("metadata"), "metadata")
    name = _text(meta.get("name"), "metadata.name")
    namespace = _text(meta.get("namespace", "default"), "metadata.namespace")
    spec = _map(pod.get("spec"), "spec")
    if spec.get("resources"):
        raise RequestError("spec.resources: pod-level resources are not supported; set resources "
                           "on each container")
    apps = _list(spec.get("containers"), "spec.containers")
    if not apps:
        raise RequestError("spec.containers: a pod needs at least one container")
    inits = _list(spec.get("initContainers", []), "spec.initContainers")
    try:
        return PodRequest(
            uid=_text(meta.get("uid", f"{namespace}/{name}"), "metadata.uid"),
            namespace=namespace, name=name,
            init_containers=tuple(_container(c, f"spec.initContainers[{i}]", init=True)
                                  for i, c in enumerate(inits)),
            app_containers=tuple(_container(c, f"spec.containers[{i}]", init=False)
                                 for i, c in enumerate(apps)),
            annotations=_annotations(meta.get("annotations")),
        )
    except RequestError as e:
        raise RequestError(f"pod {namespace}/{name}: {e}") from None


def _container(raw: Any, where: str, *, init: bool) -> ContainerRequest:
    c = _map(raw, where)
    name = _text(c.get("name"), f"{where}.name")
    policy = c.get("restartPolicy")
    kind = ContainerKind.INIT if init else ContainerKind.APP
    if policy is not None:
        if not isinstance(policy, str) or policy not in _INIT_RESTART_POLICIES:
            raise RequestError(f"{where}.restartPolicy: {policy!r} is not one of "
                               f"{', '.join(_INIT_RESTART_POLICIES)}")
        if init:
            kind = _INIT_RESTART_POLICIES[policy]
    resources = _map(c.get("resources", {}), f"{where}.resources")
    return container_from_resources(name, kind, resources.get("requests") or {},
                                    resources.get("limits") or {}, where=f"{where}.resources")


def _annotations(raw: Any) -> dict[str, str]:
    annotations = _map(raw or {}, "metadata.annotations")
    for key, value in annotations.items():
        _text(value, f"metadata.annotations[{key!r}]", allow_empty=True)
    return dict(annotations)


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        raise RequestError(f"{where}: missing")
    if not isinstance(value, Mapping):
        raise RequestError(f"{where}: must be a map, not {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        raise RequestError(f"{where}: missing")
    if not isinstance(value, list):
        raise RequestError(f"{where}: must be a list, not {type(value).__name__}")
    return value


def _text(value: Any, where: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or not (value or allow_empty):
        raise RequestError(f"{where}: must be a non-empty string, not {value!r}")
    return value

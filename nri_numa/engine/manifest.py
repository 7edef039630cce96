"""Requests from Kubernetes objects: resource lists and Pod manifests, validated as the API
server validates them and defaulted as it defaults them.

Kept apart from request.py, which holds the request values and the pod-scope totals: this
module only reads Kubernetes' shapes (quantities, ``requests``/``limits`` maps, a Pod's
metadata and containers) and every error names the path of the bad field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nri_numa.engine.quantity import (QuantityError, bytes_value, cpu_millicores, format_binary,
                                      format_millicores, whole_count)
from nri_numa.engine.request import (CPU, EPHEMERAL_STORAGE, HUGEPAGES_PREFIX, MEMORY,
                                     ContainerKind, ContainerRequest, PodRequest, RequestError,
                                     hugepage_size_kib)
from nri_numa.safeio.bounds import MAX_NAME, clip, quote


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
        path = f"{where}.{clip(str(res))}"
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
        raise RequestError(f"{path}: {quote(res)} is not a resource a container can ask for; "
                           "use cpu, memory, ephemeral-storage, hugepages-<size> or an extended "
                           "resource such as nvidia.com/gpu")


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
        raise RequestError(f"kind: expected Pod, not {quote(pod['kind'])}")
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
            raise RequestError(f"{where}.restartPolicy: {quote(policy)} is not one of "
                               f"{', '.join(_INIT_RESTART_POLICIES)}")
        if init:
            kind = _INIT_RESTART_POLICIES[policy]
    resources = _map(c.get("resources", {}), f"{where}.resources")
    return container_from_resources(name, kind, resources.get("requests") or {},
                                    resources.get("limits") or {}, where=f"{where}.resources")


def _annotations(raw: Any) -> dict[str, str]:
    annotations = _map(raw or {}, "metadata.annotations")
    for key, value in annotations.items():
        _text(value, f"metadata.annotations[{quote(key)}]", allow_empty=True, limit=None)
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


def _text(value: Any, where: str, *, allow_empty: bool = False,
          limit: int | None = MAX_NAME) -> str:
    if not isinstance(value, str) or not (value or allow_empty):
        raise RequestError(f"{where}: must be a non-empty string, not {quote(value)}")
    # Names are echoed in every line about the pod: Kubernetes' own stop at 253 characters,
    # and hold no newline, control character or lone surrogate.
    if limit is not None and len(value) > limit:
        raise RequestError(f"{where}: {quote(value)} is longer than {limit} characters")
    if limit is not None and not value.isprintable():
        raise RequestError(f"{where}: {quote(value)} holds a character that is not printable")
    return value

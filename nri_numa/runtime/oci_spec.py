"""An OCI runtime spec (``config.json``) → the runtime-neutral ``RuntimeContainer``.

The OCI hook reads the same Linux resources the NRI plugin gets in its messages, only from the
bundle's spec: ``linux.resources.cpu`` (shares, quota, period, cpus, mems),
``linux.resources.memory.limit``, ``linux.resources.hugepageLimits``, ``linux.devices``,
``process.env`` and ``annotations``. What the spec does not carry explicitly comes from the
annotations the CRI runtimes add: containerd's ``io.kubernetes.cri.*`` and CRI-O's
``io.kubernetes.cri-o.*`` (sandbox id, container type and name, the kubelet's labels), and the
pod's cgroup parent, which is ``linux.cgroupsPath`` less its last part. A container outside
Kubernetes (runc, podman) is a pod of its own, known by its id.

Every field is checked: a value of the wrong type is a ``RuntimeInputError`` naming it by its
path in the spec (``linux.resources.cpu.quota``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nri_numa.runtime.container import (DeviceNode, RuntimeContainer, RuntimeInputError,
                                        RuntimePod, page_size_kib, parse_cpuset, parse_env)
from nri_numa.safeio.bounds import quote
from nri_numa.safeio.documents import DocumentError, load_json

SANDBOX_ID_KEYS = ("io.kubernetes.cri.sandbox-id", "io.kubernetes.cri-o.SandboxID")
CONTAINER_TYPE_KEYS = ("io.kubernetes.cri.container-type", "io.kubernetes.cri-o.ContainerType")
SANDBOX_TYPE = "sandbox"
CRIO_LABELS_KEY = "io.kubernetes.cri-o.Labels"  # the kubelet's labels, as one JSON object
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"
CONTAINERD_CONTAINER_NAME = "io.kubernetes.cri.container-name"
# containerd names the sandbox in the container's annotations; CRI-O and the kubelet's labels
# (io.kubernetes.pod.*) are read by pod_identity.
_CONTAINERD_SANDBOX = {"uid": "io.kubernetes.cri.sandbox-uid",
                       "name": "io.kubernetes.cri.sandbox-name",
                       "namespace": "io.kubernetes.cri.sandbox-namespace"}


def runtime_container(spec: Any, container_id: str,
                      extra_annotations: Mapping[str, str] | None = None) -> RuntimeContainer:
    """The container a spec describes. ``extra_annotations`` (the OCI state's, which a runtime
    may fill from elsewhere) add to the spec's own; the spec wins where both name a key."""
    root = _object(spec, "spec")
    annotations = {**_string_map(extra_annotations or {}, "state annotations"),
                   **_string_map(root.get("annotations") or {}, "annotations")}
    labels = _crio_labels(annotations)
    linux = _object(root.get("linux"), "linux")
    resources = _object(linux.get("resources"), "linux.resources")
    cpu = _object(resources.get("cpu"), "linux.resources.cpu")
    memory = _object(resources.get("memory"), "linux.resources.memory")
    process = _object(root.get("process"), "process")
    pod = RuntimePod(
        id=_first(annotations, SANDBOX_ID_KEYS) or container_id,
        uid=annotations.get(_CONTAINERD_SANDBOX["uid"], ""),
        name=annotations.get(_CONTAINERD_SANDBOX["name"], ""),
        namespace=annotations.get(_CONTAINERD_SANDBOX["namespace"], ""),
        cgroup_parent=cgroup_parent(_string(linux.get("cgroupsPath"), "linux.cgroupsPath")),
        annotations=annotations, labels=labels)
    name = (labels.get(CONTAINER_NAME_LABEL) or annotations.get(CONTAINERD_CONTAINER_NAME)
            or annotations.get(CONTAINER_NAME_LABEL) or container_id)
    return RuntimeContainer(
        id=container_id, name=name, pod=pod,
        cpu_shares=_integer(cpu.get("shares"), "linux.resources.cpu.shares"),
        cpu_quota=_integer(cpu.get("quota"), "linux.resources.cpu.quota"),
        cpu_period=_integer(cpu.get("period"), "linux.resources.cpu.period"),
        memory_limit=_integer(memory.get("limit"), "linux.resources.memory.limit"),
        hugepage_limits=_hugepages(resources.get("hugepageLimits")),
        devices=_devices(linux.get("devices")),
        env=parse_env(_strings(process.get("env"), "process.env")),
        annotations=annotations, labels=labels,
        cpuset_cpus=_cpuset(cpu.get("cpus"), "linux.resources.cpu.cpus"),
        cpuset_mems=_cpuset(cpu.get("mems"), "linux.resources.cpu.mems"))


def is_sandbox(annotations: Mapping[str, str]) -> bool:
    """The pod's infrastructure ("pause") container, which the CRI runtimes mark as such."""
    return any(annotations.get(key) == SANDBOX_TYPE for key in CONTAINER_TYPE_KEYS)


def cgroup_parent(cgroups_path: str) -> str:
    """The parent part of ``linux.cgroupsPath``: the slice of the systemd driver's
    ``slice:prefix:name``, else the path less its last component."""
    if not cgroups_path:
        return ""
    parts = cgroups_path.split(":")
    if len(parts) == 3 and not cgroups_path.startswith("/"):
        return parts[0]
    trimmed = cgroups_path.rstrip("/")
    return trimmed.rsplit("/", 1)[0] if "/" in trimmed else ""


# --- typed reads -----------------------------------------------------------------------------


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RuntimeInputError(f"{where} must be an object, not {type(value).__name__}")
    return value


def _string(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RuntimeInputError(f"{where} must be a string, not {quote(value)}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuntimeInputError(f"{where} must be a list of strings")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise RuntimeInputError(f"{where} must be an object, not {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise RuntimeInputError(f"{where}: {quote(key)} must map a string to a string")
    return dict(value)


def _integer(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuntimeInputError(f"{where} must be an integer, not {quote(value)}")
    return value


def _first(annotations: Mapping[str, str], keys: tuple[str, ...]) -> str:
    return next((annotations[k] for k in keys if annotations.get(k)), "")


def _crio_labels(annotations: Mapping[str, str]) -> dict[str, str]:
    raw = annotations.get(CRIO_LABELS_KEY)
    if not raw:
        return {}
    try:
        labels = load_json(raw, f"annotation {CRIO_LABELS_KEY}")
    except DocumentError as e:
        raise RuntimeInputError(str(e)) from None
    return _string_map(labels, f"annotation {CRIO_LABELS_KEY}")


def _hugepages(value: Any) -> dict[int, int]:
    where = "linux.resources.hugepageLimits"
    if value is None:
        return {}
    if not isinstance(value, list):
        raise RuntimeInputError(f"{where} must be a list")
    pages: dict[int, int] = {}
    for i, entry in enumerate(value):
        item = _object(entry, f"{where}[{i}]")
        size_text = _string(item.get("pageSize"), f"{where}[{i}].pageSize")
        limit = _integer(item.get("limit"), f"{where}[{i}].limit")
        if not size_text or limit is None:
            raise RuntimeInputError(f"{where}[{i}] needs pageSize and limit")
        try:
            size = page_size_kib(size_text)
        except RuntimeInputError as e:
            raise RuntimeInputError(f"{where}[{i}]: {e}") from None
        pages[size] = pages.get(size, 0) + limit
    return pages


def _devices(value: Any) -> tuple[DeviceNode, ...]:
    where = "linux.devices"
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RuntimeInputError(f"{where} must be a list")
    nodes = []
    for i, entry in enumerate(value):
        item = _object(entry, f"{where}[{i}]")
        kind = _string(item.get("type"), f"{where}[{i}].type")
        # A FIFO has no device numbers; every other node must give both.
        major = _integer(item.get("major"), f"{where}[{i}].major")
        minor = _integer(item.get("minor"), f"{where}[{i}].minor")
        if kind != "p" and (major is None or minor is None):
            raise RuntimeInputError(f"{where}[{i}] ({quote(item.get('path'))}) needs major and "
                                    "minor")
        try:
            nodes.append(DeviceNode(_string(item.get("path"), f"{where}[{i}].path"), kind,
                                    major or 0, minor or 0))
        except RuntimeInputError as e:
            raise RuntimeInputError(f"{where}[{i}]: {e}") from None
    return tuple(nodes)


def _cpuset(value: Any, where: str) -> frozenset[int] | None:
    return parse_cpuset(_string(value, where), where)

"""The plugin's records of the pods and containers it placed: the second half of a checkpoint's
payload (nri_numa.state.checkpoint), what the plugin must remember across restarts besides the
ledger."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from nri_numa.engine.request import ContainerRequest, RequestError
from nri_numa.topology.cpulist import ListFormatError, format_cached, parse_list


# --- what the plugin remembers besides the ledger ----------------------------------------


class RecordError(ValueError):
    """A record in a checkpoint payload that cannot be read; the message names it."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod the plugin placed containers of: what the engine's request needs of it."""

    sandbox_id: str
    uid: str
    namespace: str
    name: str
    cgroup_parent: str = ""  # tells the QoS class under the kubelet
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotations", MappingProxyType(dict(self.annotations)))

    def to_dict(self) -> dict[str, Any]:
        return {"sandbox_id": self.sandbox_id, "uid": self.uid, "namespace": self.namespace,
                "name": self.name, "cgroup_parent": self.cgroup_parent,
                "annotations": dict(self.annotations)}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> PodRecord:
        d = _obj(raw, where)
        return cls(_str(d, "sandbox_id", where), _str(d, "uid", where),
                   _str(d, "namespace", where), _str(d, "name", where),
                   _str(d, "cgroup_parent", where),
                   _str_map(d.get("annotations", {}), f"{where}.annotations"))


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """A container the plugin manages: the engine's request for it, and its exclusive CPUs.
    A shared container runs on the shared pool: the NRI plugin's record of it holds no CPUs
    (nri_numa.nri.records.ON_THE_POOL) and its checkpoint writes the pool as its cpus; the
    hook's ledger keeps the pool it last wrote there. ``in_ledger`` is False for a running
    container that did not fit when adopted: it only follows the shared pool (the ledger may
    still hold the devices it had)."""

    id: str
    sandbox_id: str
    pod_uid: str
    request: ContainerRequest
    cpus: frozenset[int]
    exclusive: bool
    mems: frozenset[int] | None = None
    in_ledger: bool = True

    @property
    def name(self) -> str:
        return self.request.name

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {"id": self.id, "sandbox_id": self.sandbox_id, "pod_uid": self.pod_uid,
                "cpus": format_cached(self.cpus), "exclusive": self.exclusive,
                "mems": None if self.mems is None else format_cached(self.mems),
                "in_ledger": self.in_ledger,
                "request": {"name": r.name, "cpu_request": r.cpu_request,
                            "cpu_limit": r.cpu_limit, "memory_request": r.memory_request,
                            "memory_limit": r.memory_limit,
                            "hugepages": {str(k): v for k, v in r.hugepages_limits.items()},
                            "device_numa_hints": {k: sorted(v) for k, v in
                                                  r.device_numa_hints.items()},
                            **({} if r.isolated_cpus is None
                               else {"isolated_cpus": r.isolated_cpus})}}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> ContainerRecord:
        d = _obj(raw, where)
        r = _obj(d.get("request"), f"{where}.request")
        try:
            pages = {int(k): v for k, v in _obj(r.get("hugepages", {}),
                                                f"{where}.request.hugepages").items()}
            request = ContainerRequest(
                name=r.get("name"), cpu_request=r.get("cpu_request"), cpu_limit=r.get("cpu_limit"),
                memory_request=r.get("memory_request"), memory_limit=r.get("memory_limit"),
                hugepages_requests=pages, hugepages_limits=pages,
                device_numa_hints=_obj(r.get("device_numa_hints", {}),
                                       f"{where}.request.device_numa_hints"),
                isolated_cpus=r.get("isolated_cpus"))
            mems = d.get("mems")
            return cls(_str(d, "id", where), _str(d, "sandbox_id", where),
                       _str(d, "pod_uid", where), request, parse_list(_str(d, "cpus", where)),
                       _bool(d, "exclusive", where),
                       None if mems is None else parse_list(_str(d, "mems", where)),
                       _bool(d, "in_ledger", where))
        except RecordError:
            raise
        except (RequestError, ListFormatError, ValueError, TypeError) as e:
            raise RecordError(f"{where}: {e}") from None


def records_to_dict(pods: Mapping[str, PodRecord],
                    containers: Mapping[str, ContainerRecord]) -> dict[str, Any]:
    """Pods by sandbox id, containers by id; lists keep the containers' creation order."""
    return {"pods": [p.to_dict() for p in pods.values()],
            "containers": [c.to_dict() for c in containers.values()]}


def records_from_dict(raw: Any) -> tuple[dict[str, PodRecord], dict[str, ContainerRecord]]:
    """The records of ``records_to_dict``, each read field by field: an error names it."""
    d = _obj(raw, "records")
    pods = [PodRecord.from_dict(p, f"pods[{i}]") for i, p in enumerate(_list(d, "pods"))]
    containers = [ContainerRecord.from_dict(c, f"containers[{i}]")
                  for i, c in enumerate(_list(d, "containers"))]
    return {p.sandbox_id: p for p in pods}, {c.id: c for c in containers}


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecordError(f"{where} must be an object, not {type(value).__name__}")
    return value


def _list(d: dict, key: str) -> list:
    if not isinstance(d.get(key), list):
        raise RecordError(f"{key} must be a list")
    return d[key]


def _str(d: dict, key: str, where: str) -> str:
    if not isinstance(d.get(key), str):
        raise RecordError(f"{where}.{key} must be a string, not {d.get(key)!r}")
    return d[key]


def _bool(d: dict, key: str, where: str) -> bool:
    if not isinstance(d.get(key), bool):
        raise RecordError(f"{where}.{key} must be true or false, not {d.get(key)!r}")
    return d[key]


def _str_map(value: Any, where: str) -> dict[str, str]:
    m = _obj(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise RecordError(f"{where} must map strings to strings")
    return m

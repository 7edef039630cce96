"""What a fake kubelet (``fake_server``) says: pods, their containers' devices, and how it misbehaves.

A small YAML or JSON file::

    pods:
      - namespace: default          # default "default"
        name: trainer
        containers:
          - name: main
            devices:
              - resource: nvidia.com/gpu
                ids: [GPU-6c1e0d1f-node1]
                numa: [1]           # the device plugin's topology; leave out for none
            cpus: [4, 5]            # exclusive CPUs, as the CPU Manager reports them
            claims:                 # DRA: ContainerResources.dynamic_resources
              - name: gpu-claim       # the ResourceClaim (namespace: the pod's unless given)
                devices:
                  - {driver: gpu.example.com, pool: node-1, device: gpu-1,
                     cdi: ["gpu.example.com/gpu=gpu-1"]}
    allocatable:                    # what GetAllocatableResources answers
      devices: [{resource: nvidia.com/gpu, ids: [GPU-6c1e0d1f-node1], numa: [1]}]
      cpus: [1, 2, 3, 4, 5, 6, 7]
    get: enabled                    # enabled | disabled (gate off) | unimplemented (before 1.27)
    delay: 0                        # seconds every call waits before answering
    garbage: false                  # answer bytes that are not a protobuf message
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from nri_numa.agent.inputs import InputFileError, read_text, yaml_documents
from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.safeio.bounds import quote
from nri_numa.safeio.documents import known_mapping

GET_MODES = ("enabled", "disabled", "unimplemented")


class FakeStateError(ValueError):
    """A fake kubelet state that cannot be served; the message names the field."""


# Not slots: cached_property uses the instance's __dict__.
@dataclass(frozen=True)
class FakeKubeletState:
    pods: tuple[pr.PodResources, ...] = ()
    allocatable: pr.AllocatableResourcesResponse = field(
        default_factory=pr.AllocatableResourcesResponse)
    get: str = "enabled"
    delay_s: float = 0.0
    garbage: bool = False

    @cached_property
    def list_reply(self) -> pr.ListPodResourcesResponse:
        """The answer to List, built once per state (the server serializes it at every call).
        Copying every pod into a new reply at every call would be Python's work, which a
        kubelet in Go does not do, in the bench's figures."""
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    def pod(self, namespace: str, name: str) -> pr.PodResources | None:
        for p in self.pods:
            if p.namespace == namespace and p.name == name:
                return p
        return None


def read_state_file(path: Path) -> FakeKubeletState:
    try:
        documents = [d for d in yaml_documents(read_text(path, "fake kubelet state"), str(path))
                     if d is not None]
    except InputFileError as e:
        raise FakeStateError(str(e)) from None
    if len(documents) > 1:
        raise FakeStateError(f"{path}: holds {len(documents)} YAML documents, not one")
    try:
        return state_from_mapping(documents[0] if documents else {})
    except FakeStateError as e:
        raise FakeStateError(f"{path}: {e}") from None


def state_from_mapping(data: Any) -> FakeKubeletState:
    where = "state"
    data = _mapping(data, where, {"pods", "allocatable", "get", "delay", "garbage"})
    pods = tuple(_pod(p, f"pods[{i}]") for i, p in enumerate(_list(data.get("pods", []), "pods")))
    alloc = _mapping(data.get("allocatable", {}), "allocatable", {"devices", "cpus"})
    allocatable = pr.AllocatableResourcesResponse(
        devices=[_devices(d, f"allocatable.devices[{i}]")
                 for i, d in enumerate(_list(alloc.get("devices", []), "allocatable.devices"))],
        cpu_ids=_ints(alloc.get("cpus", []), "allocatable.cpus"))
    get = data.get("get", "enabled")
    if get not in GET_MODES:
        raise FakeStateError(f"get must be one of {', '.join(GET_MODES)}, not {quote(get)}")
    delay = data.get("delay", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise FakeStateError(f"delay must be a number of seconds >= 0, not {quote(delay)}")
    garbage = data.get("garbage", False)
    if not isinstance(garbage, bool):
        raise FakeStateError(f"garbage must be true or false, not {quote(garbage)}")
    return FakeKubeletState(pods, allocatable, get, float(delay), garbage)


def _pod(data: Any, where: str) -> pr.PodResources:
    data = _mapping(data, where, {"namespace", "name", "containers"})
    containers = []
    for i, c in enumerate(_list(data.get("containers", []), f"{where}.containers")):
        cw = f"{where}.containers[{i}]"
        c = _mapping(c, cw, {"name", "devices", "cpus", "claims"})
        containers.append(pr.ContainerResources(
            name=_string(c.get("name"), f"{cw}.name"),
            devices=[_devices(d, f"{cw}.devices[{j}]")
                     for j, d in enumerate(_list(c.get("devices", []), f"{cw}.devices"))],
            cpu_ids=_ints(c.get("cpus", []), f"{cw}.cpus"),
            dynamic_resources=[
                _claim(d, f"{cw}.claims[{j}]", data.get("namespace", "default"))
                for j, d in enumerate(_list(c.get("claims", []), f"{cw}.claims"))]))
    return pr.PodResources(namespace=_string(data.get("namespace", "default"), f"{where}.namespace"),
                           name=_string(data.get("name"), f"{where}.name"), containers=containers)


def _claim(data: Any, where: str, namespace: Any) -> pr.DynamicResource:
    data = _mapping(data, where, {"name", "namespace", "devices"})
    devices = []
    for j, d in enumerate(_list(data.get("devices", []), f"{where}.devices")):
        dw = f"{where}.devices[{j}]"
        d = _mapping(d, dw, {"driver", "pool", "device", "cdi"})
        cdi = _list(d.get("cdi", []), f"{dw}.cdi")
        devices.append(pr.ClaimResource(
            driver_name=_string(d.get("driver"), f"{dw}.driver"),
            pool_name=_string(d.get("pool"), f"{dw}.pool"),
            device_name=_string(d.get("device"), f"{dw}.device"),
            cdi_devices=[pr.CDIDevice(name=_string(n, f"{dw}.cdi[{k}]"))
                         for k, n in enumerate(cdi)]))
    return pr.DynamicResource(
        claim_name=_string(data.get("name"), f"{where}.name"),
        claim_namespace=_string(data.get("namespace", namespace), f"{where}.namespace"),
        claim_resources=devices)


def _devices(data: Any, where: str) -> pr.ContainerDevices:
    data = _mapping(data, where, {"resource", "ids", "numa"})
    ids = _list(data.get("ids", []), f"{where}.ids")
    for i, ident in enumerate(ids):
        _string(ident, f"{where}.ids[{i}]")
    group = pr.ContainerDevices(resource_name=_string(data.get("resource"), f"{where}.resource"),
                                device_ids=ids)
    if "numa" in data:
        group.topology.nodes.extend(pr.NUMANode(ID=n) for n in _ints(data["numa"], f"{where}.numa"))
    return group


def _mapping(data: Any, where: str, keys: set[str]) -> Mapping[str, Any]:
    return known_mapping(data, where, keys, FakeStateError)


def _list(data: Any, where: str) -> list[Any]:
    if not isinstance(data, list):
        raise FakeStateError(f"{where} must be a list, not {type(data).__name__}")
    return data


def _string(data: Any, where: str) -> str:
    if not isinstance(data, str) or not data:
        raise FakeStateError(f"{where} must be a non-empty string, not {quote(data)}")
    return data


def _ints(data: Any, where: str) -> list[int]:
    items = _list(data, where)
    for n in items:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise FakeStateError(f"{where}: {quote(n)} is not a non-negative integer")
    return items

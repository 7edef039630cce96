"""What the fake device plugin advertises: one extended resource and its devices.

From flags (``--resource example.com/gpu --device gpu0@0 --device gpu1@1,2 --device gpu2``:
an id, then ``@`` and the NUMA nodes, none when left out) or from a YAML or JSON file that the
plugin reads again whenever it changes, so a test or a person can change health or topology
while the kubelet watches::

    resource: example.com/gpu
    devices:
      - id: gpu0
        numa: [0]            # the NUMA nodes the kubelet is told; leave out for none
        health: Healthy      # Healthy (default) or Unhealthy
      - {id: gpu1, numa: [1], health: Unhealthy}

The kubelet's own rules are checked here, so that a mistake is one line at start rather than a
registration the kubelet refuses: the resource name has a domain other than kubernetes.io, a
device id is at most 63 characters, ids are unique.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.agent.inputs import InputFileError, read_text, yaml_documents
from nri_numa.safeio.bounds import quote
from nri_numa.safeio.documents import known_mapping

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
MAX_ID_LENGTH = 63  # the kubelet's limit on a device id
MAX_DEVICES = 4096
# An extended resource name as the kubelet accepts one from a device plugin: a DNS-subdomain
# prefix, a slash, a name; the kubernetes.io domains are the kubelet's own.
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DEVICE_FLAG = re.compile(r"^(?P<id>[^@]+)(@(?P<numa>[0-9]+(,[0-9]+)*))?$")


class DeviceListError(ValueError):
    """Devices that cannot be advertised; the message names the field and the value."""


@dataclass(frozen=True, slots=True)
class FakeDevice:
    id: str
    numa: tuple[int, ...] = ()  # empty: the kubelet is told no topology
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class DeviceList:
    resource: str
    devices: tuple[FakeDevice, ...]

    def device(self, device_id: str) -> FakeDevice | None:
        return next((d for d in self.devices if d.id == device_id), None)


def check_resource(name: Any) -> str:
    if not isinstance(name, str) or not _RESOURCE.match(name):
        raise DeviceListError(f"resource must be an extended resource name like example.com/gpu, "
                              f"not {quote(name)}")
    domain = name.split("/", 1)[0]
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise DeviceListError(f"resource {quote(name)}: the kubernetes.io domains are the "
                              f"kubelet's own; use another, e.g. example.com")
    return name


def device_list(resource: Any, devices: list[FakeDevice]) -> DeviceList:
    """The checked list: a valid resource name, unique ids, at most MAX_DEVICES devices."""
    if len(devices) > MAX_DEVICES:
        raise DeviceListError(f"{len(devices)} devices: at most {MAX_DEVICES}")
    seen: set[str] = set()
    for device in devices:
        if device.id in seen:
            raise DeviceListError(f"device id {quote(device.id)} appears twice")
        seen.add(device.id)
    return DeviceList(check_resource(resource), tuple(devices))


def device_from_flag(text: str) -> FakeDevice:
    """``ID`` or ``ID@N[,N...]``."""
    found = _DEVICE_FLAG.match(text)
    if found is None:
        raise DeviceListError(f"--device {quote(text)}: expected ID or ID@NUMA[,NUMA...], "
                              f"e.g. gpu0@0")
    numa = tuple(int(n) for n in found["numa"].split(",")) if found["numa"] else ()
    return FakeDevice(_device_id(found["id"], "--device"), numa)


def read_device_file(path: Path) -> DeviceList:
    try:
        documents = [d for d in yaml_documents(read_text(path, "device list"), str(path))
                     if d is not None]
    except InputFileError as e:
        raise DeviceListError(str(e)) from None
    if len(documents) != 1:
        raise DeviceListError(f"{path}: holds {len(documents)} YAML documents, not one")
    try:
        return devices_from_mapping(documents[0])
    except DeviceListError as e:
        raise DeviceListError(f"{path}: {e}") from None


def devices_from_mapping(data: Any) -> DeviceList:
    data = _mapping(data, "the file", {"resource", "devices"})
    items = data.get("devices", [])
    if not isinstance(items, list):
        raise DeviceListError(f"devices must be a list, not {type(items).__name__}")
    return device_list(data.get("resource"), [_device(d, f"devices[{i}]")
                                              for i, d in enumerate(items)])


def _device(data: Any, where: str) -> FakeDevice:
    data = _mapping(data, where, {"id", "numa", "health"})
    numa = data.get("numa", [])
    if not isinstance(numa, list) or any(isinstance(n, bool) or not isinstance(n, int) or n < 0
                                         for n in numa):
        raise DeviceListError(f"{where}.numa must be a list of NUMA node numbers, not {quote(numa)}")
    health = data.get("health", HEALTHY)
    if health not in (HEALTHY, UNHEALTHY):
        raise DeviceListError(f"{where}.health must be {HEALTHY} or {UNHEALTHY}, not {quote(health)}")
    return FakeDevice(_device_id(data.get("id"), f"{where}.id"), tuple(numa), health == HEALTHY)


def _device_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH \
            or not value.isprintable() or value.strip() != value:
        raise DeviceListError(f"{where} must be 1 to {MAX_ID_LENGTH} printable characters "
                              f"without surrounding blanks, not {quote(value)}")
    return value


def _mapping(data: Any, where: str, keys: set[str]) -> Mapping[str, Any]:
    return known_mapping(data, where, keys, DeviceListError)

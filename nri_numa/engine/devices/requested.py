"""Devices asked for by annotation: one syntax for every front door (docs/devices.md).

A value is a comma-separated list of ``resource=count``:

* ``nvidia.com/gpu=2``: GPUs, by the name NVIDIA's device plugin gives them;
* ``pci/15b3:1021=1``: PCI functions of that vendor and device id (NICs: ConnectX-7 here);
* ``nic=1``: a device class, which names the machine's one NIC resource (an error where the
  machine has NICs of several kinds: name the ``pci/`` resource instead).

It is read from ``numa.nri.io/devices.<container>`` on the pod (Kubernetes: per container) and
from ``numa.nri.io/devices`` on the container itself (podman, CRI-O and containerd container
annotations). Parsing needs nothing but the text; resolving a name needs the machine's
resources (``EngineContext.devices`` and ``device_classes``). Every error is an
``AnnotationError`` that names the annotation and the part of the value it could not use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from nri_numa.engine.annotations import DEVICES, DEVICES_FOR, AnnotationError
from nri_numa.engine.devices import Resource
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.safeio.bounds import MAX_ANNOTATION_VALUE, clip, quote

PCI_PREFIX = "pci/"  # + vendor:device, four lowercase hex digits each
NIC_CLASS = "nic"
# Patterns compiled (and kept) by re on first use: only a devices annotation needs them.
_NAME = r"[A-Za-z0-9][A-Za-z0-9._/:-]*"
_PCI_ID = r"pci/([0-9A-Fa-f]{4}):([0-9A-Fa-f]{4})"
MAX_COUNT = 1024  # far above any machine's devices; a larger number is a typo
_COUNT = r"[0-9]{1,9}"


def pci_resource(vendor: int, device: int) -> str:
    """The resource name of PCI functions with these ids: ``pci/15b3:1021``."""
    return f"{PCI_PREFIX}{vendor:04x}:{device:04x}"


def parse_devices(value: str, annotation: str) -> dict[str, int]:
    """``"nvidia.com/gpu=2, nic=1"`` → ``{"nvidia.com/gpu": 2, "nic": 1}``; empty for a blank
    value. ``pci/`` ids are lowercased, so ``pci/15B3:1021`` and ``pci/15b3:1021`` are one."""
    if not isinstance(value, str):
        raise AnnotationError(f"annotation {annotation}: the value must be a string, "
                              f"not {quote(value)}")
    annotation = clip(annotation, 80)
    if len(value) > MAX_ANNOTATION_VALUE:
        raise AnnotationError(f"annotation {annotation}: the value {quote(value)} is longer "
                              f"than {MAX_ANNOTATION_VALUE} characters")
    counts: dict[str, int] = {}
    if not value.strip():
        return counts
    for item in value.split(","):
        name, sep, count = (part.strip() for part in item.partition("="))
        # ASCII digits, few of them: isdigit() takes "²" and "١", which int() refuses or
        # reads, and a thousand digits are a typo that int() would be slow to convert.
        if (not sep or not re.fullmatch(_NAME, name) or not re.fullmatch(_COUNT, count)
                or int(count) == 0):
            raise AnnotationError(
                f'annotation {annotation}: "{clip(item.strip())}" is not resource=count (a '
                "positive count), e.g. nvidia.com/gpu=2, nic=1 or pci/15b3:1021=1")
        if int(count) > MAX_COUNT:
            raise AnnotationError(f"annotation {annotation}: {clip(name)}={count} asks for more "
                                  f"than {MAX_COUNT} devices")
        if name.lower().startswith(PCI_PREFIX):
            if not re.fullmatch(_PCI_ID, name.lower()):
                raise AnnotationError(f'annotation {annotation}: "{clip(name)}" is not '
                                      "pci/VVVV:DDDD (PCI vendor and device ids in hex, e.g. "
                                      "pci/15b3:1021)")
            name = name.lower()
        if name in counts:
            raise AnnotationError(f"annotation {annotation}: {clip(name)} is named twice")
        counts[name] = int(count)
    return counts


def resolve_devices(asked: Mapping[str, int], resources: Mapping[str, Resource],
                    classes: Mapping[str, tuple[str, ...]], annotation: str) -> dict[str, int]:
    """The machine's resource names for ``asked`` (classes replaced by the resource they
    stand for). AnnotationError for a name the machine does not have."""
    out: dict[str, int] = {}
    for name, count in asked.items():
        resource = _resolve(name, resources, classes, annotation)
        if resource in out:
            raise AnnotationError(f"annotation {annotation}: {clip(name)} and another name both "
                                  f"mean {resource}; name it once")
        out[resource] = count
    return out


def _resolve(name: str, resources: Mapping[str, Resource],
             classes: Mapping[str, tuple[str, ...]], annotation: str) -> str:
    if name in resources:
        return name
    members = classes.get(name, ())
    if len(members) == 1:
        return members[0]
    if len(members) > 1:
        raise AnnotationError(f"annotation {annotation}: {clip(name)} is ambiguous on this node, "
                              f"which has {len(members)} kinds: {', '.join(members)}; name one of "
                              "them")
    offered = sorted({*resources, *(c for c, m in classes.items() if m)})
    raise AnnotationError(f"annotation {annotation}: {clip(name)} is not a device resource of this "
                          f"node (it has: {', '.join(offered) or 'none'})")


def pod_devices_for(annotations: Mapping[str, str], container: str) -> dict[str, int]:
    """What the pod's ``numa.nri.io/devices.<container>`` asks for, names unresolved."""
    key = DEVICES_FOR + container
    return parse_devices(annotations[key], key) if key in annotations else {}


def container_devices(annotations: Mapping[str, str]) -> dict[str, int]:
    """What a container's own ``numa.nri.io/devices`` asks for, names unresolved."""
    return parse_devices(annotations[DEVICES], DEVICES) if DEVICES in annotations else {}


def with_annotated_devices(pod: PodRequest, resources: Mapping[str, Resource],
                           classes: Mapping[str, tuple[str, ...]]) -> PodRequest:
    """``pod`` with each container's ``numa.nri.io/devices.<name>`` added to its devices.

    A resource the container already asks for (in its limits, or by its own annotation) must
    be asked for with the same count: two different counts are an error, not a sum.
    """
    if not any(k.startswith(DEVICES_FOR) for k in pod.annotations):
        return pod

    def annotated(c: ContainerRequest) -> ContainerRequest:
        key = DEVICES_FOR + c.name
        asked = resolve_devices(pod_devices_for(pod.annotations, c.name), resources, classes, key)
        if not asked:
            return c
        devices = dict(c.devices)
        for name, count in asked.items():
            if devices.get(name, count) != count:
                raise AnnotationError(f"annotation {key}: asks for {count} {name} but the "
                                      f"container already asks for {devices[name]}")
            devices[name] = count
        return replace(c, devices=devices)

    return replace(pod, init_containers=tuple(annotated(c) for c in pod.init_containers),
                   app_containers=tuple(annotated(c) for c in pod.app_containers))

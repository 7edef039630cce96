"""A pod's *shape*: everything of a PodRequest the engine's admission reads, and nothing else.

The extender asks the same question of every node for every pod, and a stream of pods is
mostly replicas (a Deployment's pods differ in name and uid only). ``admit`` reads a pod's uid
only to find what the pod already holds on the node and to name its new entries; for a pod the
node's allocations do not hold (the verbs check that first), nothing is found under any uid,
so the decision is a function of the shape, up to the uid it carries (``Decision.pod``). The
name and namespace are not read at all, and of the annotations only those under
``numa.nri.io/`` are (policy and scope overrides, devices, isolated CPUs), less the extender's own
``retry-for-room``, which admission accepts and ignores.

The key is built from the dataclass fields, so a field added to ContainerRequest or PodRequest
is part of the shape without anyone remembering to add it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import fields
from typing import Any

from nri_numa.engine.annotations import PREFIX, RETRY_FOR_ROOM
from nri_numa.engine.request import ContainerRequest, PodRequest

_IDENTITY = frozenset({"uid", "name", "namespace"})  # what tells replicas apart


def pod_shape(pod: PodRequest) -> Hashable:
    """A hashable key equal for two pods exactly when admission cannot tell them apart (but
    for their identity)."""
    parts: list[Any] = []
    for f in fields(pod):
        if f.name in _IDENTITY:
            continue
        value = getattr(pod, f.name)
        if f.name == "annotations":
            value = tuple(sorted((k, v) for k, v in value.items()
                                 if k.startswith(PREFIX) and k != RETRY_FOR_ROOM))
        elif f.name in ("init_containers", "app_containers"):
            value = tuple(_container_shape(c) for c in value)
        parts.append(_hashable(value))
    return tuple(parts)


def _container_shape(container: ContainerRequest) -> tuple:
    return tuple(_hashable(getattr(container, f.name)) for f in fields(container))


def _hashable(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(value))
    return value

"""Memory resources as the Memory Manager sees them: names and requested bytes.

The manager handles regular memory (``memory``) and one resource per hugepage size, named as
Kubernetes names it (``request.hugepage_resource_name``: 2048 KiB pages → ``hugepages-2Mi``,
1048576 KiB → ``hugepages-1Gi``). Quantities are plain ``int`` bytes everywhere. The pod-level
request (init containers, sidecars and apps, §5.1) is ``request.pod_memory_requests``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nri_numa.engine.quantity import MAX_INT64
from nri_numa.engine.request import HUGEPAGES_PREFIX, MEMORY, hugepage_resource_name

__all__ = ["MEMORY", "InitContainer", "MemoryRequestError", "hugepage_resource_name",
           "is_memory_resource", "requested_resources"]


class MemoryRequestError(ValueError):
    """A memory request the Memory Manager cannot represent."""


@dataclass(frozen=True, slots=True)
class InitContainer:
    """An init container of the pod, in spec order; restartable ones are sidecars."""

    name: str
    restartable: bool = False


def is_memory_resource(name: str) -> bool:
    """True for the resources this manager places: ``memory`` and every hugepage size."""
    return name == MEMORY or (name.startswith(HUGEPAGES_PREFIX) and name != HUGEPAGES_PREFIX)


def requested_resources(requests: Mapping[str, int]) -> dict[str, int]:
    """The memory resources among a container's requests, checked; other resources dropped."""
    out: dict[str, int] = {}
    for name, quantity in requests.items():
        if not is_memory_resource(name):
            continue
        if isinstance(quantity, bool) or not isinstance(quantity, int):
            raise MemoryRequestError(f"request for {name} must be an integer number of bytes, "
                                     f"not {quantity!r}")
        if quantity < 0:
            raise MemoryRequestError(f"request for {name} is negative ({quantity})")
        if quantity > MAX_INT64:
            # Go's Quantity.AsInt64 fails here, and the kubelet refuses the container
            raise MemoryRequestError("[memorymanager] failed to represent quantity as int64")
        out[name] = quantity
    return out

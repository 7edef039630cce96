"""Which devices a container gets: the kubelet Device Manager's devicesToAllocate (§6).

In the kubelet's order:

1. A container that already holds devices of the resource keeps them; a different count is an
   error (the request changed). A resource no plugin registered, one with no healthy device, or
   held devices that turned unhealthy are errors, checked even when nothing is needed.
2. Reusable devices (this pod's finished init containers') are taken first.
3. Fewer available devices than still needed is an error.
4. The available devices split by the container's NUMA affinity (the topology manager's hint):
   *aligned* (some NUMA node in the hint), *unaligned* (NUMA nodes, none in the hint) and
   *no-affinity* (no NUMA node; every device, when the hint is None or the resource has no
   topology at all).
5. If the aligned devices are more than enough, the chooser picks among them (it sees the
   aligned devices plus those already taken, must keep those already taken, and is asked for the
   whole request); its picks inside the aligned set are taken, then any aligned devices.
   Otherwise all aligned devices are taken, the chooser picks among every available device, and
   the rest comes from its picks, then the unaligned, then the no-affinity devices.

The chooser stands in for the device plugin's GetPreferredAllocation: ``lowest_ids`` by default,
``gpu_select.gpu_chooser`` for GPUs, ``nic_select.nic_chooser`` for NICs, or None for a plugin
without preferences. Where the kubelet takes devices in Go map order, they are taken here in
``device_id_key`` order, and a chooser's picks in the order it gave them.

Errors carry the kubelet's messages word for word.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from nri_numa.engine.devices import Chooser, Resource, sorted_ids


class DeviceAllocationError(Exception):
    """The kubelet would fail this allocation; the message is the kubelet's."""


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    pod_uid: str
    container: str
    resource: str  # the resource name, nvidia.com/gpu
    count: int  # the container's limit for the resource


def lowest_ids(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The default chooser: the must-include devices, then the lowest other ids."""
    others = sorted_ids(set(available) - set(must_include))
    return [*must_include, *others[:max(0, size - len(must_include))]]


def devices_to_allocate(request: DeviceRequest, resource: Resource | None, *,
                        hint: frozenset[int] | None,
                        allocated_to_others: Collection[str] = frozenset(),
                        allocated_here: Collection[str] = frozenset(),
                        reusable: Collection[str] = frozenset(),
                        chooser: Chooser | None = lowest_ids) -> tuple[str, ...]:
    """The devices to hand to the container now, in the order they were picked.

    ``resource`` is None when no plugin registered ``request.resource``. ``hint`` is the NUMA
    affinity the topology manager gave the container (None: no affinity).
    ``allocated_to_others``: ids held by other containers (this pod's init containers included).
    ``allocated_here``: ids the container already holds. ``reusable``: ids of this pod's
    finished init containers. An empty answer means nothing new to allocate.
    """
    if request.count < 0:
        raise ValueError(f"resource {request.resource}: cannot request {request.count} devices")
    if resource is not None and resource.name != request.resource:
        raise ValueError(f"asked for {request.resource} but given the devices of {resource.name}")
    held = frozenset(allocated_here)
    needed = request.count - len(held) if held else request.count
    if held and needed != 0:
        raise DeviceAllocationError(
            f"pod {_quote(request.pod_uid)} container {_quote(request.container)} changed "
            f"request for resource {_quote(request.resource)} from {len(held)} to {request.count}")
    _check_registered_and_healthy(request.resource, resource, held)
    if needed == 0:
        return ()
    assert resource is not None  # _check_registered_and_healthy raised otherwise
    picker = _Picker(needed)
    if picker.take(sorted_ids(reusable)):
        return picker.result()
    available = resource.healthy_ids - frozenset(allocated_to_others) - picker.taken_set
    if len(available) < picker.needed:
        raise DeviceAllocationError(
            f"requested number of devices unavailable for {request.resource}. "
            f"Requested: {picker.needed}, Available: {len(available)}")
    aligned, unaligned, no_affinity = split_by_affinity(resource, available, hint)
    if picker.needed < len(aligned):
        preferred = _ask(chooser, aligned | picker.taken_set, picker.taken, request.count)
        if picker.take(d for d in preferred if d in aligned) or picker.take(sorted_ids(aligned)):
            return picker.result()
        raise _short(request.count, picker.needed)
    if picker.take(sorted_ids(aligned)):
        return picker.result()
    preferred = _ask(chooser, available | picker.taken_set, picker.taken, request.count)
    if (picker.take(d for d in preferred if d in available)
            or picker.take(sorted_ids(unaligned)) or picker.take(sorted_ids(no_affinity))):
        return picker.result()
    raise _short(request.count, picker.needed)


def split_by_affinity(resource: Resource, available: Iterable[str],
                      hint: frozenset[int] | None) -> tuple[set[str], set[str], set[str]]:
    """(aligned, unaligned, no-affinity) devices of ``available`` for a container's hint.

    The kubelet visits NUMA nodes hint nodes first and files each device under the first node
    it has, so a device lands in *aligned* as soon as any of its nodes is in the hint.
    """
    if hint is None or not resource.has_topology:
        return set(), set(), set(available)
    aligned, unaligned, no_affinity = set(), set(), set()
    for device in available:
        nodes = resource.numa_nodes_of(device)
        if not nodes:
            no_affinity.add(device)
        elif nodes & hint:
            aligned.add(device)
        else:
            unaligned.add(device)
    return aligned, unaligned, no_affinity


def _check_registered_and_healthy(name: str, resource: Resource | None,
                                  held: frozenset[str]) -> None:
    if resource is None:
        raise DeviceAllocationError(f"cannot allocate unregistered device {name}")
    healthy = resource.healthy_ids
    if not healthy:
        raise DeviceAllocationError(
            f"no healthy devices present; cannot allocate unhealthy devices {name}")
    if not held <= healthy:
        raise DeviceAllocationError("previously allocated devices are no longer healthy; "
                                    f"cannot allocate unhealthy devices {name}")


class _Picker:
    """The kubelet's allocateRemainingFrom: take devices not yet taken until none is needed."""

    def __init__(self, needed: int):
        self.needed = needed
        self.taken: list[str] = []
        self.taken_set: set[str] = set()

    def take(self, devices: Iterable[str]) -> bool:
        """Take from ``devices`` in order; True once nothing more is needed."""
        for device in devices:
            if device in self.taken_set:
                continue
            self.taken.append(device)
            self.taken_set.add(device)
            self.needed -= 1
            if self.needed == 0:
                return True
        return False

    def result(self) -> tuple[str, ...]:
        return tuple(self.taken)


def _ask(chooser: Chooser | None, available: Iterable[str], must_include: Sequence[str],
         size: int) -> Sequence[str]:
    if chooser is None:
        return ()
    return chooser(sorted_ids(available), list(must_include), size)


def _short(required: int, still_needed: int) -> DeviceAllocationError:
    return DeviceAllocationError("unexpectedly allocated less resources than required. "
                                 f"Requested: {required}, Got: {required - still_needed}")


def _quote(text: str) -> str:
    """Go's %q for the strings that occur here (ids and names): a double-quoted literal."""
    return json.dumps(text, ensure_ascii=False)

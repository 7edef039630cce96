"""devicesToAllocate, table-driven from the facts of kubernetes/kubernetes
pkg/kubelet/cm/devicemanager topology_hints_test.go (TestTopologyAlignedAllocation,
TestGetPreferredAllocationParameters) and manager_test.go (TestPodContainerDeviceToAllocate),
plus the GPU and NIC choosers wired in."""

from __future__ import annotations

from collections import Counter

import pytest
from device_boxes import dgx_h100, indices, nvlink_pairs

from nri_numa.engine.devices import Device, Resource
from nri_numa.engine.devices.allocate import (DeviceAllocationError, DeviceRequest,
                                              devices_to_allocate, lowest_ids,
                                              split_by_affinity)
from nri_numa.engine.devices.gpu_select import gpu_chooser
from nri_numa.engine.devices.nic_select import nic_chooser


def numa(*pairs: tuple[str, int | None]) -> Resource:
    return Resource("resource", tuple(Device(i, frozenset() if n is None else {n})
                                      for i, n in pairs))


def spread(count: int, nodes: list[int], first: int = 0) -> list[tuple[str, int]]:
    """``count`` devices Dev<first>.. with NUMA nodes cycling through ``nodes``."""
    return [(f"Dev{first + i}", nodes[i % len(nodes)]) for i in range(count)]


def fixed(ids: list[str]):
    """A chooser that answers with ``ids`` whatever it is asked (like the upstream mocks)."""
    return lambda available, must_include, size: list(ids)


def request(count: int, resource: str = "resource") -> DeviceRequest:
    return DeviceRequest(pod_uid="podUID", container="containerName", resource=resource,
                         count=count)


def alignment(resource: Resource, devices) -> dict[int, int]:
    """Devices per (first) NUMA node, as the upstream test counts them."""
    if not resource.has_topology:
        return {}
    return dict(Counter(min(resource.numa_nodes_of(d)) for d in devices
                        if resource.numa_nodes_of(d)))


HUNDRED_EACH = [(f"Dev{i}", 0) for i in range(100)] + [(f"Dev{i}", 1) for i in range(100, 200)]
THREE_AND_97 = [(f"Dev{i}", 0) for i in range(3)] + [(f"Dev{i}", 1) for i in range(3, 100)]

# (description, devices, request, hint, chooser, must be in the answer, expected alignment)
ALIGNED_CASES = [
    ("Single Request, no alignment", [("Dev1", None), ("Dev2", None)], 1, {0, 1}, None, [], {}),
    ("Request for 1, partial alignment", [("Dev1", None), ("Dev2", 1)], 1, {1}, None, [],
     {1: 1}),
    ("Single Request, socket 0", spread(2, [0, 1], 1), 1, {0}, None, [], {0: 1}),
    ("Single Request, socket 1", spread(2, [0, 1], 1), 1, {1}, None, [], {1: 1}),
    ("Request for 2, socket 0", spread(4, [0, 1], 1), 2, {0}, None, [], {0: 2}),
    ("Request for 2, socket 1", spread(4, [0, 1], 1), 2, {1}, None, [], {1: 2}),
    ("Request for 4, unsatisfiable, prefer socket 0", spread(6, [0, 1], 1), 4, {0}, None, [],
     {0: 3, 1: 1}),
    ("Request for 4, unsatisfiable, prefer socket 1", spread(6, [0, 1], 1), 4, {1}, None, [],
     {0: 1, 1: 3}),
    ("Request for 4, multisocket", spread(8, [0, 1, 2, 3], 1), 4, {1, 3}, None, [],
     {1: 2, 3: 2}),
    ("Request for 5, socket 0, preferred aligned accepted", HUNDRED_EACH, 5, {0},
     fixed(["Dev0", "Dev19", "Dev83", "Dev42", "Dev77"]),
     ["Dev0", "Dev19", "Dev83", "Dev42", "Dev77"], {0: 5}),
    ("Request for 5, socket 0, preferred aligned accepted, unaligned ignored", HUNDRED_EACH, 5,
     {0}, fixed(["Dev0", "Dev19", "Dev83", "Dev150", "Dev186"]), ["Dev0", "Dev19", "Dev83"],
     {0: 5}),
    ("Request for 5, socket 1, preferred aligned accepted, bogus ignored",
     [(f"Dev{i}", 1) for i in range(100)], 5, {1},
     fixed(["Dev0", "Dev19", "Dev83", "bogus0", "bogus1"]), ["Dev0", "Dev19", "Dev83"], {1: 5}),
    ("Request for 5, multisocket, preferred accepted", THREE_AND_97, 5, {0},
     fixed(["Dev0", "Dev1", "Dev2", "Dev42", "Dev83"]), ["Dev0", "Dev1", "Dev2", "Dev42", "Dev83"],
     {0: 3, 1: 2}),
    ("Request for 5, multisocket, preferred unaligned accepted, bogus ignored", THREE_AND_97, 5,
     {0}, fixed(["Dev0", "Dev1", "Dev2", "Dev42", "bogus0"]), ["Dev0", "Dev1", "Dev2", "Dev42"],
     {0: 3, 1: 2}),
]


@pytest.mark.parametrize("description,devices,count,hint,chooser,included,expected",
                         ALIGNED_CASES, ids=[c[0] for c in ALIGNED_CASES])
def test_topology_aligned_allocation(description, devices, count, hint, chooser, included,
                                     expected):
    resource = numa(*devices)
    got = devices_to_allocate(request(count), resource, hint=frozenset(hint), chooser=chooser)
    assert len(got) == len(set(got)) == count
    assert set(included) <= set(got)
    assert alignment(resource, got) == expected


def test_picks_are_deterministic_lowest_ids_by_number():
    resource = numa(*spread(12, [0, 1]))
    got = devices_to_allocate(request(3), resource, hint=frozenset({0}), chooser=None)
    assert got == ("Dev0", "Dev2", "Dev4")
    got = devices_to_allocate(request(7), resource, hint=frozenset({1}), chooser=None)
    # all six of node 1 first, then the lowest unaligned one
    assert got == ("Dev1", "Dev3", "Dev5", "Dev7", "Dev9", "Dev11", "Dev0")


def test_chooser_picks_are_taken_in_the_chooser_order():
    resource = numa(*spread(6, [0]))
    got = devices_to_allocate(request(2), resource, hint=frozenset({0}),
                              chooser=fixed(["Dev5", "Dev3", "Dev1"]))
    assert got == ("Dev5", "Dev3")


# --- what the chooser is asked (upstream TestGetPreferredAllocationParameters) ----------------

SAME_NODE = spread(8, [0])
TWO_NODES = spread(4, [0]) + spread(4, [1], 4)

# (description, devices, request, allocated to others, reusable, available, must, size)
CHOOSER_CASES = [
    ("Request for 1, socket 0, 0 already allocated, 0 reusable", spread(4, [0]), 1, [], [],
     ["Dev0", "Dev1", "Dev2", "Dev3"], [], 1),
    ("Request for 4, socket 0, 2 already allocated, 2 reusable", SAME_NODE, 4,
     ["Dev0", "Dev5"], ["Dev0", "Dev5"], [f"Dev{i}" for i in range(8)], ["Dev0", "Dev5"], 4),
    ("Request for 4, socket 0, 4 already allocated, 2 reusable", SAME_NODE, 4,
     ["Dev0", "Dev5", "Dev4", "Dev1"], ["Dev0", "Dev5"],
     ["Dev0", "Dev2", "Dev3", "Dev5", "Dev6", "Dev7"], ["Dev0", "Dev5"], 4),
    ("Request for 6, multisocket, 2 already allocated, 2 reusable", TWO_NODES, 6,
     ["Dev1", "Dev6"], ["Dev1", "Dev6"], [f"Dev{i}" for i in range(8)],
     ["Dev1", "Dev6", "Dev0", "Dev2", "Dev3"], 6),
    ("Request for 6, multisocket, 4 already allocated, 2 reusable", TWO_NODES, 6,
     ["Dev0", "Dev1", "Dev6", "Dev7"], ["Dev1", "Dev6"],
     ["Dev1", "Dev2", "Dev3", "Dev4", "Dev5", "Dev6"], ["Dev1", "Dev6", "Dev2", "Dev3"], 6),
]


@pytest.mark.parametrize("description,devices,count,others,reusable,available,must,size",
                         CHOOSER_CASES, ids=[c[0] for c in CHOOSER_CASES])
def test_what_the_chooser_is_asked(description, devices, count, others, reusable, available,
                                   must, size):
    asked = []

    def recording(available_ids, must_include, wanted):
        asked.append((list(available_ids), list(must_include), wanted))
        return []

    got = devices_to_allocate(request(count), numa(*devices), hint=frozenset({0}),
                              allocated_to_others=set(others), reusable=set(reusable),
                              chooser=recording)
    assert asked == [(available, must, size)]
    assert len(got) == count


def test_reusable_devices_alone_need_no_chooser():
    def never(*_):
        raise AssertionError("the chooser must not be asked")

    got = devices_to_allocate(request(2), numa(*spread(4, [0, 1])), hint=frozenset({1}),
                              allocated_to_others={"Dev0", "Dev2"}, reusable={"Dev2", "Dev0"},
                              chooser=never)
    assert got == ("Dev0", "Dev2")


def test_no_hint_makes_every_device_no_affinity():
    resource = numa(*spread(4, [0, 1]))
    assert split_by_affinity(resource, ["Dev0", "Dev1"], None) == (set(), set(), {"Dev0", "Dev1"})
    got = devices_to_allocate(request(2), resource, hint=None, chooser=fixed(["Dev3", "Dev1"]))
    assert got == ("Dev3", "Dev1")


def test_split_by_affinity():
    resource = Resource("r", (Device("a", {0}), Device("b", {1}), Device("c", {0, 1}),
                              Device("d"), Device("e", {2})))
    assert split_by_affinity(resource, "abcde", frozenset({1})) == ({"b", "c"}, {"a", "e"}, {"d"})
    assert split_by_affinity(resource, "abcde", frozenset({0, 2})) == (
        {"a", "c", "e"}, {"b"}, {"d"})


def test_container_that_already_holds_its_devices_gets_nothing_new():
    got = devices_to_allocate(request(2), numa(*spread(4, [0])), hint=frozenset({0}),
                              allocated_here={"Dev1", "Dev2"},
                              allocated_to_others={"Dev1", "Dev2"})
    assert got == ()


def test_default_chooser():
    assert lowest_ids(["Dev10", "Dev2", "Dev1"], [], 2) == ["Dev1", "Dev2"]
    assert lowest_ids(["Dev10", "Dev2", "Dev1"], ["Dev10"], 2) == ["Dev10", "Dev1"]


# --- errors, in the kubelet's words (upstream TestPodContainerDeviceToAllocate et al.) ----------

def test_unregistered_resource():
    with pytest.raises(DeviceAllocationError) as e:
        devices_to_allocate(request(1, "domain2.com/resource2"), None, hint=None)
    assert str(e.value) == "cannot allocate unregistered device domain2.com/resource2"


def test_no_healthy_devices_even_when_nothing_is_needed():
    resource = Resource("domain1.com/resource1", (Device("dev1", healthy=False),
                                                  Device("dev2", healthy=False)))
    with pytest.raises(DeviceAllocationError) as e:
        devices_to_allocate(request(2, "domain1.com/resource1"), resource, hint=None,
                            allocated_here={"dev1", "dev2"})
    assert str(e.value) == ("no healthy devices present; cannot allocate unhealthy devices "
                            "domain1.com/resource1")


def test_previously_allocated_device_no_longer_healthy():
    resource = Resource("domain2.com/resource3", (Device("dev5", healthy=False), Device("dev7"),
                                                  Device("dev8")))
    with pytest.raises(DeviceAllocationError) as e:
        devices_to_allocate(request(1, "domain2.com/resource3"), resource, hint=None,
                            allocated_here={"dev5"})
    assert str(e.value) == ("previously allocated devices are no longer healthy; cannot "
                            "allocate unhealthy devices domain2.com/resource3")


def test_changed_request():
    with pytest.raises(DeviceAllocationError) as e:
        devices_to_allocate(request(3), numa(*spread(4, [0])), hint=None,
                            allocated_here={"Dev0", "Dev1"})
    assert str(e.value) == ('pod "podUID" container "containerName" changed request for '
                            'resource "resource" from 2 to 3')


def test_not_enough_available():
    with pytest.raises(DeviceAllocationError) as e:
        devices_to_allocate(request(3), numa(*spread(4, [0])), hint=frozenset({0}),
                            allocated_to_others={"Dev0", "Dev1", "Dev2"}, reusable={"Dev2"})
    assert str(e.value) == ("requested number of devices unavailable for resource. "
                            "Requested: 2, Available: 1")


def test_bad_arguments():
    with pytest.raises(ValueError, match="cannot request -1 devices"):
        devices_to_allocate(request(-1), numa(("Dev0", 0)), hint=None)
    with pytest.raises(ValueError, match="given the devices of other"):
        devices_to_allocate(request(1), Resource("other", (Device("x"),)), hint=None)


# --- the choosers wired in ----------------------------------------------------------------------

def test_gpu_chooser_inside_the_aligned_set():
    t = nvlink_pairs()
    resource = Resource("nvidia.com/gpu", tuple(Device(g.uuid, {g.numa_node}) for g in t.gpus))
    got = devices_to_allocate(request(2, "nvidia.com/gpu"), resource, hint=frozenset({0}),
                              chooser=gpu_chooser(t))
    assert got == (t.gpus[0].uuid, t.gpus[1].uuid)  # the 4-NVLink pair
    got = devices_to_allocate(request(2, "nvidia.com/gpu"), resource, hint=frozenset({0}),
                              allocated_to_others={t.gpus[0].uuid}, chooser=gpu_chooser(t))
    assert got == (t.gpus[2].uuid, t.gpus[3].uuid)  # not 1-2, which would strand 3


def test_gpu_then_nic_on_dgx_h100():
    t = dgx_h100()
    gpus = Resource("nvidia.com/gpu", tuple(Device(g.uuid, {g.numa_node}) for g in t.gpus))
    got_gpus = devices_to_allocate(request(2, "nvidia.com/gpu"), gpus, hint=frozenset({1}),
                                   allocated_to_others={t.gpus[4].uuid}, chooser=gpu_chooser(t))
    assert indices(t, [next(g.pci_address for g in t.gpus if g.uuid == u)
                       for u in got_gpus]) == [5, 6]
    nics = Resource("rdma/ib", tuple(Device(n.rdma[0], {t.pci(n.pci_address).numa_node})
                                     for n in t.nics))
    got_nics = devices_to_allocate(request(2, "rdma/ib"), nics, hint=frozenset({1}),
                                   chooser=nic_chooser(t, got_gpus))
    assert sorted(got_nics) == ["mlx5_5", "mlx5_6"]

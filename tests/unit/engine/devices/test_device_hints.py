"""Device Manager hints, table-driven from the facts of kubernetes/kubernetes
pkg/kubelet/cm/devicemanager/topology_hints_test.go (container and pod scope), plus cases of our
own for reusable devices, unhealthy devices and multi-node devices. Machine: NUMA nodes 0 and 1.
"""

from __future__ import annotations

import re

import pytest

from nri_numa.engine.devices import Device, Resource
from nri_numa.engine.devices.hints import device_hints, generate_hints, pod_device_hints
from nri_numa.engine.hints import Hint
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.engine.request import pod_device_requests

NODES = [0, 1]
P, N = True, False  # preferred / not preferred


def res(*devices: tuple[str, int | None] | Device, name: str = "testdevice") -> Resource:
    """Devices as (id, NUMA node or None) pairs, or Device values."""
    return Resource(name, tuple(d if isinstance(d, Device) else
                                Device(d[0], frozenset() if d[1] is None else {d[1]})
                                for d in devices))


def hints(*pairs: tuple[tuple[int, ...], bool]) -> list[Hint]:
    return [Hint(frozenset(nodes), preferred) for nodes, preferred in pairs]


FOUR = res(("Dev1", 0), ("Dev2", 1), ("Dev3", 0), ("Dev4", 1))
FOUR_PAIRED = res(("Dev1", 0), ("Dev2", 0), ("Dev3", 1), ("Dev4", 1))

# (description, resource, request, allocated to others, allocated here, expected)
COMMON_CASES = [
    ("Single Request, no alignment",
     res(("Dev1", None), ("Dev2", None), ("Dev3", None), ("Dev4", None)), 1, (), (), None),
    ("Single Request, only one with alignment",
     res(("Dev1", None), ("Dev2", 1)), 1, (), (), hints(((1,), P), ((0, 1), N))),
    ("Single Request, one device per socket",
     res(("Dev1", 0), ("Dev2", 1)), 1, (), (), hints(((0,), P), ((1,), P), ((0, 1), N))),
    ("Request for 2, one device per socket",
     res(("Dev1", 0), ("Dev2", 1)), 2, (), (), hints(((0, 1), P))),
    ("Request for 2, 2 devices per socket",
     FOUR, 2, (), (), hints(((0,), P), ((1,), P), ((0, 1), N))),
    ("Request for 2, optimal on 1 NUMA node, forced cross-NUMA",
     FOUR, 2, ("Dev1", "Dev2"), (), hints(((0, 1), N))),
    ("Single device type, more requested than available", FOUR_PAIRED, 6, (), (), []),
    ("Single device type, all already allocated to container",
     res(("Dev1", 0), ("Dev2", 0)), 2, (), ("Dev1", "Dev2"), hints(((0,), P), ((0, 1), N))),
    ("Single device type, less already allocated to container than requested",
     FOUR_PAIRED, 4, (), ("Dev1", "Dev2"), []),
    ("Single device type, more already allocated to container than requested",
     FOUR_PAIRED, 2, (), ("Dev1", "Dev2", "Dev3", "Dev4"), []),
]


@pytest.mark.parametrize("description,resource,count,others,here,expected", COMMON_CASES,
                         ids=[c[0] for c in COMMON_CASES])
def test_container_hints(description, resource, count, others, here, expected):
    got = device_hints(resource, count, NODES, allocated_to_others={*others, *here},
                       allocated_here=here)
    assert got == expected


@pytest.mark.parametrize("description,resource,count,others,here,expected", COMMON_CASES,
                         ids=[c[0] for c in COMMON_CASES])
def test_pod_hints_on_the_common_cases(description, resource, count, others, here, expected):
    # Pod scope sees the devices of every container of the pod: in the upstream cases every
    # allocation belongs to the pod ("forced cross-NUMA": another container of it), so the pod
    # regenerates from them.
    got = pod_device_hints(resource, count, NODES, allocated_to_others={*others, *here},
                           allocated_to_pod={*others, *here})
    assert got == expected


def test_mixed_configuration_two_resources():
    # upstream "2 device types, mixed configuration": one answer per resource
    second = res(("Dev1", 0), name="testdevice2")
    assert device_hints(FOUR, 2, NODES) == hints(((0,), P), ((1,), P), ((0, 1), N))
    assert device_hints(second, 1, NODES) == hints(((0,), P), ((0, 1), N))


# Pod scope (upstream getPodScopeTestCases). The pod's request per resource is
# max(max over init containers, sum over app containers), computed here by hand:
POD_CASES = [
    # two app containers asking 2 of testdevice1 and 2 of testdevice2 (one resource each)
    ("user container only", FOUR_PAIRED, 2, (), hints(((0,), P), ((1,), P), ((0, 1), N))),
    # init 1,1 / 1,2 and apps 1+1, 1+1: testdevice1 = max(1, 2) = 2, testdevice2 = max(2, 2) = 2
    ("init containers and user containers", FOUR_PAIRED, 2, (),
     hints(((0,), P), ((1,), P), ((0, 1), N))),
    # another pod holds Dev1 and Dev3: one free device per node
    ("optimal on 1 NUMA node, forced cross-NUMA", FOUR_PAIRED, 2, ("Dev1", "Dev3"),
     hints(((0, 1), N))),
]


@pytest.mark.parametrize("description,resource,count,others,expected", POD_CASES,
                         ids=[c[0] for c in POD_CASES])
def test_pod_hints(description, resource, count, others, expected):
    for name in ("testdevice1", "testdevice2"):
        renamed = Resource(name, resource.devices)
        assert pod_device_hints(renamed, count, NODES, allocated_to_others=others) == expected


GPU, NIC = "example.com/gpu", "example.com/nic"


def _pod(init_limits: list[dict[str, int]], app_limits: list[dict[str, int]]):
    def containers(prefix, limits):
        return [{"name": f"{prefix}{k}", "resources": {"limits": {r: str(n) for r, n in l.items()}}}
                for k, l in enumerate(limits)]
    return pod_from_manifest({"metadata": {"name": "p"}, "spec": {
        "initContainers": containers("init", init_limits),
        "containers": containers("app", app_limits or [{}])}})


@pytest.mark.parametrize("inits,apps,expected", [
    # upstream TestGetPodDeviceRequest: max(max over init containers, sum over app containers)
    ([{GPU: 2}], [], {GPU: 2}),
    ([{GPU: 2}, {GPU: 4}], [], {GPU: 4}),
    ([], [{GPU: 2}], {GPU: 2}),
    ([{GPU: 2, NIC: 2}, {GPU: 2, NIC: 2}], [{GPU: 1, NIC: 1}, {GPU: 1, NIC: 1}],
     {GPU: 2, NIC: 2}),
    ([{GPU: 2, NIC: 1}, {GPU: 3, NIC: 2}], [{GPU: 1, NIC: 1}, {GPU: 1}], {GPU: 3, NIC: 2}),
    ([{GPU: 2, NIC: 1}, {GPU: 2, NIC: 1}], [{GPU: 3, NIC: 2}, {GPU: 3, NIC: 2}],
     {GPU: 6, NIC: 4}),
    # the pod-scope hint cases above: testdevice1 = max(1, 1 + 1), testdevice2 = max(2, 1 + 1)
    ([{GPU: 1, NIC: 1}, {GPU: 1, NIC: 2}], [{GPU: 1, NIC: 1}, {GPU: 1, NIC: 1}],
     {GPU: 2, NIC: 2}),
])
def test_pod_request_the_pod_hints_are_asked_for(inits, apps, expected):
    assert pod_device_requests(_pod(inits, apps)) == expected


def test_pod_hints_regenerate_from_the_pods_devices():
    # the pod already holds one device per node: hints come from exactly those
    got = pod_device_hints(FOUR_PAIRED, 2, NODES, allocated_to_others={"Dev1", "Dev3"},
                           allocated_to_pod={"Dev1", "Dev3"})
    assert got == hints(((0, 1), N))


# --- our own cases: reusable, unhealthy, multi-node, several nodes ---------------------------

def test_reusable_device_rules_out_masks_without_its_node():
    # Dev1 (node 0) is reusable; Dev3 (node 0) and Dev2 (node 1) are free
    got = device_hints(FOUR, 2, NODES, allocated_to_others={"Dev1", "Dev4"}, reusable={"Dev1"})
    assert got == hints(((0,), P), ((0, 1), N))


def test_reusable_devices_count_towards_the_request():
    # nothing free at all, but the two reusable devices of node 1 cover the request
    got = device_hints(FOUR, 2, NODES, allocated_to_others={"Dev1", "Dev2", "Dev3", "Dev4"},
                       reusable={"Dev2", "Dev4"})
    assert got == hints(((1,), P), ((0, 1), N))


def test_reusable_device_without_topology_counts_only_for_availability():
    # the kubelet counts it when checking there are enough devices, then skips it per mask:
    # with nothing else free no mask holds the request
    resource = res(("Dev1", 0), ("DevX", None))
    got = device_hints(resource, 1, NODES, allocated_to_others={"Dev1", "DevX"},
                       reusable={"DevX"})
    assert got == []


def test_unhealthy_devices_are_not_available_but_count_for_preference():
    resource = res(Device("Dev1", {0}, healthy=False), ("Dev2", 0), ("Dev3", 1), ("Dev4", 1))
    # node 0 could hold 2 devices on a healthy machine, so only 1-node masks are preferred;
    # with Dev1 unhealthy only node 1 actually fits
    assert device_hints(resource, 2, NODES) == hints(((1,), P), ((0, 1), N))


def test_device_on_two_nodes_touches_both():
    resource = res(Device("Dev1", {0, 1}), ("Dev2", 1))
    assert device_hints(resource, 2, NODES) == hints(((1,), P), ((0, 1), N))
    assert device_hints(resource, 1, NODES) == hints(((0,), P), ((1,), P), ((0, 1), N))


def test_four_nodes_in_kubelet_mask_order():
    resource = res(("Dev1", 0), ("Dev2", 1), ("Dev3", 2), ("Dev4", 3), ("Dev5", 3))
    got = device_hints(resource, 2, [0, 1, 2, 3], allocated_to_others={"Dev4"})
    # node 3 could hold both on an empty machine, so only 1-node masks would be preferred; but
    # only Dev5 is free there: every fitting mask has 2+ nodes, none preferred, mask order kept
    expected = [((0, 1), N), ((0, 2), N), ((0, 3), N), ((1, 2), N), ((1, 3), N), ((2, 3), N)]
    expected += [((0, 1, 2), N), ((0, 1, 3), N), ((0, 2, 3), N), ((1, 2, 3), N),
                 ((0, 1, 2, 3), N)]
    assert got == [Hint(frozenset(n), p) for n, p in expected]


def test_request_of_zero_fits_everywhere():
    assert device_hints(FOUR, 0, NODES) == hints(((0,), P), ((1,), P), ((0, 1), N))


def test_negative_request_is_an_error():
    with pytest.raises(ValueError, match="cannot request -1 devices"):
        device_hints(FOUR, -1, NODES)


def test_generate_hints_treats_unknown_ids_as_devices_without_topology():
    assert generate_hints(FOUR, {"Dev1", "ghost"}, set(), 2, NODES) == []
    assert generate_hints(FOUR, {"Dev1", "Dev3", "ghost"}, set(), 2, NODES) == hints(
        ((0,), P), ((0, 1), N))


@pytest.mark.parametrize("device_id,nodes,message", [
    ("Dev1", {-1}, "device Dev1: NUMA node ids must be non-negative integers, not -1"),
    ("Dev1", {0, "1"}, "device Dev1: NUMA node ids must be non-negative integers, not '1'"),
    ("Dev1", {True}, "not True"),
    ("", set(), "a device id must be a non-empty string, not ''"),
])
def test_bad_devices_are_rejected(device_id, nodes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Device(device_id, nodes)


def test_repeated_device_ids_are_rejected():
    with pytest.raises(ValueError, match="resource testdevice: device ids repeat: Dev1"):
        res(("Dev1", 0), ("Dev1", 1))

"""Devices asked for by annotation: the syntax, names resolved against the machine (NIC
resources by PCI id, the ``nic`` class), and the engine applying a pod's per-container
annotation, NICs chosen next to the GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nri_numa.engine import EngineContext, admit
from nri_numa.engine.annotations import AnnotationError
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import GPU_RESOURCE, nic_resources
from nri_numa.engine.devices.requested import (container_devices, parse_devices,
                                               pod_devices_for, resolve_devices,
                                               with_annotated_devices)
from nri_numa.engine.manifest import pod_from_manifest
from nri_numa.topology.parts import pcie_level
from nri_numa.topology.synthetic import preset_topology

CX7 = "pci/15b3:1021"
CX6DX = "pci/15b3:101d"
A = "numa.nri.io/devices.main"


def test_parse_devices():
    assert parse_devices("", A) == {}
    assert parse_devices(" nvidia.com/gpu=2 , nic=1 ", A) == {"nvidia.com/gpu": 2, "nic": 1}
    assert parse_devices("PCI/15B3:1021=1", A) == {CX7: 1}  # PCI ids are case-blind


@pytest.mark.parametrize("value, says", [
    ("nvidia.com/gpu", "is not resource=count"),
    ("nvidia.com/gpu=0", "is not resource=count"),
    ("=2", "is not resource=count"),
    ("gpu=-1", "is not resource=count"),
    ("gpu=two", "is not resource=count"),
    ("a b=1", "is not resource=count"),
    ("gpu=1,,nic=1", "is not resource=count"),
    ("gpu=1,gpu=2", "gpu is named twice"),
    ("pci/15b3=1", "is not pci/VVVV:DDDD"),
    ("pci/15b3:10211=1", "is not pci/VVVV:DDDD"),
    ("gpu=100000", "more than 1024 devices"),
])
def test_bad_values_name_the_annotation(value, says):
    with pytest.raises(AnnotationError, match=f"^annotation {A}: .*{says}"):
        parse_devices(value, A)


def test_where_each_annotation_is_read():
    pod = {"numa.nri.io/devices.main": "nic=1", "numa.nri.io/devices.side": "nvidia.com/gpu=1"}
    assert pod_devices_for(pod, "main") == {"nic": 1}
    assert pod_devices_for(pod, "other") == {}
    assert container_devices({"numa.nri.io/devices": "nvidia.com/gpu=2"}) == {GPU_RESOURCE: 2}
    assert container_devices(pod) == {}


def _ctx(preset: str, **config) -> EngineContext:
    return EngineContext.build(preset_topology(preset), config_from_mapping(
        {"topologyManagerPolicy": "single-numa-node", "cpuManagerPolicy": "static",
         "reservedSystemCPUs": "0", **config}))


def test_nics_are_resources_by_pci_id_and_address():
    ctx = _ctx("dgx-h100")
    t = ctx.topology
    assert set(ctx.devices) == {GPU_RESOURCE, CX7}
    nics = ctx.devices[CX7]
    assert {d.id for d in nics.devices} == {n.pci_address for n in t.nics}
    assert all(d.numa_nodes == {t.pci(d.id).numa_node} for d in nics.devices)
    assert ctx.device_classes == {"nic": (CX7,)}
    # A VF is not offered: intel-2s-ht's NIC has 4, only its PF is a device.
    [(name, resource)] = nic_resources(preset_topology("intel-2s-ht")).items()
    assert name == CX6DX and len(resource.devices) == 1


def test_names_resolve_against_the_machine():
    ctx = _ctx("dgx-h100")
    assert resolve_devices({"nic": 1, GPU_RESOURCE: 2}, ctx.devices, ctx.device_classes, A) == {
        CX7: 1, GPU_RESOURCE: 2}
    with pytest.raises(AnnotationError, match=f"annotation {A}: pci/8086:1593 is not a device "
                                              f"resource of this node \\(it has: nic, "
                                              f"{GPU_RESOURCE}, {CX7}\\)"):
        resolve_devices({"pci/8086:1593": 1}, ctx.devices, ctx.device_classes, A)
    with pytest.raises(AnnotationError, match="both mean pci/15b3:1021"):
        resolve_devices({"nic": 1, CX7: 1}, ctx.devices, ctx.device_classes, A)
    classes = {"nic": (CX6DX, CX7)}
    with pytest.raises(AnnotationError, match="nic is ambiguous on this node, which has 2 "
                                              f"kinds: {CX6DX}, {CX7}; name one of them"):
        resolve_devices({"nic": 1}, ctx.devices, classes, A)
    with pytest.raises(AnnotationError, match=r"not a device resource of this node \(it has: none"):
        resolve_devices({"nic": 1}, {}, {"nic": ()}, A)


def _pod(annotations: dict, cpu: str = "8", **limits) -> object:
    return pod_from_manifest({"metadata": {"name": "train", "annotations": annotations},
                              "spec": {"containers": [{"name": "main", "resources": {"limits": {
                                  "cpu": cpu, "memory": "16Gi", **limits}}}]}})


def test_a_pod_annotation_adds_to_the_container_and_must_agree_with_its_limits():
    ctx = _ctx("dgx-h100")
    pod = _pod({A: "nic=1,nvidia.com/gpu=2"}, **{GPU_RESOURCE: 2})
    [main] = with_annotated_devices(pod, ctx.devices, ctx.device_classes).app_containers
    assert main.devices == {GPU_RESOURCE: 2, CX7: 1}
    clash = _pod({A: "nvidia.com/gpu=1"}, **{GPU_RESOURCE: 2})
    with pytest.raises(AnnotationError, match="asks for 1 nvidia.com/gpu but the container "
                                              "already asks for 2"):
        with_annotated_devices(clash, ctx.devices, ctx.device_classes)
    plain = _pod({})
    assert with_annotated_devices(plain, ctx.devices, ctx.device_classes) is plain


def test_gpus_and_a_nic_on_one_node_the_nic_on_a_gpus_switch():
    ctx = _ctx("dgx-h100")
    result = admit(ctx, ctx.empty_allocations(), _pod({A: "nvidia.com/gpu=2,nic=1"}))
    [placement] = result.decision.placements
    t = ctx.topology
    gpus = [g for g in t.gpus if g.uuid in placement.devices[GPU_RESOURCE]]
    [nic] = placement.devices[CX7]
    nodes = {g.numa_node for g in gpus} | {t.pci(nic).numa_node} | ctx.nodes_of_cpus(
        placement.cpus)
    assert len(gpus) == 2 and len(nodes) == 1
    assert "single" in {pcie_level(t.pci(nic), t.pci(g.pci_address)) for g in gpus}


def test_nics_follow_the_gpus_even_when_lower_ids_are_free():
    ctx = _ctx("dgx-h100")
    allocs = ctx.empty_allocations()
    first = admit(ctx, allocs, _pod({A: "nvidia.com/gpu=2"}))
    pod = replace(_pod({A: "nvidia.com/gpu=2,nic=2"}), uid="second")
    [placement] = admit(ctx, first.allocations, pod).decision.placements
    t = ctx.topology
    lower = sorted(n.id for n in ctx.devices[CX7].devices)[:2]  # beside the first pod's GPUs
    assert not set(placement.devices[CX7]) & set(lower)
    levels = {nic: {pcie_level(t.pci(nic), t.pci(g.pci_address)) for g in t.gpus
                    if g.uuid in placement.devices[GPU_RESOURCE]} for nic in placement.devices[CX7]}
    assert all("single" in seen for seen in levels.values()), levels


def test_a_bad_annotation_refuses_the_pod_naming_it():
    ctx = _ctx("dgx-h100")
    allocs = ctx.empty_allocations()
    result = admit(ctx, allocs, _pod({A: "fpga=1"}))
    rejection = result.decision.rejection
    assert rejection.reason == "InvalidAnnotation"
    assert rejection.message.startswith(f"annotation {A}: fpga is not a device resource")
    assert result.allocations is allocs


def test_devices_that_cannot_be_aligned_are_refused_naming_them():
    ctx = _ctx("dgx-h100", topologyManagerPolicy="restricted")
    # Five GPUs: no NUMA node has more than four.
    result = admit(ctx, ctx.empty_allocations(), _pod({A: "nvidia.com/gpu=5"}))
    rejection = result.decision.rejection
    assert rejection.reason == "TopologyAffinityError"
    assert "nvidia.com/gpu: asked 5 devices" in rejection.message

"""The devices a container was given, in its NRI adjustment: device nodes (linux.devices), an
allow rule for each (linux.resources.devices) and the environment, with their wire numbers."""

from __future__ import annotations

from nri_numa.engine.decision import Placement
from nri_numa.nri import translate
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.runtime import Grant, GrantedNode

GPU = GrantedNode("/dev/nvidia3", "c", 195, 3)
UVM = GrantedNode("/dev/nvidia-uvm", "c", 508, 0)
UVERBS = GrantedNode("/dev/infiniband/uverbs1", "c", 231, 193)
PLACEMENT = Placement("app", frozenset({4, 5}), True, frozenset({0}),
                      {"nvidia.com/gpu": ("GPU-a",)})


def test_nodes_rules_and_env():
    grant = Grant((GPU, UVM, UVERBS), {"NVIDIA_VISIBLE_DEVICES": "GPU-a"})
    adjust = translate.adjustment(PLACEMENT, grant)
    assert [(d.path, d.type, d.major, d.minor, d.file_mode.value, d.uid.value, d.gid.value)
            for d in adjust.linux.devices] == [
        ("/dev/nvidia3", "c", 195, 3, 0o666, 0, 0), ("/dev/nvidia-uvm", "c", 508, 0, 0o666, 0, 0),
        ("/dev/infiniband/uverbs1", "c", 231, 193, 0o666, 0, 0)]
    rules = adjust.linux.resources.devices
    assert [(r.allow, r.type, r.major.value, r.minor.value, r.access) for r in rules] == [
        (True, "c", 195, 3, "rwm"), (True, "c", 508, 0, "rwm"), (True, "c", 231, 193, "rwm")]
    assert [(e.key, e.value) for e in adjust.env] == [("NVIDIA_VISIBLE_DEVICES", "GPU-a")]
    assert adjust.linux.resources.cpu.cpus == "4-5"  # the cpuset is still there


def test_the_wire_form_is_what_a_runtime_reads():
    adjust = translate.adjustment(PLACEMENT, Grant((GPU,), {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}))
    back = api.ContainerAdjustment.FromString(adjust.SerializeToString())
    # env(4) is a KeyValue; linux(6) → devices(1); linux(6) → resources(2) → devices(7)
    fields = {f.number for f, _ in back.ListFields()}
    assert fields == {4, 6}
    assert {f.number for f, _ in back.linux.ListFields()} == {1, 2}
    assert {f.number for f, _ in back.linux.resources.ListFields()} == {2, 7}
    assert back == adjust


def test_no_grant_no_devices():
    for grant in (None, Grant()):
        adjust = translate.adjustment(PLACEMENT, grant)
        assert not adjust.linux.devices and not adjust.linux.resources.devices and not adjust.env

"""The generated NRI schema carries the field numbers the runtime uses (docs/nri-protocol.md §3, §8)."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor

from nri_numa.nri.pb import api_pb2, ttrpc_pb2

T = FieldDescriptor
WIRE_FACTS = [
    ("RegisterPluginRequest", "plugin_name", 1, T.TYPE_STRING),
    ("RegisterPluginRequest", "plugin_idx", 2, T.TYPE_STRING),
    ("ConfigureRequest", "config", 1, T.TYPE_STRING),
    ("ConfigureRequest", "runtime_version", 3, T.TYPE_STRING),
    ("ConfigureResponse", "events", 2, T.TYPE_INT32),
    ("SynchronizeRequest", "containers", 2, T.TYPE_MESSAGE),
    ("SynchronizeResponse", "update", 1, T.TYPE_MESSAGE),
    ("SynchronizeRequest", "more", 3, T.TYPE_BOOL),  # NRI v0.8+: a split Synchronize
    ("SynchronizeResponse", "more", 2, T.TYPE_BOOL),
    ("CreateContainerResponse", "adjust", 1, T.TYPE_MESSAGE),
    ("CreateContainerResponse", "evict", 3, T.TYPE_MESSAGE),
    ("UpdateContainerRequest", "linux_resources", 3, T.TYPE_MESSAGE),
    ("UpdateContainersResponse", "failed", 1, T.TYPE_MESSAGE),
    ("StateChangeEvent", "event", 1, T.TYPE_ENUM),
    ("PodSandbox", "pid", 9, T.TYPE_UINT32),
    ("LinuxPodSandbox", "cgroup_parent", 3, T.TYPE_STRING),
    ("Container", "env", 8, T.TYPE_STRING),
    ("Container", "rlimits", 13, T.TYPE_MESSAGE),
    ("LinuxContainer", "cgroups_path", 5, T.TYPE_STRING),
    ("LinuxResources", "hugepage_limits", 3, T.TYPE_MESSAGE),
    ("LinuxResources", "devices", 7, T.TYPE_MESSAGE),
    ("LinuxCPU", "cpus", 6, T.TYPE_STRING),
    ("LinuxCPU", "mems", 7, T.TYPE_STRING),
    ("LinuxMemory", "limit", 1, T.TYPE_MESSAGE),
    ("LinuxMemory", "use_hierarchy", 8, T.TYPE_MESSAGE),
    ("HugepageLimit", "limit", 2, T.TYPE_UINT64),
    ("ContainerAdjustment", "env", 4, T.TYPE_MESSAGE),
    ("ContainerAdjustment", "linux", 6, T.TYPE_MESSAGE),
    ("ContainerAdjustment", "CDI_devices", 8, T.TYPE_MESSAGE),  # NRI v0.7+
    ("CDIDevice", "name", 1, T.TYPE_STRING),
    ("LinuxContainerAdjustment", "devices", 1, T.TYPE_MESSAGE),
    ("LinuxContainerAdjustment", "resources", 2, T.TYPE_MESSAGE),
    ("LinuxDevice", "minor", 4, T.TYPE_INT64),
    ("LinuxDevice", "file_mode", 5, T.TYPE_MESSAGE),
    ("ContainerUpdate", "ignore_failure", 3, T.TYPE_BOOL),
    ("ContainerEviction", "reason", 2, T.TYPE_STRING),
    ("OptionalFileMode", "value", 1, T.TYPE_UINT32),
]


@pytest.mark.parametrize(("message", "field", "number", "kind"), WIRE_FACTS)
def test_field_numbers_and_types(message: str, field: str, number: int, kind: int) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (descriptor.number, descriptor.type) == (number, kind)


def test_v061_has_only_the_later_fields_we_use() -> None:
    # Beyond v0.6.1: the two Synchronize "more" flags (v0.8), which the session needs to gather
    # a split one, and ContainerAdjustment.CDI_devices with its CDIDevice (v0.7), which the
    # plugin sends where the runtime applies it. Nothing else of later releases.
    by_name = api_pb2.DESCRIPTOR.message_types_by_name
    assert "LinuxPids" not in by_name
    adjustment = by_name["ContainerAdjustment"].fields_by_number
    assert sorted(adjustment) == [2, 3, 4, 5, 6, 7, 8]
    assert adjustment[8].message_type is by_name["CDIDevice"]
    assert adjustment[8].is_repeated
    assert [f.name for f in by_name["CDIDevice"].fields] == ["name"]
    assert len(by_name) == 45  # top-level messages: v0.6.1's 44 and CDIDevice (v0.8 has 46)


def test_cdi_devices_encode_as_upstream_numbers_them() -> None:
    # Field 8, length-delimited (0x42), holding CDIDevice field 1 (0x0a): what a v0.7+ runtime
    # decodes as ContainerAdjustment.CDI_devices[0].name.
    adjust = api_pb2.ContainerAdjustment(CDI_devices=[api_pb2.CDIDevice(name="a.com/b=c")])
    assert adjust.SerializeToString() == bytes.fromhex("420b0a09") + b"a.com/b=c"


def test_services_and_methods_are_the_strings_on_the_wire() -> None:
    services = {s.full_name: sorted(m.name for m in s.methods) for s in api_pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {
        "nri.pkg.api.v1alpha1.Runtime": ["RegisterPlugin", "UpdateContainers"],
        "nri.pkg.api.v1alpha1.Plugin": [
            "Configure", "CreateContainer", "Shutdown", "StateChange", "StopContainer", "Synchronize", "UpdateContainer",
        ],
    }


def test_event_numbers_give_the_0x7ff_mask() -> None:
    events = [api_pb2.Event.Value(name) for name in api_pb2.Event.keys() if name not in ("UNKNOWN", "LAST")]
    assert sorted(events) == list(range(1, 12))
    assert sum(1 << (e - 1) for e in events) == 0x7FF
    assert api_pb2.ConfigureResponse(events=0x7FF).SerializeToString() == bytes.fromhex("10ff0f")


def test_envelope_matches_the_captured_registration() -> None:
    request = ttrpc_pb2.Request(
        service="nri.pkg.api.v1alpha1.Runtime",
        method="RegisterPlugin",
        payload=api_pb2.RegisterPluginRequest(plugin_name="proto", plugin_idx="10").SerializeToString(),
        timeout_nano=5_000_000_000,
    )
    assert request.ByteSize() == 65
    assert request.SerializeToString().endswith(bytes.fromhex("1a0b0a0570726f746f120231302080e497d012"))
    assert ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=0)).SerializeToString() == b"\x0a\x00"

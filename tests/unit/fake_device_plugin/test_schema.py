"""proto/deviceplugin/v1beta1/api.proto is the kubelet v1.20's, field for field.

The kubelet binary carries the schema it speaks (kubelet_descriptor.py); it was described once
into kubelet_v1_20_2_deviceplugin.json, which the generated module is checked against in both
directions. Where the lab's kubelet binary is built (scripts/k8s-deps), the description is
checked against the binary itself too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from nri_numa.fake_device_plugin.pb import api_pb2 as dp
from nri_numa.fake_device_plugin.pb import api_pb2_grpc as dp_grpc
from tests.unit.fake_device_plugin.kubelet_descriptor import describe, embedded_descriptor

RECORDED = json.loads((Path(__file__).parent / "kubelet_v1_20_2_deviceplugin.json").read_text())
KUBELET = Path("/var/cache/nri-numa/k8s-v1.20.2/bin/kubelet")


def ours() -> dict:
    file = descriptor_pb2.FileDescriptorProto()
    dp.DESCRIPTOR.CopyToProto(file)
    return describe(file)


def test_every_message_field_and_method_is_the_kubelets_and_nothing_is_missing() -> None:
    described = ours()
    assert described == {k: v for k, v in RECORDED.items() if k != "source"}
    assert len(described["messages"]) == 21  # 19 messages and the two map entries
    assert described["services"]["DevicePlugin"]["ListAndWatch"][2] == "stream"


def test_what_travels_on_the_wire() -> None:
    # gRPC routes by "/<package>.<service>/<method>": these strings are the protocol.
    assert dp.DESCRIPTOR.services_by_name["DevicePlugin"].full_name == "v1beta1.DevicePlugin"
    assert dp.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    assert hasattr(dp_grpc, "RegistrationStub") and hasattr(dp_grpc, "DevicePluginServicer")


@pytest.mark.skipif(not KUBELET.is_file(), reason=f"no kubelet binary at {KUBELET} "
                                                  "(scripts/k8s-deps builds it)")
def test_the_recorded_description_is_what_the_lab_kubelet_carries() -> None:
    found = embedded_descriptor(KUBELET)
    assert found is not None, f"{KUBELET} carries no v1beta1 DevicePlugin schema"
    assert describe(found) == {k: v for k, v in RECORDED.items() if k != "source"}

"""proto/podresources/v1/api.proto is the kubelet's, field for field.

Upstream's file is not available offline, so its fields were extracted once into
upstream_api_v1_36.json (source named inside; see proto/README.md); the generated module's
descriptors are checked against that description in both directions, and the .proto text
against the generated module by ``scripts/gen-proto --check``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.podresources.pb import api_pb2_grpc as pr_grpc

UPSTREAM = json.loads((Path(__file__).parent / "upstream_api_v1_36.json").read_text())
PROTO = Path(__file__).resolve().parents[3] / "proto" / "podresources" / "v1" / "api.proto"

_SCALARS = {FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_INT64: "int64",
            FieldDescriptor.TYPE_UINT64: "uint64"}


def written_type(field: FieldDescriptor) -> str:
    """The type as a .proto file spells it: ``repeated ContainerDevices``, ``optional string``."""
    kind = field.message_type.name if field.message_type else _SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {kind}"
    if field.has_presence and field.message_type is None:
        return f"optional {kind}"  # proto3 `optional`: a scalar that knows it was set
    return kind


def test_every_message_and_field_is_upstreams_and_nothing_is_missing() -> None:
    ours = {name: {str(f.number): [written_type(f), f.name] for f in message.fields}
            for name, message in pr.DESCRIPTOR.message_types_by_name.items()}
    assert ours == UPSTREAM["messages"]
    assert len(ours) == 15


def test_package_service_and_methods_are_upstreams() -> None:
    assert pr.DESCRIPTOR.package == UPSTREAM["package"] == "v1"
    service = pr.DESCRIPTOR.services_by_name[UPSTREAM["service"]]
    assert {m.name: [m.input_type.name, m.output_type.name] for m in service.methods} == \
        UPSTREAM["rpcs"]
    # What travels on the wire: the method paths the kubelet's gRPC server routes by.
    assert service.full_name == "v1.PodResourcesLister"
    assert hasattr(pr_grpc, "PodResourcesListerStub")


def test_the_dropped_class_name_number_stays_free() -> None:
    # Upstream removed DynamicResource.class_name = 1 in 1.31; reusing 1 would misread old kubelets.
    assert 1 not in pr.DynamicResource.DESCRIPTOR.fields_by_number
    assert "class_name" not in re.sub(r"//[^\n]*", "", PROTO.read_text())


def test_the_description_names_its_source() -> None:
    assert "v0.36.3" in UPSTREAM["source"] and "podresources/v1/api.proto" in UPSTREAM["source"]

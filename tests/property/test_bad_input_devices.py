"""What the device side reads from others: CDI spec files (JSON and YAML, any field, any text)
are read or refused with one line naming the file; PodResources replies (any devices, any NUMA
node ids, any bytes) give hints only on the machine's own NUMA nodes and never an exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.podresources.hints import DeviceNodes, container_hints
from nri_numa.podresources.pb import api_pb2 as pr
from nri_numa.podresources.pod_heads import PodHeads, pods_named
from nri_numa.runtime.cdi import SpecError, read_spec
from nri_numa.topology.synthetic import preset_topology
from tests.property.bad_input import TEXT, VALUE, YAML_TEXT, check_line, examples, with_value

TOPOLOGY = preset_topology("pcie-4gpu")
SPEC = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]}}
SPEC_FIELDS = [("cdiVersion",), ("kind",), ("devices",), ("devices", 0), ("devices", 0, "name"),
               ("devices", 0, "containerEdits"), ("devices", 0, "containerEdits", "deviceNodes"),
               ("devices", 0, "containerEdits", "deviceNodes", 0, "path"),
               ("devices", 0, "containerEdits", "deviceNodes", 0, "major"),
               ("devices", 0, "containerEdits", "deviceNodes", 0, "type"),
               ("containerEdits",), ("containerEdits", "deviceNodes", 0, "hostPath")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cdi")


def read(path: Path, text: str) -> None:
    path.write_text(text, errors="surrogatepass")
    try:
        read_spec(path)
    except SpecError as e:
        check_line(str(e), f"CDI spec {path}: ")


@settings(max_examples=examples(60))
@given(st.sampled_from(SPEC_FIELDS), VALUE, st.sampled_from([".json", ".yaml"]))
def test_any_field_of_a_cdi_spec_is_read_or_refused_in_one_line(folder, field, value, suffix):
    read(folder / f"spec{suffix}", json.dumps(with_value(SPEC, field, value)))


@settings(max_examples=examples(60))
@given(YAML_TEXT, st.sampled_from([".json", ".yaml"]))
def test_any_text_as_a_cdi_spec_is_read_or_refused_in_one_line(folder, text, suffix):
    read(folder / f"spec{suffix}", text)


NODE_IDS = st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1), st.integers(-2, 4))
DEVICE_IDS = st.one_of(TEXT.map(lambda t: t.encode("utf-8", "replace").decode()),
                       st.sampled_from([g.uuid for g in TOPOLOGY.gpus] + ["0", "1", "GPU-x::3",
                                       "0000:01:00.0", "00000000:01:00.0"]))


@st.composite
def containers(draw) -> pr.ContainerResources:
    container = pr.ContainerResources(name=draw(DEVICE_IDS))
    for _ in range(draw(st.integers(0, 4))):
        group = container.devices.add(
            resource_name=draw(st.one_of(st.just("nvidia.com/gpu"), DEVICE_IDS)),
            device_ids=draw(st.lists(DEVICE_IDS, max_size=3)))
        for node in draw(st.lists(NODE_IDS, max_size=3)):
            group.topology.nodes.add(ID=node)
    return container


@settings(max_examples=examples(200))
@given(containers())
def test_podresources_hints_name_only_the_machines_nodes(container):
    nodes = DeviceNodes(TOPOLOGY)
    hints = container_hints(container, nodes)
    assert all(ids and ids <= nodes.numa_ids for ids in hints.values())


@settings(max_examples=examples(200))
@given(st.one_of(st.binary(max_size=400), containers().map(lambda c: pr.ListPodResourcesResponse(
    pod_resources=[pr.PodResources(name="p", namespace="ns", containers=[c])]
).SerializeToString())))
def test_any_list_reply_decodes_or_fails_as_a_decode_error(raw):
    try:
        heads = PodHeads.FromString(raw)
        for pod in pods_named(heads, "ns", "p"):
            for container in pod.containers:
                container_hints(container, DeviceNodes(TOPOLOGY))
    except DecodeError:
        pass  # the client turns it into PodResourcesError, one line

"""A real NVIDIA H200 VM, captured through the device machine (tests/fixtures/real-h200-vm):
discovery of its sysfs with a fake NVML giving the recorded NVML answers equals what nri-numa
printed there (but for the two changes since: -1 means the only node, and no driver links were
kept), and precreate on that machine gives the spec it printed there, real device nodes and all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_numa.topology.discover import discover
from tests.integration.real_vm import (make_device_nodes, precreate_on_capture, printed_topology,
                                       unpack_capture)

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "real-h200-vm"
GPU_UUID = "GPU-23eb4708-fe47-27b6-8154-b8d0f2155114"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return unpack_capture(CAPTURE, "sysfs-h200.tar.gz", tmp_path_factory.mktemp("h200"))


def test_discovery_of_the_capture_equals_what_was_printed_there(root):
    found = json.loads(discover(root).to_json())
    assert found == printed_topology(CAPTURE)
    assert [(g["uuid"], g["name"], g["minor"]) for g in found["gpus"]] == [
        (GPU_UUID, "NVIDIA H200", 0)]


@pytest.fixture
def dev(tmp_path) -> Path:
    return make_device_nodes(tmp_path / "dev", CAPTURE / "machine.txt")


def test_precreate_on_that_machine_writes_the_spec_printed_there(root, dev, tmp_path):
    placed = precreate_on_capture(CAPTURE, root, dev, tmp_path)
    printed = json.loads((CAPTURE / "precreate.json").read_text())
    assert placed["linux"]["devices"] == printed["linux"]["devices"]
    assert placed["linux"]["resources"]["devices"] == printed["linux"]["resources"]["devices"]
    assert placed["linux"]["resources"]["cpu"]["cpus"] == printed["linux"]["resources"]["cpu"]["cpus"]
    assert placed["process"]["env"] == printed["process"]["env"]
    assert f"NVIDIA_VISIBLE_DEVICES={GPU_UUID}" in placed["process"]["env"]

"""A real NVIDIA H100 VM, captured (tests/fixtures/real-h100-vm): discovery of its sysfs with a
fake NVML that gives the recorded NVML answers equals what nri-numa printed there, and the
device grant on that machine gives its real device nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_numa.runtime.device_grant import DeviceGranter
from nri_numa.topology.discover import discover
from tests.integration.real_vm import (make_device_nodes, precreate_on_capture, printed_topology,
                                       unpack_capture)

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "real-h100-vm"
GPU_UUID = "GPU-0cc10ade-4865-eb33-382a-fd2e04c235d1"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return unpack_capture(CAPTURE, "sysfs-h100.tar.gz", tmp_path_factory.mktemp("h100"))


def test_discovery_of_the_capture_equals_what_was_printed_there(root):
    assert json.loads(discover(root).to_json()) == printed_topology(CAPTURE)


def test_the_gpu_is_local_to_the_only_node(root):
    topology = discover(root)
    assert [(g.uuid, g.numa_node, g.minor) for g in topology.gpus] == [(GPU_UUID, 0, 0)]
    assert topology.warnings == ()


@pytest.fixture
def dev(tmp_path) -> Path:
    return make_device_nodes(tmp_path / "dev", CAPTURE / "dev-nodes.txt")


def _printed(name: str) -> list:
    """One of the Python literals precreate.txt holds, by what it is."""
    lines = (CAPTURE / "precreate.txt").read_text().splitlines()
    index = {"cpu": 2, "devices": 3, "rules": 4, "env": 5}[name]
    return eval(lines[index], {"__builtins__": {}}, {"True": True, "False": False})  # noqa: S307


def test_the_device_grant_gives_the_recorded_nodes(root, dev):
    grant = DeviceGranter(discover(root), dev, root).grant({"nvidia.com/gpu": [GPU_UUID]})
    recorded = _printed("devices")
    assert [(n.path, n.major, n.minor) for n in grant.nodes] == \
        [(d["path"], d["major"], d["minor"]) for d in recorded]
    assert grant.env == {"NVIDIA_VISIBLE_DEVICES": GPU_UUID}


def test_precreate_on_that_machine_writes_the_recorded_spec(root, dev, tmp_path):
    placed = precreate_on_capture(CAPTURE, root, dev, tmp_path)
    linux = placed["linux"]
    assert linux["resources"]["cpu"]["cpus"] == _printed("cpu")["cpus"]
    assert linux["devices"] == _printed("devices")
    assert linux["resources"]["devices"] == _printed("rules")
    assert placed["process"]["env"] == _printed("env")

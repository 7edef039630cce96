"""A real NVIDIA H100 VM, captured (tests/fixtures/real-h100-vm): discovery of its sysfs with a
fake NVML that gives the recorded NVML answers equals what nri-numa printed there, and the
device grant on that machine gives its real device nodes."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from nri_numa.runtime.device_grant import DeviceGranter
from nri_numa.topology.discover import discover
from tests.integration.real_vm import precreate_on_capture, unpack_capture

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "real-h100-vm"
GPU_UUID = "GPU-0cc10ade-4865-eb33-382a-fd2e04c235d1"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return unpack_capture(CAPTURE, "sysfs-h100.tar.gz", tmp_path_factory.mktemp("h100"))


def _recorded_topology() -> dict:
    return json.loads((CAPTURE / "topology.json").read_text())


def test_discovery_of_the_capture_equals_what_was_printed_there(root):
    found = json.loads(discover(root).to_json())
    expected = _recorded_topology()
    for device in expected["pci_devices"]:
        assert device["numa_node"] is None  # what main printed there before -1 meant node 0
        device["numa_node"] = 0
        device["driver"] = None  # the capture kept no driver links
    for gpu in expected["gpus"]:
        gpu["numa_node"] = 0
    assert found == expected


def test_the_gpu_is_local_to_the_only_node(root):
    topology = discover(root)
    assert [(g.uuid, g.numa_node, g.minor) for g in topology.gpus] == [(GPU_UUID, 0, 0)]
    assert topology.warnings == ()


def _recorded_nodes() -> list[tuple[str, int, int]]:
    line = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s+(\d+)\s.*\s(/dev/\S+)$")
    return [(m[3], int(m[1]), int(m[2]))
            for m in map(line.match, (CAPTURE / "dev-nodes.txt").read_text().splitlines()) if m]


@pytest.fixture
def dev(tmp_path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for path, major, minor in _recorded_nodes():
        os.mknod(dev / Path(path).name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    return dev


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

"""A captured real machine (tests/fixtures/real-*-vm) as a root discovery can read: its sysfs
tarball unpacked, with a fake NVML that gives the NVML answers recorded there; and the OCI
hook's precreate run there as it ran on that machine."""

from __future__ import annotations

import json
import os
import re
import stat
import tarfile
from pathlib import Path

from nri_numa.hook import stages
from nri_numa.hook.machine import load_machine
from nri_numa.state.checkpoint import CheckpointStore
from nri_numa.topology.discover import FAKE_NVML_FILE, discover
from nri_numa.topology.nvml_recording import description_from_recording


def unpack_capture(capture: Path, tarball: str, root: Path) -> Path:
    with tarfile.open(capture / tarball) as tar:
        tar.extractall(root, filter="data")
    recording = json.loads((capture / "nvml-dump.json").read_text())
    (root / FAKE_NVML_FILE).write_text(json.dumps(description_from_recording(recording)))
    return root


def printed_topology(capture: Path) -> dict:
    """The capture's topology.json as discovery gives it now: a device's numa_node -1 (printed
    there as None) means the only node, and the capture kept no driver links."""
    expected = json.loads((capture / "topology.json").read_text())
    for device in expected["pci_devices"]:
        assert device["numa_node"] is None
        device["numa_node"] = 0
        device["driver"] = None
    for gpu in expected["gpus"]:
        gpu["numa_node"] = 0
    return expected


def make_device_nodes(dev: Path, listing: Path) -> Path:
    """``dev`` with the character devices that ``ls -l /dev/...`` showed in ``listing``, with
    their real numbers."""
    dev.mkdir()
    line = re.compile(r"^c\S+\s+\d+\s+\S+\s+\S+\s+(\d+),\s+(\d+)\s.*\s(/dev/\S+)$")
    for m in map(line.match, listing.read_text().splitlines()):
        if m:
            os.mknod(dev / Path(m[3]).name, 0o666 | stat.S_IFCHR, os.makedev(int(m[1]), int(m[2])))
    return dev


def precreate_on_capture(capture: Path, root: Path, dev: Path, scratch: Path) -> dict:
    """The spec `nri-numa hook precreate` writes for the capture's precreate-spec.json with its
    precreate-config.yaml, on the capture's discovered topology and device nodes ``dev``."""
    topology_file = scratch / "topology.json"
    topology_file.write_text(discover(root).to_json())
    state_dir = scratch / "state"
    machine = load_machine(state_dir, capture / "precreate-config.yaml", topology_file)
    env = stages.HookEnv(machine, CheckpointStore(state_dir, machine.fingerprint), dev_root=dev)
    placed, _ = stages.precreate(env, json.loads((capture / "precreate-spec.json").read_text()))
    return placed

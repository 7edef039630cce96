"""A captured real machine (tests/fixtures/real-*-vm) as a root discovery can read: its sysfs
tarball unpacked, with a fake NVML that gives the NVML answers recorded there."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from nri_numa.topology.discover import FAKE_NVML_FILE
from nri_numa.topology.nvml_recording import description_from_recording


def unpack_capture(capture: Path, tarball: str, root: Path) -> Path:
    with tarfile.open(capture / tarball) as tar:
        tar.extractall(root, filter="data")
    recording = json.loads((capture / "nvml-dump.json").read_text())
    (root / FAKE_NVML_FILE).write_text(json.dumps(description_from_recording(recording)))
    return root

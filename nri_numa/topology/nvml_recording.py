"""A fake NVML description (``fake_nvml``'s format) from NVML answers recorded on a real machine.

The recording is what a small pynvml script printed there, one object per GPU::

    {"driver_version": "580.159.04", "gpus": [
      {"index": 0, "uuid": "GPU-…", "name": "NVIDIA H100 80GB HBM3",
       "busId": "00000000:00:06.0", "minor": 0,
       "links": [{"link": 0, "state": "ERR NVMLError_NotSupported: Not Supported"}]}]}

A call that failed there was recorded as ``"ERR NVMLError_<Name>: …"``; the fake answers it
with the same error. Fields the adapter does not ask NVML for (memory, MIG mode, the NUMA
node id) are ignored. A GPU's NUMA node is not taken from the recording: the adapter takes it
from the GPU's PCI device, as it does on a live machine.
"""

from __future__ import annotations

import re
from typing import Any

from nri_numa.topology.fake_nvml_description import FakeNvmlFormatError
from nri_numa.topology.nvml import format_pci_address, parse_pci_address

_RECORDED_ERROR = re.compile(r"ERR NVMLError_(\w+)\b")


def description_from_recording(recording: Any) -> dict:
    """The fake NVML description that answers what ``recording`` says NVML answered.

    FakeNvmlFormatError names the field of a recording that cannot be turned into one.
    """
    if not isinstance(recording, dict) or not isinstance(recording.get("gpus"), list):
        raise FakeNvmlFormatError("an NVML recording is an object with a list of gpus")
    gpus = []
    for i, raw in enumerate(sorted(recording["gpus"], key=_index)):
        gpus.append(_gpu(raw, f"gpus[{i}]"))
    description: dict = {"gpus": gpus}
    if isinstance(recording.get("driver_version"), str):
        description["driver_version"] = recording["driver_version"]
    return description


def _index(raw: Any) -> int:
    return raw.get("index", 0) if isinstance(raw, dict) and isinstance(raw.get("index"), int) else 0


def _gpu(raw: Any, where: str) -> dict:
    if not isinstance(raw, dict):
        raise FakeNvmlFormatError(f"{where} must be an object")
    try:
        address = format_pci_address(parse_pci_address(str(raw.get("busId", ""))))
    except ValueError as e:
        raise FakeNvmlFormatError(f"{where}.busId: {e}") from None
    minor = raw.get("minor")
    gpu: dict = {"uuid": raw.get("uuid"), "name": raw.get("name", ""), "pci_address": address,
                 "minor": minor if isinstance(minor, int) else None, "numa_node": None}
    errors = {}
    links = []
    for link in raw.get("links") or []:
        state = link.get("state") if isinstance(link, dict) else None
        if isinstance(state, str) and (m := _RECORDED_ERROR.match(state)):
            errors["nvmlDeviceGetNvLinkState"] = m[1]
        elif link.get("remote") is not None:
            links.append({"remote_pci": link["remote"], "remote_type": link.get("remote_type"),
                          "active": bool(state)})
    if isinstance(minor, str) and (m := _RECORDED_ERROR.match(minor)):
        errors["nvmlDeviceGetMinorNumber"] = m[1]
    if links:
        gpu["nvlinks"] = links
    if errors:
        gpu["errors"] = errors
    return gpu

"""What the NVIDIA kernel driver says about each GPU in ``/proc/driver/nvidia/gpus``.

The driver keeps one folder per GPU, named by its PCI address, with an ``information`` file of
``Key: value`` lines (tabs and spaces between them)::

    Model:           NVIDIA H100 80GB HBM3
    GPU UUID:        GPU-...
    Bus Location:    0000:1b:00.0
    Device Minor:    2

``Device Minor`` is the N of ``/dev/nvidiaN``: the driver numbers GPUs in probe order, which
need not be NVML's index. Without NVML this file is the only map from a GPU's PCI address to its
device node. Paths are read under a root (``/`` on a live machine) so tests and captured trees
work the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from nri_numa.topology.sysfs_read import PCI_ADDRESS

GPUS_DIR = "proc/driver/nvidia/gpus"
_MAX_FILE = 64 * 1024  # the real file is a few hundred bytes


@dataclass(frozen=True, slots=True)
class DriverGpu:
    pci_address: str  # sysfs form, lowercase
    minor: int | None  # None: the line is missing or not a number
    uuid: str | None = None
    model: str | None = None


def parse_information(text: str) -> dict[str, str]:
    """The ``Key: value`` lines of an ``information`` file; lines without a colon are skipped."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def driver_gpu(pci_address: str, text: str) -> DriverGpu:
    fields = parse_information(text)
    minor = fields.get("Device Minor", "")
    return DriverGpu(pci_address=pci_address.lower(),
                     minor=int(minor) if minor.isdigit() else None,
                     uuid=fields.get("GPU UUID") or None, model=fields.get("Model") or None)


def read_driver_gpus(root: str | Path = "/") -> Mapping[str, DriverGpu]:
    """PCI address → what the driver says, for every GPU folder readable under ``root``; empty
    when the driver is not loaded. A folder that is not a PCI address, or whose file cannot be
    read, is skipped: this is a fallback, never a reason to fail."""
    folder = Path(root) / GPUS_DIR
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return MappingProxyType({})
    gpus: dict[str, DriverGpu] = {}
    for name in names:
        address = name.lower()
        if not PCI_ADDRESS.fullmatch(address):
            continue
        try:
            with open(folder / name / "information", encoding="utf-8", errors="replace") as f:
                text = f.read(_MAX_FILE)
        except OSError:
            continue
        gpus[address] = driver_gpu(address, text)
    return MappingProxyType(gpus)


def driver_minors(root: str | Path = "/") -> Mapping[str, int]:
    """PCI address → ``/dev/nvidia<minor>``'s minor, for the GPUs whose minor the driver says."""
    return MappingProxyType({a: g.minor for a, g in read_driver_gpus(root).items()
                             if g.minor is not None})

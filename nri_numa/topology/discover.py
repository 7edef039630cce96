"""One call that reads the whole machine: sysfs, then NVML, then netlink."""

from __future__ import annotations

from pathlib import Path

from nri_numa.topology.model import Topology

FAKE_NVML_FILE = "fake-nvml.json"


def discover(root: str | Path = "/", *, nvml: bool = True) -> Topology:
    """Read the machine under ``root`` (a prefix holding ``sys/`` and maybe ``proc/``).

    On the live host (``root`` is ``/``) GPUs come from the real NVML and netdevs from netlink. Under
    any other root those would describe this host rather than the tree, so GPUs come from the
    tree's ``fake-nvml.json`` when it has one (trees made by ``nri-numa generate`` do) and netdevs
    from sysfs alone. ``nvml=False`` skips GPUs. Problems become ``Topology.warnings``.
    """
    # Imported here so that `nri-numa --help` and JSON-only users never pay for the readers.
    from nri_numa.topology import netdev, nvml as nvml_adapter, pci, sysfs

    root = Path(root)
    live = root.resolve() == Path("/")
    warnings: list[str] = []
    cpus, nodes, isolcpus = sysfs.read_cpus_and_nodes(root, warnings)
    only_node = nodes[0].id if len(nodes) == 1 else None
    pci_devices = pci.read_pci_devices(root, warnings, only_node=only_node)
    nics = netdev.read_nics(root, pci_devices, warnings, netlink=live)
    gpus: tuple = ()
    if nvml:
        if live:
            gpus = nvml_adapter.read_gpus(pci_devices, warnings)
        elif (root / FAKE_NVML_FILE).is_file():
            from nri_numa.topology import fake_nvml

            gpus = fake_nvml.read_gpus_from_file(root / FAKE_NVML_FILE, pci_devices, warnings)
    return Topology(cpus=cpus, numa_nodes=nodes, isolcpus=isolcpus, pci_devices=pci_devices,
                    nics=nics, gpus=gpus, warnings=tuple(warnings))

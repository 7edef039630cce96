"""The fake NVML end to end: topology → description → fake → real pynvml → adapter → topology."""

from __future__ import annotations

import ctypes
import json
from collections import Counter

import pynvml
import pytest

from nri_numa.topology.fake_nvml import (NVSWITCH_PLACEHOLDER, FakeNvmlFormatError,
                                         FakeNvmlLibrary, description_from_topology, installed,
                                         read_gpus_from_file)
from nri_numa.topology.model import Topology
from nri_numa.topology.nvml import read_gpus
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice, pcie_level

NVSWITCH, GPU_CLASS = 0x068000, 0x030200


def gpu_device(address: str, numa: int, root_port: str, host_bridge: str) -> PciDevice:
    """A GPU behind its own PCIe switch: root port, switch upstream and downstream ports."""
    bus = int(address[5:7], 16)
    bridges = (root_port, f"0000:{bus - 2:02x}:00.0", f"0000:{bus - 1:02x}:00.0")
    return PciDevice(address, numa, GPU_CLASS, 0x10DE, 0x2330, bridges=bridges,
                     host_bridge=host_bridge)


def machine(devices: list[PciDevice], links: dict[int, tuple[int, dict[int, int]]],
            extra_pci: tuple[PciDevice, ...] = ()) -> Topology:
    """GPUs on ``devices`` (index order); links: index → (NVSwitch links, {peer index: direct})."""
    switch_links = {i: links.get(i, (0, {}))[0] for i in range(len(devices))}
    gpus = []
    for i, device in enumerate(devices):
        peers = Counter({devices[j].address: n for j, n in links.get(i, (0, {}))[1].items()})
        for j, other in enumerate(devices):
            if j != i and switch_links[i] and switch_links[j]:
                peers[other.address] += min(switch_links[i], switch_links[j])
        gpus.append(Gpu(index=i, uuid=f"GPU-{i:08x}-0000-4000-8000-{i:012x}",
                        pci_address=device.address, numa_node=device.numa_node, minor=(5 * i) % 8,
                        name="NVIDIA H100 80GB HBM3", nvswitch_links=switch_links[i],
                        nvlink_peers=dict(peers),
                        pcie={o.address: pcie_level(device, o) for o in devices if o is not device}))
    return Topology(cpus=(Cpu(0, 0), Cpu(1, 1)),
                    numa_nodes=(NumaNode(0, {0}, 2**34), NumaNode(1, {1}, 2**34)),
                    pci_devices=tuple(devices) + extra_pci, gpus=tuple(gpus))


def dgx_h100() -> Topology:
    """8 GPUs, 18 NVLinks each into NVSwitches that the host's PCI bus does not show."""
    buses = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]
    devices = [gpu_device(f"0000:{b}:00.0", i // 4, f"0000:{int(b, 16) - 3:02x}:01.0",
                          f"pci0000:{int(b, 16) - 4:02x}") for i, b in enumerate(buses)]
    return machine(devices, {i: (18, {}) for i in range(8)})


def dgx_a100_like() -> Topology:
    """Pairs of GPUs under one PCIe switch, 12 links each over six visible NVSwitches."""
    devices = []
    for i, b in enumerate(["07", "0f", "47", "4e", "87", "90", "b7", "bd"]):
        pair = i // 2
        devices.append(PciDevice(
            f"0000:{b}:00.0", [3, 1, 7, 5][pair], GPU_CLASS, 0x10DE, 0x20B0,
            bridges=(f"0000:{pair:02x}:01.1", f"0000:{0x30 + pair:02x}:00.0",
                     f"0000:{0x40 + pair:02x}:{i % 2:02x}.0"),
            host_bridge=f"pci0000:{pair * 0x40:02x}"))
    switches = tuple(PciDevice(f"0000:{b:02x}:00.0", None, NVSWITCH, 0x10DE, 0x1AF1)
                     for b in range(0xC4, 0xCA))
    return machine(devices, {i: (12, {}) for i in range(8)}, switches)


def mixed() -> Topology:
    """Two fabric GPUs that also bridge each other directly, and a pair joined only directly."""
    devices = [gpu_device(f"0000:{b}:00.0", n, f"0000:{r}:01.0", f"pci0000:{h}")
               for b, n, r, h in [("1b", 0, "18", "17"), ("43", 0, "18", "17"),
                                  ("9d", 1, "9a", "99"), ("c3", 1, "c0", "bf")]]
    switch = (PciDevice("0000:e5:00.0", None, NVSWITCH, 0x10DE, 0x22A3),)
    return machine(devices, {0: (6, {1: 2}), 1: (4, {0: 2}), 2: (0, {3: 4}), 3: (0, {2: 4})},
                   switch)


MACHINES = {"dgx-h100": dgx_h100, "dgx-a100-like": dgx_a100_like, "mixed": mixed}


def through_fake(topology: Topology, description: dict | None = None) -> tuple[tuple, list[str]]:
    warnings: list[str] = []
    library = FakeNvmlLibrary(description or description_from_topology(topology))
    with installed(library):
        gpus = read_gpus(topology.pci_devices, warnings)
    assert library.sessions == 0
    return gpus, warnings


# --- the round trip -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MACHINES))
def test_round_trip_gives_back_the_same_gpus(name):
    topology = MACHINES[name]()
    gpus, warnings = through_fake(topology)
    assert warnings == []
    assert gpus == topology.gpus


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_round_trip_through_a_json_file(name, tmp_path):
    topology = MACHINES[name]()
    path = tmp_path / "fake-nvml.json"
    path.write_text(json.dumps(description_from_topology(topology), indent=2))
    warnings: list[str] = []
    assert read_gpus_from_file(path, topology.pci_devices, warnings) == topology.gpus
    assert warnings == []


def test_round_trip_survives_the_topology_json_form():
    topology = Topology.from_json(dgx_a100_like().to_json())
    gpus, warnings = through_fake(topology)
    assert (gpus, warnings) == (topology.gpus, [])


def test_the_machines_say_what_they_claim():
    h100, a100 = dgx_h100(), dgx_a100_like()
    assert dict(h100.gpus[0].nvlink_peers) == {g.pci_address: 18 for g in h100.gpus[1:]}
    assert h100.gpus[0].pcie[h100.gpus[1].pci_address] == "node"
    assert h100.gpus[0].pcie[h100.gpus[4].pci_address] == "system"
    assert a100.gpus[0].pcie[a100.gpus[1].pci_address] == "single"


# --- the description ----------------------------------------------------------------------------

def test_switch_links_go_round_robin_over_the_nvswitches():
    description = description_from_topology(dgx_a100_like())
    ends = Counter(link["remote_pci"] for link in description["gpus"][0]["nvlinks"])
    assert ends == {f"0000:{b:02x}:00.0": 2 for b in range(0xC4, 0xCA)}
    assert {link["remote_type"] for link in description["gpus"][0]["nvlinks"]} == {"switch"}


def test_without_visible_nvswitches_links_name_the_placeholder():
    description = description_from_topology(dgx_h100())
    assert [link["remote_pci"] for link in description["gpus"][3]["nvlinks"]] == \
        [NVSWITCH_PLACEHOLDER] * 18


def test_direct_links_are_what_the_fabric_does_not_account_for():
    topology = mixed()
    gpus = description_from_topology(topology)["gpus"]
    kinds = [Counter((link["remote_type"], link["remote_pci"]) for link in g["nvlinks"])
             for g in gpus]
    a, b, c, d = (g.pci_address for g in topology.gpus)
    assert dict(topology.gpus[0].nvlink_peers) == {b: 6}  # 2 direct + min(6, 4)
    assert kinds[0] == {("switch", "0000:e5:00.0"): 6, ("gpu", b): 2}
    assert kinds[2] == {("gpu", d): 4}
    assert gpus[0]["pci_address"] == a and gpus[0]["numa_node"] == 0 and gpus[0]["minor"] == 0
    assert gpus[0]["pcie"] == {b: "multiple", c: "system", d: "system"}  # a switch each


def test_a_topology_that_contradicts_its_fabric_is_refused():
    topology = dgx_h100()
    broken = Gpu(**{**{f: getattr(topology.gpus[0], f) for f in Gpu.__dataclass_fields__},
                    "nvlink_peers": {topology.gpus[1].pci_address: 4}})
    with pytest.raises(ValueError, match=r"GPU 0 \(0000:1b:00.0\) counts 4 NVLinks to "
                                         r"0000:43:00.0, fewer than the 18"):
        description_from_topology(Topology(topology.cpus, topology.numa_nodes,
                                           gpus=(broken,) + topology.gpus[1:]))
    missing = Gpu(**{**{f: getattr(topology.gpus[0], f) for f in Gpu.__dataclass_fields__},
                     "nvlink_peers": {}})
    with pytest.raises(ValueError, match="counts 0 NVLinks to 0000:43:00.0"):
        description_from_topology(Topology(topology.cpus, topology.numa_nodes,
                                           gpus=(missing,) + topology.gpus[1:]))


def test_description_needs_no_binding(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert len(description_from_topology(dgx_h100())["gpus"]) == 8


GOOD = {"uuid": "GPU-a", "pci_address": "0000:1b:00.0"}


@pytest.mark.parametrize("description, message", [
    ([], "description must be an object, not list"),
    ({}, "gpus must be a list of GPU objects"),
    ({"gpus": [GOOD], "driver_version": 550}, "driver_version must be a string, not 550"),
    ({"gpus": [], "init_error": "Sleepy"}, "init_error is 'Sleepy'; expected the name of an NVML"),
    ({"gpus": [], "missing_functions": "nvmlInit"}, "missing_functions must be a list"),
    ({"gpus": [7]}, "gpus[0] must be an object, not int"),
    ({"gpus": [{"pci_address": "0000:1b:00.0"}]}, "gpus[0].uuid must be a string, not None"),
    ({"gpus": [{"uuid": "GPU-a", "pci_address": "1b:00.0"}]},
     "gpus[0].pci_address: '1b:00.0' is not a PCI address"),
    ({"gpus": [{**GOOD, "minor": -1}]}, "gpus[0].minor must be a non-negative integer or null"),
    ({"gpus": [{**GOOD, "numa_node": True}]}, "gpus[0].numa_node must be a non-negative"),
    ({"gpus": [{**GOOD, "nvlinks": {}}]}, "gpus[0].nvlinks must be a list"),
    ({"gpus": [{**GOOD, "nvlinks": [{"remote_pci": "0000:c4:00.0", "remote_type": "cpu"}]}]},
     "gpus[0].nvlinks[0].remote_type is 'cpu'; expected one of gpu, npu, switch, unknown"),
    ({"gpus": [{**GOOD, "nvlinks": [{"remote_pci": "x", "remote_type": "gpu"}]}]},
     "gpus[0].nvlinks[0].remote_pci: 'x' is not a PCI address"),
    ({"gpus": [{**GOOD, "nvlinks": [{"remote_pci": "0000:c4:00.0", "remote_type": "switch",
                                     "active": "yes"}]}]},
     "gpus[0].nvlinks[0].active must be true or false"),
    ({"gpus": [{**GOOD, "nvlinks": [{"remote_pci": "0000:c4:00.0", "remote_type": "switch"}] * 37}]},
     "gpus[0].nvlinks has 37 links; this NVML has at most 36"),
    ({"gpus": [{**GOOD, "pcie": {"0000:1b:00.0": "far"}}]},
     "gpus[0].pcie.0000:1b:00.0 is 'far'; expected one of internal, single"),
    ({"gpus": [{**GOOD, "pcie": {"0000:43:00.0": "node"}}]},
     "gpus[0].pcie: 0000:43:00.0 is not the address of a GPU in this description"),
    ({"gpus": [{**GOOD, "errors": {"nvmlDeviceGetSerial": "Unknown"}}]},
     "gpus[0].errors: the fake has no NVML function 'nvmlDeviceGetSerial'"),
    ({"gpus": [{**GOOD, "errors": {"nvmlDeviceGetUUID": 3}}]},
     "gpus[0].errors.nvmlDeviceGetUUID is 3; expected the name of an NVML error"),
    ({"gpus": [GOOD, {**GOOD, "uuid": "GPU-b", "pci_address": "00000000:1B:00.0"}]},
     "gpus: pci_address 0000:1b:00.0 appears more than once"),
    ({"gpus": [GOOD, {**GOOD, "pci_address": "0000:43:00.0"}]},
     "gpus: uuid GPU-a appears more than once"),
])
def test_bad_descriptions_name_the_field(description, message):
    with pytest.raises(FakeNvmlFormatError) as caught:
        FakeNvmlLibrary(description)
    assert message in str(caught.value)


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the fake NVML description (No such file or directory)"),
    ("{not json", "the fake NVML description is not JSON"),
    ('{"gpus": [{"uuid": 1}]}', "bad fake NVML description: gpus[0].uuid must be a string"),
])
def test_bad_description_file_is_a_warning(content, message, tmp_path):
    path = tmp_path / "fake-nvml.json"
    if content is not None:
        path.write_text(content)
    warnings: list[str] = []
    assert read_gpus_from_file(path, (), warnings) == ()
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{path}: {message}")
    assert warnings[0].endswith("; GPUs are not read")


# --- the fake under the real binding ------------------------------------------------------------

def test_real_wrappers_read_the_fake():
    library = FakeNvmlLibrary({"driver_version": "535.161.08", "gpus": [
        {**GOOD, "name": "NVIDIA A100-SXM4-80GB", "minor": 3, "numa_node": 65}]})
    with installed(library):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        try:
            assert pynvml.nvmlSystemGetDriverVersion() == "535.161.08"
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            info = pynvml.nvmlDeviceGetPciInfo(handle)
            assert (info.busId, info.busIdLegacy) == ("00000000:1B:00.0", "0000:1B:00.0")
            assert (info.domain, info.bus, info.device) == (0, 0x1B, 0)
            assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA A100-SXM4-80GB"
            assert pynvml.nvmlDeviceGetMinorNumber(handle) == 3
            assert list(pynvml.nvmlDeviceGetMemoryAffinity(handle, 2, 0)) == [0, 2]
            with pytest.raises(pynvml.NVMLError_InsufficientSize):
                pynvml.nvmlDeviceGetMemoryAffinity(handle, 1, 0)
            assert pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, handle) == 0
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(handle, 0)
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                pynvml.nvmlDeviceGetHandleByIndex(1)
        finally:
            pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()


def test_missing_library_raises_library_not_found():
    with installed(None):
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
        assert pynvml.nvmlLib is None


def test_driver_not_loaded_raises_its_own_class():
    with installed(FakeNvmlLibrary({"init_error": "DriverNotLoaded", "gpus": []})):
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()


def pynvml_state() -> tuple:
    return (pynvml.nvmlLib, pynvml.CDLL, pynvml._nvmlLib_refcount,
            dict(pynvml._nvmlGetFunctionPointer_cache))


def test_pynvml_is_restored_after_use_and_after_an_exception():
    sentinel = object()
    pynvml._nvmlGetFunctionPointer_cache["nvmlSentinel"] = sentinel
    try:
        before = pynvml_state()
        assert before[1] is ctypes.CDLL  # no earlier install leaked its loader
        library = FakeNvmlLibrary({"gpus": [GOOD]})
        with installed(library):
            pynvml.nvmlInit()
            pynvml.nvmlDeviceGetCount()
            assert pynvml.nvmlLib is library and pynvml._nvmlLib_refcount == 1
            assert "nvmlSentinel" not in pynvml._nvmlGetFunctionPointer_cache
        assert pynvml_state() == before
        with pytest.raises(RuntimeError, match="boom"):
            with installed(library):
                pynvml.nvmlDeviceGetCount()
                raise RuntimeError("boom")
        assert pynvml_state() == before
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            with installed(None):
                pynvml.nvmlDeviceGetCount()
        assert pynvml_state() == before
    finally:
        del pynvml._nvmlGetFunctionPointer_cache["nvmlSentinel"]


def test_nested_installs_unwind_in_order():
    outer, inner = FakeNvmlLibrary({"gpus": [GOOD]}), FakeNvmlLibrary({"gpus": []})
    with installed(outer):
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 1
        with installed(inner):
            pynvml.nvmlInit()
            assert pynvml.nvmlDeviceGetCount() == 0
            pynvml.nvmlShutdown()
        assert pynvml.nvmlLib is outer and pynvml.nvmlDeviceGetCount() == 1
        pynvml.nvmlShutdown()
    assert pynvml.nvmlLib is None


# --- with the synthetic machines ----------------------------------------------------------------

def test_synthetic_presets_with_gpus_round_trip():
    from nri_numa.topology.synthetic import PRESETS, preset_topology

    with_gpus = [t for t in map(preset_topology, sorted(PRESETS)) if t.gpus]
    assert with_gpus, "no synthetic preset has GPUs"
    for topology in with_gpus:
        assert through_fake(topology) == (topology.gpus, [])


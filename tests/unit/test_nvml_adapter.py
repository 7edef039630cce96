"""The NVML adapter: decoding, warnings and the ways NVML fails, run against the C-level fake."""

from __future__ import annotations

import subprocess
import sys

import pynvml
import pytest

from nri_numa.topology.fake_nvml import FakeNvmlLibrary, installed
from nri_numa.topology.nvml import format_pci_address, parse_pci_address, read_gpus
from nri_numa.topology.parts import PciDevice

A, B, C = "0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"
SWITCH = "0000:c4:00.0"
NO_GPUS = "; GPUs are not read"


def pci(address: str, numa: int | None, class_code: int = 0x030200) -> PciDevice:
    return PciDevice(address, numa, class_code, 0x10DE, 0x2330)


PCI = (pci(A, 0), pci(B, 1), pci(C, 1), pci(SWITCH, None, 0x068000))


def gpu(address: str, uuid: str, **extra) -> dict:
    return {"uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "pci_address": address, "minor": 0,
            **extra}


def read(description: dict, pci_devices=PCI) -> tuple[tuple, list[str], FakeNvmlLibrary]:
    library = FakeNvmlLibrary(description)
    warnings: list[str] = []
    with installed(library):
        gpus = read_gpus(pci_devices, warnings)
    return gpus, warnings, library


# --- PCI addresses ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("00000000:1B:00.0", (0, 0x1B, 0, 0)),       # NVML
    ("0000:1B:00.0", (0, 0x1B, 0, 0)),           # NVML legacy
    ("0000:1b:00.0", (0, 0x1B, 0, 0)),           # sysfs
    ("0035:01:1f.7", (0x35, 1, 0x1F, 7)),        # POWER domain, highest device and function
    ("10000:e1:00.1", (0x10000, 0xE1, 0, 1)),    # VMD-style 32-bit domain
])
def test_parse_pci_address(text, expected):
    assert parse_pci_address(text) == expected


@pytest.mark.parametrize("text", ["", "1b:00.0", "0000:1b:00", "0000:1g:00.0", "0000:1b:00.8",
                                  "000000000:1b:00.0", "0000:1b:20.0"])
def test_parse_pci_address_rejects_what_is_not_one(text):
    with pytest.raises(ValueError, match="is not a PCI address|PCI devices go up to 0x1f"):
        parse_pci_address(text)


def test_format_pci_address_is_sysfs_form():
    assert format_pci_address((0, 0x1B, 0, 0)) == "0000:1b:00.0"
    assert format_pci_address((0x10000, 0xE1, 0x1F, 1)) == "10000:e1:1f.1"


# --- loading ------------------------------------------------------------------------------------

def test_missing_package_is_a_warning(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    warnings: list[str] = []
    assert read_gpus(PCI, warnings) == ()
    assert warnings == ["nvidia-ml-py (module pynvml) is not installed" + NO_GPUS]


def test_missing_library_is_a_warning():
    warnings: list[str] = []
    with installed(None):
        assert read_gpus(PCI, warnings) == ()
    assert warnings == ["the NVML library (libnvidia-ml.so.1) is not installed" + NO_GPUS]


@pytest.mark.parametrize("error, words", [
    ("DriverNotLoaded", "the NVIDIA kernel driver is not loaded"),
    ("NoPermission", "no permission to use NVML (check access to /dev/nvidiactl)"),
    ("LibRmVersionMismatch", "the NVML library and the NVIDIA kernel module are different"),
    ("Unknown", "NVML failed to start (Unknown Error)"),
])
def test_init_failure_is_a_warning_in_words(error, words):
    gpus, warnings, library = read({"init_error": error, "gpus": [gpu(A, "GPU-a")]})
    assert gpus == ()
    assert len(warnings) == 1 and warnings[0].startswith(words) and warnings[0].endswith(NO_GPUS)
    assert library.sessions == 0


def test_every_init_is_shut_down():
    gpus, warnings, library = read({"gpus": [gpu(A, "GPU-a")]})
    assert len(gpus) == 1 and warnings == []
    assert library.sessions == 0
    assert pynvml._nvmlLib_refcount == 0


def test_failed_shutdown_is_a_warning(monkeypatch):
    def shutdown():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    monkeypatch.setattr(pynvml, "nvmlShutdown", shutdown)
    gpus, warnings, _ = read({"gpus": [gpu(A, "GPU-a")]})
    assert len(gpus) == 1
    assert warnings == ["NVML nvmlShutdown failed: Unknown Error"]


def test_failed_count_is_a_warning(monkeypatch):
    def count():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", count)
    gpus, warnings, library = read({"gpus": [gpu(A, "GPU-a")]})
    assert gpus == ()
    assert warnings == ["NVML nvmlDeviceGetCount failed: GPU is lost",
                        "NVML cannot count the GPUs" + NO_GPUS]
    assert library.sessions == 0


# --- one GPU ------------------------------------------------------------------------------------

def test_identity_and_locality():
    (a, b), warnings, _ = read({"gpus": [gpu(A, "GPU-a", minor=7), gpu(B, "GPU-b", name="")]})
    assert warnings == []
    assert (a.index, a.uuid, a.pci_address, a.numa_node, a.minor, a.name) == (
        0, "GPU-a", A, 0, 7, "NVIDIA H100 80GB HBM3")
    assert (b.index, b.pci_address, b.numa_node, b.name) == (1, B, 1, "")
    assert (a.nvswitch_links, dict(a.nvlink_peers), dict(a.pcie)) == (0, {}, {})


def test_address_is_the_sysfs_spelling_of_the_matching_device():
    # sysfs here spells a wide domain; NVML's "%08X" form must still find it.
    odd = PciDevice("10000:e1:00.0", 3, 0x030200, 0x10DE, 0x2330)
    (g,), warnings, _ = read({"gpus": [gpu("10000:E1:00.0", "GPU-v")]}, (odd,))
    assert (g.pci_address, g.numa_node, warnings) == ("10000:e1:00.0", 3, [])


def test_gpu_missing_from_sysfs_has_no_numa_node_and_a_warning():
    (g,), warnings, _ = read({"gpus": [gpu("0000:9d:00.0", "GPU-x")]})
    assert (g.pci_address, g.numa_node, g.uuid) == ("0000:9d:00.0", None, "GPU-x")
    assert warnings == ["GPU 0 (0000:9d:00.0): no such PCI device in sysfs; "
                        "its NUMA node is unknown"]


def test_unsupported_minor_is_none_without_warning():
    (g,), warnings, _ = read({"gpus": [gpu(A, "GPU-a", minor=None)]})
    assert g.minor is None and warnings == []


def test_failing_uuid_call_keeps_the_rest():
    description = {"gpus": [gpu(A, "GPU-a"), gpu(B, "GPU-b", errors={"nvmlDeviceGetUUID": "Unknown"},
                                                   minor=4), gpu(C, "GPU-c")]}
    (a, b, c), warnings, _ = read(description)
    assert (a.uuid, b.uuid, c.uuid) == ("GPU-a", "", "GPU-c")
    assert (b.pci_address, b.minor, b.name) == (B, 4, "NVIDIA H100 80GB HBM3")
    assert warnings == [f"GPU 1 ({B}): NVML nvmlDeviceGetUUID failed: Unknown Error"]


def test_gpu_without_handle_is_skipped_and_hides_no_other():
    description = {"gpus": [gpu(A, "GPU-a"), gpu(B, "GPU-b", errors={
        "nvmlDeviceGetHandleByIndex_v2": "NoPermission"}), gpu(C, "GPU-c")]}
    gpus, warnings, library = read(description)
    assert [(g.index, g.uuid) for g in gpus] == [(0, "GPU-a"), (2, "GPU-c")]
    assert warnings == ["GPU 1: NVML nvmlDeviceGetHandleByIndex failed: Insufficient Permissions",
                        "GPU 1: skipped, NVML gives no handle for it"]
    assert library.sessions == 0


def test_gpu_without_pci_info_is_skipped():
    description = {"gpus": [gpu(A, "GPU-a", errors={"nvmlDeviceGetPciInfo_v3": "GpuIsLost"}),
                            gpu(B, "GPU-b")]}
    gpus, warnings, _ = read(description)
    assert [g.uuid for g in gpus] == ["GPU-b"]
    assert warnings == ["GPU 0: NVML nvmlDeviceGetPciInfo failed: GPU is lost",
                        "GPU 0: skipped, its PCI address is unknown"]


def test_bad_bus_id_skips_the_gpu(monkeypatch):
    real = pynvml.nvmlDeviceGetPciInfo

    def garbled(handle):
        info = real(handle)
        info.busId = b"garbage"
        return info
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", garbled)
    gpus, warnings, _ = read({"gpus": [gpu(A, "GPU-a")]})
    assert gpus == ()
    assert warnings == ["GPU 0: skipped, NVML gave a bad PCI bus id: 'garbage' is not a PCI "
                        "address such as 0000:1b:00.0"]


# --- NVLink -------------------------------------------------------------------------------------

def link(remote: str, kind: str, active: bool = True) -> dict:
    return {"remote_pci": remote, "remote_type": kind, "active": active}


def test_direct_links_count_per_peer_and_inactive_links_are_skipped():
    description = {"gpus": [
        gpu(A, "GPU-a", nvlinks=[link(B, "gpu"), link(B, "gpu", active=False), link(B, "gpu"),
                                 link(C, "gpu")]),
        gpu(B, "GPU-b", nvlinks=[link(A, "gpu"), link(A, "gpu")]),
        gpu(C, "GPU-c"),  # no NVLink at all: NotSupported on link 0
    ]}
    (a, b, c), warnings, _ = read(description)
    assert warnings == []
    assert dict(a.nvlink_peers) == {B: 2, C: 1}
    assert dict(b.nvlink_peers) == {A: 2}
    assert dict(c.nvlink_peers) == {} and c.nvswitch_links == 0


def test_link_count_comes_from_the_binding(monkeypatch):
    # An older binding knows fewer links (12, then 18, now 36): the loop follows its constant.
    library = FakeNvmlLibrary({"gpus": [gpu(A, "GPU-a", nvlinks=[link(B, "gpu")] * 3),
                                        gpu(B, "GPU-b")]})
    monkeypatch.setattr(pynvml, "NVML_NVLINK_MAX_LINKS", 2)
    with installed(library):
        a, _ = read_gpus(PCI, [])
    assert dict(a.nvlink_peers) == {B: 2}


def test_switch_fabric_joins_every_pair_with_the_smaller_count():
    description = {"gpus": [
        gpu(A, "GPU-a", nvlinks=[link(SWITCH, "switch")] * 18),
        gpu(B, "GPU-b", nvlinks=[link(SWITCH, "switch")] * 12 + [link(A, "gpu")] * 2),
        gpu(C, "GPU-c", nvlinks=[link(A, "gpu")]),  # off the fabric
    ]}
    (a, b, c), warnings, _ = read(description)
    assert warnings == []
    assert (a.nvswitch_links, b.nvswitch_links, c.nvswitch_links) == (18, 12, 0)
    assert dict(a.nvlink_peers) == {B: 12}
    assert dict(b.nvlink_peers) == {A: 14}
    assert dict(c.nvlink_peers) == {A: 1}


def test_link_to_a_cpu_is_no_gpu_path():
    description = {"gpus": [gpu(A, "GPU-a", nvlinks=[link("0004:00:00.0", "npu"), link(B, "gpu")]),
                            gpu(B, "GPU-b")]}
    (a, _), warnings, _ = read(description)
    assert (a.nvswitch_links, dict(a.nvlink_peers), warnings) == (0, {B: 1}, [])


@pytest.mark.parametrize("how", ["driver", "binding", "unknown"])
def test_without_remote_type_the_pci_class_decides(how, monkeypatch):
    kind = "unknown" if how == "unknown" else "gpu"  # "gpu" is never asked for in the others
    links = [link(SWITCH, kind), link(SWITCH, kind), link(B, kind), link("0000:ee:00.0", kind)]
    description = {"gpus": [gpu(A, "GPU-a", nvlinks=links),
                            gpu(B, "GPU-b", nvlinks=[link(SWITCH, kind)])]}
    if how == "driver":
        description["missing_functions"] = ["nvmlDeviceGetNvLinkRemoteDeviceType"]
    if how == "binding":
        monkeypatch.delattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType")
    (a, b), warnings, _ = read(description)
    assert (a.nvswitch_links, b.nvswitch_links) == (2, 1)
    assert dict(a.nvlink_peers) == {B: 2}  # 1 direct + min(2, 1) over the switch; 0000:ee ignored
    expected = {"driver": ["this NVIDIA driver's NVML has no nvmlDeviceGetNvLinkRemoteDeviceType; "
                           "what it tells is unknown"],
                "binding": ["this nvidia-ml-py has no nvmlDeviceGetNvLinkRemoteDeviceType; "
                            "what it tells is unknown"],
                "unknown": []}[how]
    assert warnings == expected  # once, not once per link


def test_failing_link_state_stops_that_gpu_only():
    description = {"gpus": [
        gpu(A, "GPU-a", nvlinks=[link(B, "gpu")], errors={"nvmlDeviceGetNvLinkState": "GpuIsLost"}),
        gpu(B, "GPU-b", nvlinks=[link(A, "gpu")]),
    ]}
    (a, b), warnings, _ = read(description)
    assert (dict(a.nvlink_peers), dict(b.nvlink_peers)) == ({}, {A: 1})
    assert warnings == [f"GPU 0 ({A}): NVML nvmlDeviceGetNvLinkState failed: GPU is lost"]


def test_failing_remote_pci_drops_only_that_link():
    description = {"gpus": [
        gpu(A, "GPU-a", nvlinks=[link(B, "gpu")] * 2,
            errors={"nvmlDeviceGetNvLinkRemotePciInfo_v2": "Unknown"}),
        gpu(B, "GPU-b", nvlinks=[link(A, "gpu")]),
    ]}
    (a, b), warnings, _ = read(description)
    assert (dict(a.nvlink_peers), dict(b.nvlink_peers)) == ({}, {A: 1})
    assert warnings == [f"GPU 0 ({A}): NVML nvmlDeviceGetNvLinkRemotePciInfo failed: "
                        "Unknown Error"] * 2


# --- PCIe ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("word", ["internal", "single", "multiple", "hostbridge", "node", "system"])
def test_pcie_levels_become_words(word):
    description = {"gpus": [gpu(A, "GPU-a", pcie={B: word}), gpu(B, "GPU-b", pcie={A: "system"})]}
    (a, b), warnings, _ = read(description)
    assert (dict(a.pcie), dict(b.pcie), warnings) == ({B: word}, {A: "system"}, [])


def test_pcie_unknown_to_nvml_is_left_out_quietly():
    (a, b), warnings, _ = read({"gpus": [gpu(A, "GPU-a"), gpu(B, "GPU-b", pcie={A: "node"})]})
    assert (dict(a.pcie), dict(b.pcie), warnings) == ({}, {A: "node"}, [])


def test_failing_pcie_call_is_a_warning():
    description = {"gpus": [
        gpu(A, "GPU-a", pcie={B: "node"},
            errors={"nvmlDeviceGetTopologyCommonAncestor": "Unknown"}),
        gpu(B, "GPU-b", pcie={A: "node"})]}
    (a, b), warnings, _ = read(description)
    assert (dict(a.pcie), dict(b.pcie)) == ({}, {A: "node"})
    assert warnings == [f"GPU 0 ({A}): NVML nvmlDeviceGetTopologyCommonAncestor failed: "
                        "Unknown Error"]


def test_undocumented_pcie_level_is_ignored(monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTopologyCommonAncestor", lambda h1, h2: 35)
    (a, b), warnings, _ = read({"gpus": [gpu(A, "GPU-a"), gpu(B, "GPU-b")]})
    assert (dict(a.pcie), dict(b.pcie)) == ({}, {})
    assert warnings == [
        f"GPU 0 ({A}): NVML gave PCIe level 35 towards {B}, not one it documents; ignored",
        f"GPU 1 ({B}): NVML gave PCIe level 35 towards {A}, not one it documents; ignored"]


# --- importing ----------------------------------------------------------------------------------

def test_importing_loads_no_binding_and_warns_nothing():
    code = ("import sys\n"
            "import nri_numa.topology.nvml, nri_numa.topology.fake_nvml\n"
            "assert 'pynvml' not in sys.modules, 'pynvml imported eagerly'\n"
            "from nri_numa.topology.fake_nvml import FakeNvmlLibrary, installed\n"
            "from nri_numa.topology.nvml import read_gpus\n"
            "w = []\n"
            "with installed(FakeNvmlLibrary({'gpus': []})):\n"
            "    assert read_gpus((), w) == () and w == [], w\n")
    result = subprocess.run([sys.executable, "-W", "error", "-c", code],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


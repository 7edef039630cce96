"""The NVIDIA driver's /proc/driver/nvidia/gpus/<pci>/information: the minor of /dev/nvidiaN by
PCI address, read under a root; anything unreadable is skipped, never fatal."""

from __future__ import annotations

from pathlib import Path

from nri_numa.topology.nvidia_proc import (GPUS_DIR, driver_gpu, driver_minors,
                                           parse_information, read_driver_gpus)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-proc" / "information-h100.txt"


def _gpu(root: Path, address: str, text: str) -> None:
    folder = root / GPUS_DIR / address
    folder.mkdir(parents=True)
    (folder / "information").write_text(text)


def test_the_real_format_is_read():
    text = FIXTURE.read_text()
    fields = parse_information(text)
    assert fields["Bus Location"] == "0000:1b:00.0" and fields["GPU Excluded"] == "No"
    gpu = driver_gpu("0000:1B:00.0", text)
    assert (gpu.pci_address, gpu.minor, gpu.model) == ("0000:1b:00.0", 2, "NVIDIA H100 80GB HBM3")
    assert gpu.uuid == "GPU-5f0f1b33-62d0-84f9-a1a6-7c3e4bb5b7a1"


def test_minors_by_address_under_a_root(tmp_path):
    _gpu(tmp_path, "0000:1b:00.0", FIXTURE.read_text())
    _gpu(tmp_path, "0000:43:00.0", FIXTURE.read_text().replace("Minor: \t 2", "Minor: \t 3"))
    _gpu(tmp_path, "0000:52:00.0", "Model: x\nDevice Minor: \t ?\n")  # no number: no minor
    _gpu(tmp_path, "not-an-address", "Device Minor: 9\n")
    (tmp_path / GPUS_DIR / "0000:61:00.0").mkdir()  # no information file
    assert dict(driver_minors(tmp_path)) == {"0000:1b:00.0": 2, "0000:43:00.0": 3}
    assert read_driver_gpus(tmp_path)["0000:52:00.0"].minor is None


def test_no_driver_no_gpus(tmp_path):
    assert dict(read_driver_gpus(tmp_path)) == {}

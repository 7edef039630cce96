"""The single-file sysfs readers: values, and a warning naming the file for every bad one."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from nri_numa.topology import sysfs_read
from nri_numa.topology.sysfs_read import (link_basename, pci_address_of, read_cpu_list,
                                          read_cpu_mask, read_hex, read_int, read_list_or_mask,
                                          read_text, resolve_in_root)


def put(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


# --- read_text -------------------------------------------------------------------------------

def test_text_loses_whitespace_and_trailing_nuls(tmp_path):
    warnings: list[str] = []
    assert read_text(put(tmp_path / "f", b" 0-3\n\x00\x00"), warnings) == "0-3"
    assert warnings == []


def test_missing_file_warns_only_when_required(tmp_path):
    warnings: list[str] = []
    assert read_text(tmp_path / "absent", warnings, required=False) is None
    assert warnings == []
    assert read_text(tmp_path / "absent", warnings) is None
    assert warnings == [f"{tmp_path / 'absent'} is missing"]


def test_missing_parent_directory_is_missing_too(tmp_path):
    put(tmp_path / "file", "x")
    warnings: list[str] = []
    assert read_text(tmp_path / "file" / "below", warnings) is None
    assert warnings == [f"{tmp_path / 'file' / 'below'} is missing"]


def test_directory_in_place_of_a_file(tmp_path):
    (tmp_path / "meminfo").mkdir()
    warnings: list[str] = []
    assert read_text(tmp_path / "meminfo", warnings, required=False) is None
    assert warnings == [f"{tmp_path / 'meminfo'} is a directory, not a file"]


def test_unreadable_file_names_the_reason(tmp_path, monkeypatch):
    # Tests run as root, which chmod 000 does not stop; the kernel's EACCES is simulated.
    target = put(tmp_path / "demote", "0")
    real_open = os.open

    def refusing_open(path, *args, **kwargs):
        if os.fspath(path) == str(target):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(sysfs_read.os, "open", refusing_open)
    warnings: list[str] = []
    assert read_text(target, warnings) is None
    assert warnings == [f"cannot read {target}: Permission denied"]


def test_binary_garbage_is_not_text(tmp_path):
    warnings: list[str] = []
    assert read_text(put(tmp_path / "type", b"\xff\xfeUnified"), warnings) is None
    assert len(warnings) == 1 and warnings[0].startswith(f"{tmp_path / 'type'} is not text")


def test_values_longer_than_one_read_are_read_whole(tmp_path):
    # Newer kernels make cpulist a bin attribute that can exceed a page.
    text = ",".join(str(i) for i in range(0, 40000, 2))
    assert read_text(put(tmp_path / "cpulist", text + "\n"), []) == text


# --- typed readers ----------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "value"), [("0\n", 0), ("-1\n", -1), ("36\x00", 36)])
def test_read_int(tmp_path, content, value):
    warnings: list[str] = []
    assert read_int(put(tmp_path / "n", content), warnings) == value
    assert warnings == []


@pytest.mark.parametrize("content", ["", "abc", "1 2", "0x10", "1-\x003"])
def test_read_int_rejects_what_is_not_one_decimal(tmp_path, content):
    warnings: list[str] = []
    path = put(tmp_path / "numa_node", content)
    assert read_int(path, warnings) is None
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{path}: expected a decimal integer, found")


def test_read_hex(tmp_path):
    warnings: list[str] = []
    assert read_hex(put(tmp_path / "class", "0x030200\n"), warnings) == 0x030200
    assert read_hex(put(tmp_path / "vendor", "10de"), warnings) == 0x10DE
    assert read_hex(put(tmp_path / "device", "0xZZ"), warnings) is None
    assert warnings == [f"{tmp_path / 'device'}: expected a hex integer, found '0xZZ'"]


def test_read_cpu_list(tmp_path):
    warnings: list[str] = []
    assert read_cpu_list(put(tmp_path / "a", "0-3,8\n"), warnings) == {0, 1, 2, 3, 8}
    assert read_cpu_list(put(tmp_path / "b", "\n"), warnings) == frozenset()
    assert read_cpu_list(put(tmp_path / "c", "3-1"), warnings) is None
    assert warnings == [f"{tmp_path / 'c'}: expected a list such as 0-3,8, found '3-1'"]


def test_absurd_sets_are_refused_before_they_are_built(tmp_path):
    warnings: list[str] = []
    assert read_cpu_list(put(tmp_path / "online", "0-4294967295"), warnings) is None
    assert read_cpu_mask(put(tmp_path / "cpumap", "f" * 20000), warnings) is None
    assert len(warnings) == 2
    assert warnings[0] == (f"{tmp_path / 'online'}: expected a list such as 0-3,8, "
                           f"found '0-4294967295'")
    assert warnings[1].startswith(f"{tmp_path / 'cpumap'}: expected a hex mask")


def test_huge_file_is_not_read_whole(tmp_path):
    path = put(tmp_path / "cpulist", b"0," * (3 << 20))
    warnings: list[str] = []
    assert read_text(path, warnings) is None
    assert warnings == [f"cannot read {path}: larger than 4194304 bytes, not a sysfs value"]


def test_read_cpu_mask(tmp_path):
    warnings: list[str] = []
    assert read_cpu_mask(put(tmp_path / "m", "00000000,00000f01\n"), warnings) == {0, 8, 9, 10, 11}
    assert read_cpu_mask(put(tmp_path / "bad", "0000,zz"), warnings) is None
    assert len(warnings) == 1 and "expected a hex mask" in warnings[0]


def test_list_or_mask_prefers_the_list(tmp_path):
    put(tmp_path / "cpulist", "0-87")
    put(tmp_path / "cpumap", "ffff")
    assert read_list_or_mask(str(tmp_path), "cpulist", "cpumap", []) == frozenset(range(88))


def test_list_or_mask_falls_back_to_the_mask(tmp_path):
    put(tmp_path / "cpumap", "0000,00000003")
    warnings: list[str] = []
    assert read_list_or_mask(str(tmp_path), "cpulist", "cpumap", warnings) == {0, 1}
    assert warnings == []


def test_list_or_mask_uses_the_mask_when_the_list_is_garbage(tmp_path):
    put(tmp_path / "cpulist", "zero to three")
    put(tmp_path / "cpumap", "f")
    warnings: list[str] = []
    assert read_list_or_mask(str(tmp_path), "cpulist", "cpumap", warnings) == {0, 1, 2, 3}
    assert len(warnings) == 1 and warnings[0].startswith(f"{tmp_path / 'cpulist'}: expected")


def test_list_or_mask_neither(tmp_path):
    warnings: list[str] = []
    assert read_list_or_mask(str(tmp_path), "cpulist", "cpumap", warnings) is None
    assert warnings == [f"{tmp_path} has neither cpulist nor cpumap"]
    assert read_list_or_mask(str(tmp_path), "cpulist", "cpumap", [], required=False) is None


# --- links ------------------------------------------------------------------------------------

DEVICE = "sys/devices/pci0000:00/0000:00:03.0"


@pytest.mark.parametrize("link, target", [
    ("sys/bus/pci/devices/0000:00:03.0", "../../../devices/pci0000:00/0000:00:03.0"),
    # Absolute: on the live host /sys/devices/pci0000:00 exists too; the tree's copy must win.
    ("sys/class/net/eth0", "/sys/devices/pci0000:00/0000:00:03.0"),
], ids=["relative", "absolute, inside the tree"])
def test_links_resolve_inside_the_tree(tmp_path, link, target):
    put(tmp_path / DEVICE / "vendor", "0x1af4")
    link = tmp_path / link
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    assert resolve_in_root(tmp_path, link, []) == str(tmp_path / DEVICE)


def test_dotdot_cannot_climb_out_of_the_tree(tmp_path):
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "up").symlink_to("../../../../sys")
    assert resolve_in_root(tmp_path, tmp_path / "sys" / "up", []) == str(tmp_path / "sys")


def test_dangling_link(tmp_path):
    link = tmp_path / "sys/bus/pci/devices/0000:05:00.0"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../../devices/pci0000:00/0000:05:00.0")
    warnings: list[str] = []
    assert resolve_in_root(tmp_path, link, warnings) is None
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{link} leads to ") and "does not exist" in warnings[0]


def test_link_loop(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    warnings: list[str] = []
    assert resolve_in_root(tmp_path, tmp_path / "a", warnings) is None
    assert warnings == [f"{tmp_path / 'a'}: too many levels of symbolic links"]


def test_path_outside_the_root(tmp_path):
    warnings: list[str] = []
    assert resolve_in_root(tmp_path / "root", tmp_path / "elsewhere", warnings) is None
    assert len(warnings) == 1 and "outside the tree" in warnings[0]


def test_link_basename(tmp_path):
    (tmp_path / "driver").symlink_to("../../../../bus/pci/drivers/mlx5_core")
    assert link_basename(tmp_path / "driver") == "mlx5_core"
    assert link_basename(tmp_path / "absent") is None
    put(tmp_path / "plain", "x")
    assert link_basename(tmp_path / "plain") is None


@pytest.mark.parametrize(("path", "address"), [
    ("/sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0", "0000:00:03.0"),
    ("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1/net/ens1f1", "0000:01:00.1"),
    ("/sys/devices/pci0000:00/0000:00:1d.0/10000:e1:00.0/nvme/nvme0", "10000:e1:00.0"),
    ("/sys/devices/virtual/net/lo", None),
    ("/sys/devices/platform/soc/1c30000.ethernet/net/eth0", None),
])
def test_pci_address_of(path, address):
    assert pci_address_of(path) == address

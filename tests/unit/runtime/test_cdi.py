"""CDI: names (good and bad), annotations, spec files read from real folders (JSON, YAML, broken,
missing, conflicting, changed), the nodes a spec gives, matching a GPU to its CDI name, and which
runtimes are known to apply CDI devices."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from nri_numa.runtime.cdi import (CdiNode, CdiRegistry, SpecError, device_node, host_device,
                                  read_spec, runtime_applies_cdi)
from nri_numa.runtime.cdi_names import CdiName, CdiNameError, annotation_names, parse_name

UUID = "GPU-4a1b2c3d-0000-1111-2222-333344445555"


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, parts", [
    ("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0")),
    (f"nvidia.com/gpu={UUID}", ("nvidia.com", "gpu", UUID)),
    ("nvidia.com/gpu=all", ("nvidia.com", "gpu", "all")),
    ("nvidia.com/gpu=0:1", ("nvidia.com", "gpu", "0:1")),  # a MIG instance, by index
    ("k8s.device-plugin.nvidia.com/gpu=GPU-1", ("k8s.device-plugin.nvidia.com", "gpu", "GPU-1")),
    ("vendor.com/class_1=dev.a-b_c", ("vendor.com", "class_1", "dev.a-b_c")),
    ("v/c=d", ("v", "c", "d")),
])
def test_good_names(text, parts):
    name = parse_name(text)
    assert (name.vendor, name.device_class, name.device) == parts
    assert str(name) == text and name.kind == f"{parts[0]}/{parts[1]}"


@pytest.mark.parametrize("text, message", [
    ("nvidia.com/gpu", "no '='"),
    ("/dev/nvidia0", "no '='"),
    ("gpu=0", "no '/'"),
    ("=0", "no '/'"),
    ("nvidia.com/=0", "class ''"),
    ("/gpu=0", "vendor ''"),
    ("1nvidia.com/gpu=0", "vendor '1nvidia.com'"),
    ("nvidia.com/gpu-=0", "class 'gpu-'"),
    ("nvidia.com/g/pu=0", "class 'g/pu'"),
    ("nvidia.com/gpu=", "device ''"),
    ("nvidia.com/gpu=-0", "device '-0'"),
    ("nvidia.com/gpu=0:", "device '0:'"),
    ("nvidia.com/gpu=a b", "device 'a b'"),
    ("nvidia.com/gpu=a=b", "device 'a=b'"),
])
def test_bad_names_say_which_part(text, message):
    with pytest.raises(CdiNameError, match=message) as e:
        parse_name(text)
    assert str(e.value).startswith(f"{text!r} is not a CDI device name: ")


def test_annotation_names_come_from_every_cdi_annotation_and_bad_ones_are_reported():
    annotations = {
        "cdi.k8s.io/nvidia-device-plugin_GPU-1": f"nvidia.com/gpu={UUID},nvidia.com/gpu=1",
        "cdi.k8s.io/other": "vendor.com/fpga=card0, broken",
        "nvidia.com/gpu": "nvidia.com/gpu=3",  # not a CDI annotation
        "devices.cdi.k8s.io/x": "nvidia.com/gpu=4",  # the prefix must lead the key
    }
    names, problems = annotation_names(annotations)
    assert [str(n) for n in names] == [f"nvidia.com/gpu={UUID}", "nvidia.com/gpu=1",
                                      "vendor.com/fpga=card0"]
    assert problems == ["annotation cdi.k8s.io/other: 'broken' is not a CDI device name: no '=' "
                        "before the device (vendor.com/class=name)"]


# --- spec files ----------------------------------------------------------------------------


def _spec(kind="vendor.com/fpga", devices=None, edits=None, version="0.6.0") -> dict:
    spec = {"cdiVersion": version, "kind": kind,
            "devices": devices if devices is not None else [
                {"name": "card0", "containerEdits": {"deviceNodes": [{"path": "/dev/fpga0"}]}}]}
    if edits is not None:
        spec["containerEdits"] = edits
    return spec


def _write(folder: Path, name: str, document: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def test_a_json_spec_gives_its_devices_nodes_and_the_specs_own(tmp_path):
    path = _write(tmp_path, "fpga.json", _spec(
        devices=[{"name": "card0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/fpga0", "hostPath": "/dev/host-fpga0", "type": "c", "major": 240,
             "minor": 0}, {"path": "/dev/fpga0-ctl"}], "env": ["A=1"]}},
                 {"name": "card1", "containerEdits": {"env": ["B=1"]}}],
        edits={"deviceNodes": [{"path": "/dev/fpga-mgr"}]}))
    card0, card1 = read_spec(path)
    assert card0.name == CdiName("vendor.com", "fpga", "card0")
    assert card0.nodes == (CdiNode("/dev/fpga0", "/dev/host-fpga0", "c", 240, 0),
                           CdiNode("/dev/fpga0-ctl", "/dev/fpga0-ctl"))
    assert card1.nodes == ()
    assert card0.spec_nodes == card1.spec_nodes == (CdiNode("/dev/fpga-mgr", "/dev/fpga-mgr"),)
    assert card0.spec_file == str(path)


def test_a_yaml_spec_reads_the_same(tmp_path):
    path = _write(tmp_path, "gpu.yaml", """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes:
  - {path: /dev/nvidiactl}
""")
    [gpu] = read_spec(path)
    assert str(gpu.name) == "nvidia.com/gpu=0"
    assert [n.path for n in gpu.nodes] == ["/dev/nvidia0"]
    assert [n.path for n in gpu.spec_nodes] == ["/dev/nvidiactl"]


@pytest.mark.parametrize("document, message", [
    ("{not json", "not JSON"),
    (["a list"], "the spec must be a map"),
    (_spec(version=None), "cdiVersion must be a non-empty string"),
    (_spec(kind="nvidia.com"), "'nvidia.com' is not a CDI kind: no '/'"),
    (_spec(kind=7), "kind must be a string"),
    (_spec(devices={"name": "x"}), "devices must be a list"),
    (_spec(devices=["x"]), r"devices\[0\] must be a map"),
    (_spec(devices=[{"name": 0}]), r"devices\[0\].name must be a string"),
    (_spec(devices=[{"name": "-x"}]), "device '-x'"),
    (_spec(devices=[{"name": "a"}, {"name": "a"}]), "device 'a' is defined twice"),
    (_spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": {"path": "/x"}}}]),
     r"devices\[0\].containerEdits.deviceNodes must be a list"),
    (_spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]),
     r"deviceNodes\[0\].path must be an absolute path"),
    (_spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": [
        {"path": "/dev/x", "type": "z"}]}}]), "type 'z' is not one of c, u, b, p"),
    (_spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": [
        {"path": "/dev/x", "major": -1}]}}]), "major must be a non-negative integer"),
    (_spec(devices=[{"name": "a", "containerEdits": {"deviceNodes": [
        {"path": "/dev/x", "minor": True}]}}]), "minor must be a non-negative integer"),
    (_spec(edits=[1]), "containerEdits must be a map"),
])
def test_broken_specs_name_the_file_and_the_problem(tmp_path, document, message):
    path = _write(tmp_path, "bad.json", document)
    with pytest.raises(SpecError, match=message) as e:
        read_spec(path)
    assert str(e.value).startswith(f"CDI spec {path}: ")


def test_broken_yaml_and_a_missing_file(tmp_path):
    with pytest.raises(SpecError, match="not YAML"):
        read_spec(_write(tmp_path, "bad.yaml", "kind: [unclosed"))
    with pytest.raises(SpecError, match="cannot read it"):
        read_spec(tmp_path / "absent.json")


def test_device_node_takes_numbers_from_the_spec_else_from_the_host_node(tmp_path):
    host = tmp_path / "fpga0"
    os.mknod(host, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    given = CdiNode("/dev/fpga0", str(host), "c", 240, 7)
    assert device_node(given) == _node("/dev/fpga0", "c", 240, 7)
    assert device_node(CdiNode("/dev/fpga0", str(host))) == _node("/dev/fpga0", "c", 1, 3)
    assert device_node(CdiNode("/dev/fpga0", str(tmp_path / "absent"))) is None
    host_file = tmp_path / "plain"
    host_file.write_text("")
    assert device_node(CdiNode("/dev/x", str(host_file))) is None  # not a device node
    assert device_node(CdiNode("/dev/fifo", "/x", "p", 0, 0)) is None


def test_host_device_reads_char_and_block_nodes_only(tmp_path):
    os.mknod(tmp_path / "char", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(tmp_path / "block", 0o600 | stat.S_IFBLK, os.makedev(8, 16))
    os.mkfifo(tmp_path / "fifo")
    assert host_device(tmp_path / "char") == ("c", 1, 3)
    assert host_device(str(tmp_path / "block")) == ("b", 8, 16)
    assert host_device(tmp_path / "fifo") is None
    assert host_device(tmp_path / "absent") is None


def _node(path, kind, major, minor):
    from nri_numa.runtime import DeviceNode

    return DeviceNode(path, kind, major, minor)


# --- the registry --------------------------------------------------------------------------


class Warnings(list):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_missing_dirs_are_no_devices(tmp_path):
    warnings = Warnings()
    assert CdiRegistry([tmp_path / "none", tmp_path / "nor"], warnings).devices() == {}
    assert warnings == []


def test_devices_from_both_dirs_a_later_dir_wins_and_other_files_are_ignored(tmp_path):
    etc, run = tmp_path / "etc", tmp_path / "run"
    _write(etc, "a.json", _spec(devices=[{"name": "card0"}, {"name": "card1"}]))
    _write(run, "b.yaml", json.dumps(_spec(devices=[{"name": "card1"}])))  # JSON is YAML
    _write(etc, "notes.txt", "not a spec")
    _write(etc, "c.yml", "not read: CDI reads .json and .yaml only")
    (etc / "sub.json").mkdir()
    registry = CdiRegistry([etc, run], Warnings())
    devices = registry.devices()
    assert sorted(devices) == ["vendor.com/fpga=card0", "vendor.com/fpga=card1"]
    assert devices["vendor.com/fpga=card0"].spec_file == str(etc / "a.json")
    assert devices["vendor.com/fpga=card1"].spec_file == str(run / "b.yaml")
    assert registry.device(CdiName("vendor.com", "fpga", "card1")) is devices[
        "vendor.com/fpga=card1"]
    assert registry.device("vendor.com/fpga=card9") is None


def test_a_name_two_files_of_one_dir_define_is_unresolvable_with_one_warning(tmp_path):
    _write(tmp_path, "a.json", _spec())
    _write(tmp_path, "b.json", _spec())
    warnings = Warnings()
    registry = CdiRegistry([tmp_path], warnings)
    assert registry.devices() == {}
    assert registry.devices() == {}
    assert warnings == [f"CDI device vendor.com/fpga=card0 is defined by both {tmp_path}/a.json "
                        f"and {tmp_path}/b.json: neither is used"]


def test_a_broken_file_is_warned_about_once_and_the_others_still_count(tmp_path):
    _write(tmp_path, "good.json", _spec())
    bad = _write(tmp_path, "bad.json", "{")
    warnings = Warnings()
    registry = CdiRegistry([tmp_path], warnings)
    for _ in range(3):
        assert list(registry.devices()) == ["vendor.com/fpga=card0"]
    assert len(warnings) == 1 and warnings[0].startswith(f"CDI spec {bad}: not JSON")
    assert warnings[0].endswith("; its devices are ignored")
    bad.write_text("{}")  # changed, still broken: said again, once
    for _ in range(2):
        registry.devices()
    assert len(warnings) == 2 and "cdiVersion" in warnings[1]


def test_files_added_changed_and_removed_are_seen(tmp_path):
    registry = CdiRegistry([tmp_path], Warnings())
    assert registry.devices() == {}
    path = _write(tmp_path, "a.json", _spec())
    assert list(registry.devices()) == ["vendor.com/fpga=card0"]
    path.write_text(json.dumps(_spec(devices=[{"name": "card1-longer-name"}])))
    assert list(registry.devices()) == ["vendor.com/fpga=card1-longer-name"]
    path.unlink()
    assert registry.devices() == {}


# --- a GPU's CDI name ----------------------------------------------------------------------


def _gpu_device(name: str, *nodes: str) -> dict:
    return {"name": name, "containerEdits": {"deviceNodes": [{"path": n} for n in nodes]}}


def test_a_gpu_is_named_by_uuid_first_then_by_its_node_then_by_index(tmp_path):
    # What nvidia-ctk cdi generate writes: by index, by UUID, and "all".
    _write(tmp_path, "nvidia.yaml", json.dumps(_spec("nvidia.com/gpu", [
        _gpu_device("0", "/dev/nvidia3"), _gpu_device(UUID, "/dev/nvidia3"),
        _gpu_device("all", "/dev/nvidia3", "/dev/nvidia4")])))
    registry = CdiRegistry([tmp_path], Warnings())
    assert registry.gpu_device_name(UUID, 0, 3) == f"nvidia.com/gpu={UUID}"
    # Another GPU: no UUID entry; "all" holds its node too but is not one GPU's device.
    assert registry.gpu_device_name("GPU-other", 1, 4) is None
    assert registry.gpu_device_name("GPU-other", 0, None) == "nvidia.com/gpu=0"  # by index
    assert registry.gpu_device_name("GPU-other", 0, 3) == "nvidia.com/gpu=0"  # by node, first


def test_a_gpu_is_matched_by_its_node_in_any_kind_nvidia_com_gpu_first(tmp_path):
    # NVIDIA's device plugin writes its own kind, named by UUID.
    _write(tmp_path, "plugin.json", _spec("k8s.device-plugin.nvidia.com/gpu", [
        _gpu_device("GPU-x", "/dev/nvidia5")]))
    registry = CdiRegistry([tmp_path], Warnings())
    assert registry.gpu_device_name("GPU-y", 2, 5) == "k8s.device-plugin.nvidia.com/gpu=GPU-x"
    assert registry.gpu_device_name("GPU-x", 2, None) == "k8s.device-plugin.nvidia.com/gpu=GPU-x"
    assert registry.gpu_device_name("GPU-y", 2, None) is None  # index only under nvidia.com/gpu
    _write(tmp_path, "vendor.json", _spec("nvidia.com/gpu", [_gpu_device("gpu5", "/dev/nvidia5")]))
    assert registry.gpu_device_name("GPU-y", 2, 5) == "nvidia.com/gpu=gpu5"


# --- which runtimes apply CDI devices an NRI plugin names ----------------------------------


@pytest.mark.parametrize("name, version, applies", [
    ("containerd", "2.1.9+unknown", True),  # what the e2e containerd reports
    ("containerd", "v2.1.0", True),
    ("containerd", "2.2.0", True),
    ("containerd", "3.0", True),
    ("containerd", "2.0.7", False),  # drops them silently
    ("containerd", "1.7.24~ds1", False),
    ("containerd", "1.7.30", False),  # only with enable_cdi, which a plugin cannot see
    ("containerd", "", False),
    ("containerd", "unknown", False),
    ("cri-o", "1.34.0", False),  # not verified here: device nodes
    ("", "2.1.9", False),
])
def test_runtimes_known_to_apply_cdi(name, version, applies):
    assert runtime_applies_cdi(name, version) is applies

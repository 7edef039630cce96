"""The fake device plugin's device list: flags and files, and one line for each kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_numa.fake_device_plugin.devices import (DeviceListError, FakeDevice, device_from_flag,
                                                 device_list, devices_from_mapping,
                                                 read_device_file)

GPU = "example.com/gpu"


def test_flags_give_ids_and_numa_nodes() -> None:
    assert device_from_flag("gpu0@0") == FakeDevice("gpu0", (0,))
    assert device_from_flag("GPU-1c2d@1,3") == FakeDevice("GPU-1c2d", (1, 3))
    assert device_from_flag("nic0") == FakeDevice("nic0", ())


def test_a_file_gives_health_and_topology(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(f"resource: {GPU}\ndevices:\n  - {{id: a, numa: [1]}}\n"
                    f"  - {{id: b, health: Unhealthy}}\n")
    found = read_device_file(path)
    assert found.resource == GPU
    assert found.devices == (FakeDevice("a", (1,)), FakeDevice("b", (), healthy=False))
    assert found.device("b") == FakeDevice("b", (), healthy=False) and found.device("c") is None


@pytest.mark.parametrize(("data", "message"), [
    ({"resource": "gpu", "devices": []}, "resource must be an extended resource name like "
                                          "example.com/gpu, not 'gpu'"),
    ({"resource": "kubernetes.io/gpu"}, "the kubernetes.io domains are the kubelet's own"),
    ({"resource": "x.k8s.io/gpu", "devices": [{"id": "a"}, {"id": "a"}]},
     "device id 'a' appears twice"),
    ({"resource": GPU, "devices": [{"id": "a" * 64}]}, "devices[0].id must be 1 to 63 printable"),
    ({"resource": GPU, "devices": [{"id": "a", "numa": [-1]}]},
     "devices[0].numa must be a list of NUMA node numbers, not [-1]"),
    ({"resource": GPU, "devices": [{"id": "a", "health": "ok"}]},
     "devices[0].health must be Healthy or Unhealthy, not 'ok'"),
    ({"resource": GPU, "devices": [{"id": "a", "nodes": [0]}]},
     "devices[0]: unknown keys 'nodes' (known: health, id, numa)"),
    ({"resource": GPU, "devices": {"id": "a"}}, "devices must be a list, not dict"),
    (["a"], "the file must be a mapping, not list"),
])
def test_each_mistake_is_one_line_naming_it(data: object, message: str) -> None:
    with pytest.raises(DeviceListError) as refused:
        devices_from_mapping(data)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_bad_flags_and_files_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(DeviceListError, match=r"--device 'a@1,x': expected ID or ID@NUMA"):
        device_from_flag("a@1,x")
    with pytest.raises(DeviceListError, match="at most 4096"):
        device_list(GPU, [FakeDevice(f"d{i}") for i in range(4097)])
    broken = tmp_path / "devices.yaml"
    broken.write_text("resource: [\n")
    with pytest.raises(DeviceListError) as refused:
        read_device_file(broken)
    assert str(broken) in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(DeviceListError, match="holds 0 YAML documents"):
        broken.write_text("")
        read_device_file(broken)

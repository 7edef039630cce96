"""The fake kubelet's state file: what it serves, and clear words for what it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_numa.podresources.fake_state import FakeStateError, read_state_file, state_from_mapping


def test_a_full_state_becomes_the_kubelets_messages(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text("""
pods:
  - name: trainer
    containers:
      - name: main
        devices:
          - {resource: nvidia.com/gpu, ids: [GPU-1], numa: [1]}
          - {resource: example.com/nic, ids: ["0000:3b:02.1"]}
        cpus: [4, 5]
allocatable:
  devices: [{resource: nvidia.com/gpu, ids: [GPU-1], numa: [1]}]
  cpus: [1, 2, 3]
get: disabled
delay: 0.25
garbage: true
""")
    state = read_state_file(path)
    pod = state.pod("default", "trainer")
    assert pod is not None and state.pod("other", "trainer") is None
    [main] = pod.containers
    gpu, nic = main.devices
    assert (gpu.resource_name, list(gpu.device_ids), [n.ID for n in gpu.topology.nodes]) == \
        ("nvidia.com/gpu", ["GPU-1"], [1])
    assert not nic.HasField("topology") and list(main.cpu_ids) == [4, 5]
    assert list(state.allocatable.cpu_ids) == [1, 2, 3]
    assert (state.get, state.delay_s, state.garbage) == ("disabled", 0.25, True)


def test_json_and_an_empty_file_work(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"pods": [{"namespace": "ns", "name": "p", "containers": []}]}')
    assert read_state_file(tmp_path / "s.json").pod("ns", "p") is not None
    (tmp_path / "empty.yaml").write_text("")
    assert read_state_file(tmp_path / "empty.yaml").pods == ()


@pytest.mark.parametrize("data, message", [
    ([], "state must be a mapping, not list"),
    ({"pod": []}, "state: unknown keys 'pod' (known: allocatable, delay, garbage, get, pods)"),
    ({"pods": [{"containers": []}]}, "pods[0].name must be a non-empty string, not None"),
    ({"pods": [{"name": "p", "containers": [{"name": "c", "devices": [{"ids": ["x"]}]}]}]},
     "pods[0].containers[0].devices[0].resource must be a non-empty string"),
    ({"pods": [{"name": "p", "containers": [{"name": "c", "cpus": [-1]}]}]},
     "pods[0].containers[0].cpus: -1 is not a non-negative integer"),
    ({"pods": [{"name": "p", "containers": [{"name": "c", "devices": [
        {"resource": "r", "ids": [3]}]}]}]}, "devices[0].ids[0] must be a non-empty string"),
    ({"pods": [{"name": "p", "containers": [{"name": "c", "claims": [
        {"name": "g", "devices": [{"driver": "d", "pool": "p"}]}]}]}]},
     "pods[0].containers[0].claims[0].devices[0].device must be a non-empty string"),
    ({"get": "maybe"}, "get must be one of enabled, disabled, unimplemented, not 'maybe'"),
    ({"delay": -1}, "delay must be a number of seconds >= 0"),
    ({"garbage": "yes"}, "garbage must be true or false"),
    ({"pods": [], "a\nb": 1, "\udc80": 2, "c": 3, "d": 4},
     r"state: unknown keys 'a\nb', '\udc80', 'c' and 1 more (known: "),
])
def test_bad_states_are_named(data, message) -> None:
    with pytest.raises(FakeStateError) as raised:
        state_from_mapping(data)
    assert message in str(raised.value)


def test_a_bad_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("pods: [\n")
    with pytest.raises(FakeStateError, match="s.yaml"):
        read_state_file(path)
    with pytest.raises(FakeStateError, match="missing.yaml"):
        read_state_file(tmp_path / "missing.yaml")


def test_a_dra_claim_becomes_the_kubelets_dynamic_resources() -> None:
    state = state_from_mapping({"pods": [{"name": "p", "namespace": "ns", "containers": [
        {"name": "main", "claims": [{"name": "gpu-claim", "devices": [
            {"driver": "gpu.example.com", "pool": "node-1", "device": "gpu-1",
             "cdi": ["gpu.example.com/gpu=gpu-1"]}]}]}]}]})
    [claim] = state.pod("ns", "p").containers[0].dynamic_resources
    [device] = claim.claim_resources
    assert (claim.claim_name, claim.claim_namespace) == ("gpu-claim", "ns")
    assert (device.driver_name, device.pool_name, device.device_name,
            [c.name for c in device.cdi_devices]) == (
        "gpu.example.com", "node-1", "gpu-1", ["gpu.example.com/gpu=gpu-1"])

"""podman's precreate stage: the container id from the spec, the check for the claiming hook, and
the placement written into a copy of the spec (cpus, mems, device nodes, allow rules, env)."""

from __future__ import annotations

import copy

import pytest

from nri_numa.engine.decision import Placement
from nri_numa.hook.precreate import SpecError, container_id, has_claiming_hook, placed_spec
from nri_numa.runtime import DeviceGranter, Grant, GrantedNode
from nri_numa.topology.synthetic import preset_topology

CID = "775deecdf04b073ec8f6867fb451822ae3b83ac96e2c3978130362d9312a5b5e"


@pytest.mark.parametrize("path", [
    f"/libpod_parent/libpod-{CID}",  # podman, cgroupfs driver
    f"machine.slice:libpod:{CID}",  # podman, systemd driver
    f"/custom/{CID}",
])
def test_container_id_from_the_cgroups_path(path):
    assert container_id({"linux": {"cgroupsPath": path}}) == CID


@pytest.mark.parametrize("spec", [
    {}, {"linux": {}}, {"linux": {"cgroupsPath": "/ohl/t1"}},
    {"linux": {"cgroupsPath": "/x/" + CID + "0"}},  # 65 hex digits: not an id
    {"linux": "nope"},
])
def test_no_id_no_placement(spec):
    with pytest.raises(SpecError, match="cannot tell the container id"):
        container_id(spec)


def _hook(*args: str) -> dict:
    return {"path": "/usr/local/bin/nri-numa", "args": ["nri-numa", *args]}


@pytest.mark.parametrize("hooks, claims", [
    ({"createRuntime": [_hook("hook", "createRuntime", "--config", "/c")]}, True),
    ({"prestart": [_hook("hook", "prestart")]}, True),
    ({"createRuntime": [{"path": "/other"}, _hook("hook", "createRuntime")]}, True),
    ({"createRuntime": [_hook("hook", "poststop")]}, False),
    ({"poststop": [_hook("hook", "createRuntime")]}, False),
    ({}, False),
    (None, False),
    ({"createRuntime": [{"path": "/v/bin/python3", "args": [
        "/v/bin/python3", "-I", "-S", "/v/lib/nri_numa/hook/client.py", "createRuntime"]}]},
     True),
    ({"createRuntime": [{"path": "/v/bin/python3", "args": [
        "/v/bin/python3", "-I", "-S", "/v/lib/nri_numa/hook/client.py", "poststop"]}]},
     False),
    ({"createRuntime": [{"path": "/x", "args": ["x", 3, "createRuntime"]}]}, False),
    ({"createRuntime": [{"path": "/v/bin/nri-numa-hook-client", "args": [
        "/v/bin/nri-numa-hook-client", "createRuntime", "--config", "/c"]}]}, True),
    ({"prestart": [{"path": "/v/bin/nri-numa-hook-client", "args": [
        "nri-numa-hook-client", "prestart"]}]}, True),
    ({"createRuntime": [{"path": "/v/bin/nri-numa-hook-client", "args": [
        "/v/bin/nri-numa-hook-client", "poststop"]}]}, False),
    ({"createRuntime": [{"path": "/v/bin/x", "args": [
        "/v/bin/not-nri-numa-hook-client", "createRuntime"]}]}, False),
])
def test_the_claiming_hook_must_be_in_the_spec(hooks, claims):
    assert has_claiming_hook({"hooks": hooks}) is claims


def _spec() -> dict:
    return {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
            "linux": {"cgroupsPath": f"/libpod_parent/libpod-{CID}",
                      "resources": {"devices": [{"allow": False, "access": "rwm"}]},
                      "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]},
            "annotations": {"numa.nri.io/hook": "true"}}


def test_cpus_and_mems_are_written_and_the_input_is_untouched():
    spec = _spec()
    before = copy.deepcopy(spec)
    out = placed_spec(spec, Placement("c", frozenset({2, 3, 10}), True, frozenset({0})), Grant())
    assert spec == before
    assert out["linux"]["resources"]["cpu"] == {"cpus": "2-3,10", "mems": "0"}
    assert out["linux"]["devices"] == before["linux"]["devices"]
    assert out["process"]["env"] == before["process"]["env"]


def test_shared_placement_leaves_mems_alone():
    out = placed_spec({}, Placement("c", frozenset({0, 1}), False, None), Grant())
    assert out["linux"]["resources"]["cpu"] == {"cpus": "0-1"}


def test_gpus_become_nodes_allow_rules_and_env(tmp_path):
    topology = preset_topology("dgx-h100")
    gpus = topology.gpus[:2]
    devices = {"nvidia.com/gpu": tuple(g.uuid for g in gpus)}
    placement = Placement("c", frozenset({4}), True, frozenset({0}), devices)
    # An empty dev root: the GPU nodes get the driver's major, nothing else is added.
    out = placed_spec(_spec(), placement, DeviceGranter(topology, tmp_path).grant(devices))
    nodes = [d for d in out["linux"]["devices"] if d["path"].startswith("/dev/nvidia")]
    assert nodes == [{"path": f"/dev/nvidia{g.minor}", "type": "c", "major": 195,
                      "minor": g.minor, "fileMode": 0o666, "uid": 0, "gid": 0} for g in gpus]
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # the deny-all stays first
    assert rules[1:] == [{"allow": True, "type": "c", "major": 195, "minor": g.minor,
                          "access": "rwm"} for g in gpus]
    env = out["process"]["env"]
    assert env == ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={gpus[0].uuid},{gpus[1].uuid}"]


def test_nic_rdma_nodes_are_written_like_gpus(tmp_path):
    grant = Grant((GrantedNode("/dev/infiniband/uverbs3", "c", 231, 195),
                   GrantedNode("/dev/infiniband/rdma_cm", "c", 10, 58)))
    out = placed_spec(_spec(), Placement("c", frozenset({4}), True, None), grant)
    assert out["linux"]["devices"][1:] == [
        {"path": "/dev/infiniband/uverbs3", "type": "c", "major": 231, "minor": 195,
         "fileMode": 0o666, "uid": 0, "gid": 0},
        {"path": "/dev/infiniband/rdma_cm", "type": "c", "major": 10, "minor": 58,
         "fileMode": 0o666, "uid": 0, "gid": 0}]
    assert out["linux"]["resources"]["devices"][1:] == [
        {"allow": True, "type": "c", "major": 231, "minor": 195, "access": "rwm"},
        {"allow": True, "type": "c", "major": 10, "minor": 58, "access": "rwm"}]
    assert out["process"]["env"] == _spec()["process"]["env"]  # no env for NICs


def test_a_node_already_in_the_spec_is_not_repeated():
    spec = _spec()
    grant = Grant((GrantedNode("/dev/fuse", "c", 10, 229),))
    out = placed_spec(spec, Placement("c", frozenset({4}), True, None), grant)
    assert out["linux"]["devices"] == spec["linux"]["devices"]


@pytest.mark.parametrize("spec, named", [
    ({"linux": []}, "spec.linux"),
    ({"linux": {"resources": {"cpu": "x"}}}, "linux.resources.cpu"),
    ({"linux": {"devices": "x"}}, "linux.devices"),
])
def test_spec_parts_of_the_wrong_type_are_named(spec, named):
    grant = Grant((GrantedNode("/dev/fuse", "c", 10, 229),))
    with pytest.raises(SpecError, match=named):
        placed_spec(spec, Placement("c", frozenset({1}), True, None), grant)

"""OCI spec → RuntimeContainer → engine request: the hook's reading of config.json, checked
field by field and against the requests the NRI path builds from the same values."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from nri_numa.engine.request import QosClass
from nri_numa.runtime import RuntimeInputError, container_request, pod_identity, pod_qos
from nri_numa.runtime.container import DeviceNode
from nri_numa.runtime.oci_spec import cgroup_parent, is_sandbox, runtime_container

REPO = Path(__file__).resolve().parents[3]
UID = "8d2c0bb4-6a8e-4b4e-9d5b-5d0c1f6a7e21"
CID = "c" * 64
MIB = 1 << 20


def spec(**linux_resources) -> dict:
    return {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", "A=1"]},
            "linux": {"cgroupsPath": "/nri-numa/test", "resources": linux_resources}}


def test_every_resource_field_is_read():
    s = spec(cpu={"shares": 2048, "quota": 200000, "period": 100000, "cpus": "2-3", "mems": "0"},
             memory={"limit": 512 * MIB},
             hugepageLimits=[{"pageSize": "2MB", "limit": 8 * MIB},
                             {"pageSize": "1GB", "limit": 1 << 30}])
    s["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                             {"path": "/dev/fifo", "type": "p"}]
    s["annotations"] = {"numa.nri.io/topology-policy": "single-numa-node"}
    c = runtime_container(s, CID)
    assert (c.cpu_shares, c.cpu_quota, c.cpu_period, c.memory_limit) == (2048, 200000, 100000,
                                                                          512 * MIB)
    assert dict(c.hugepage_limits) == {2048: 8 * MIB, 1 << 20: 1 << 30}
    assert c.devices == (DeviceNode("/dev/nvidia0", "c", 195, 0), DeviceNode("/dev/fifo", "p", 0, 0))
    assert dict(c.env) == {"PATH": "/bin", "A": "1"}
    assert c.cpuset_cpus == frozenset({2, 3}) and c.cpuset_mems == frozenset({0})
    assert c.annotations["numa.nri.io/topology-policy"] == "single-numa-node"
    assert c.pod.annotations == c.annotations


def test_a_standalone_container_is_a_pod_of_its_own():
    c = runtime_container(spec(), CID)
    assert c.name == CID and c.pod.id == CID
    assert pod_identity(c.pod) == (CID, "default", CID)
    assert pod_qos(c.pod) is None  # computed from the resources
    assert c.pod.cgroup_parent == "/nri-numa"


def test_limits_alone_make_a_guaranteed_exclusive_request():
    # What `podman run --cpus 1 --memory 64m` and the runc example write.
    c = runtime_container(spec(cpu={"quota": 100000, "period": 100000},
                               memory={"limit": 64 * MIB}), CID)
    r = container_request(c, pod_qos(c.pod))
    assert (r.cpu_request, r.cpu_limit, r.memory_request, r.memory_limit) == (
        1000, 1000, 64 * MIB, 64 * MIB)


def test_the_runc_example_config_asks_for_one_exclusive_cpu():
    example = json.loads((REPO / "hooks" / "runc-config.example.json").read_text())
    c = runtime_container(example, "example")
    r = container_request(c, pod_qos(c.pod))
    assert r.cpu_request == r.cpu_limit == 1000 and r.memory_request == r.memory_limit > 0


def test_containerd_annotations_name_the_pod_and_container():
    s = spec()
    s["linux"]["cgroupsPath"] = f"/kubepods/burstable/pod{UID}/{CID}"
    s["annotations"] = {"io.kubernetes.cri.sandbox-id": "sb1",
                        "io.kubernetes.cri.sandbox-uid": UID,
                        "io.kubernetes.cri.sandbox-name": "web",
                        "io.kubernetes.cri.sandbox-namespace": "shop",
                        "io.kubernetes.cri.container-name": "app",
                        "io.kubernetes.cri.container-type": "container"}
    c = runtime_container(s, CID)
    assert (c.name, c.pod.id) == ("app", "sb1")
    assert pod_identity(c.pod) == (UID, "shop", "web")
    assert pod_qos(c.pod) is QosClass.BURSTABLE
    assert not is_sandbox(c.annotations)


def test_crio_labels_name_the_pod_and_container():
    labels = {"io.kubernetes.pod.uid": UID, "io.kubernetes.pod.name": "db",
              "io.kubernetes.pod.namespace": "prod", "io.kubernetes.container.name": "pg"}
    s = spec()
    s["linux"]["cgroupsPath"] = f"kubepods-pod{UID.replace('-', '_')}.slice:crio:{CID}"
    s["annotations"] = {"io.kubernetes.cri-o.SandboxID": "sb2",
                        "io.kubernetes.cri-o.ContainerType": "container",
                        "io.kubernetes.cri-o.Labels": json.dumps(labels)}
    c = runtime_container(s, CID)
    assert (c.name, c.pod.id) == ("pg", "sb2")
    assert pod_identity(c.pod) == (UID, "prod", "db")
    assert pod_qos(c.pod) is QosClass.GUARANTEED


@pytest.mark.parametrize("annotations, sandbox", [
    ({"io.kubernetes.cri.container-type": "sandbox"}, True),
    ({"io.kubernetes.cri-o.ContainerType": "sandbox"}, True),
    ({"io.kubernetes.cri-o.ContainerType": "container"}, False),
    ({}, False),
])
def test_sandbox_containers_are_recognised(annotations, sandbox):
    assert is_sandbox(annotations) is sandbox


def test_state_annotations_add_to_the_spec_and_the_spec_wins():
    s = spec()
    s["annotations"] = {"a": "spec"}
    c = runtime_container(s, CID, {"a": "state", "b": "state"})
    assert dict(c.annotations) == {"a": "spec", "b": "state"}


@pytest.mark.parametrize("path, parent", [
    ("/libpod_parent/libpod-abc", "/libpod_parent"),
    ("/kubepods/besteffort/podX/abc/", "/kubepods/besteffort/podX"),
    ("machine.slice:libpod:abc", "machine.slice"),
    ("system.slice:ohl:sd1", "system.slice"),
    ("alone", ""),
    ("", ""),
])
def test_cgroup_parent(path, parent):
    assert cgroup_parent(path) == parent


def test_an_empty_spec_is_a_container_without_resources():
    c = runtime_container({}, CID)
    assert c.cpu_shares is c.cpu_quota is c.memory_limit is None
    assert c.devices == () and not c.hugepage_limits and c.cpuset_cpus is None


def _with(path: str, value) -> dict:
    s = copy.deepcopy(spec(cpu={}, memory={}))
    node = s
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return s


@pytest.mark.parametrize("path, value, named", [
    ("linux.resources.cpu.shares", "1024", "linux.resources.cpu.shares"),
    ("linux.resources.cpu.quota", 1.5, "linux.resources.cpu.quota"),
    ("linux.resources.cpu.period", True, "linux.resources.cpu.period"),
    ("linux.resources.memory.limit", "1G", "linux.resources.memory.limit"),
    ("linux.resources.cpu.cpus", "0-", "linux.resources.cpu.cpus"),
    ("linux.resources.cpu.cpus", "0-4294967295", "linux.resources.cpu.cpus"),  # not expanded
    ("linux.resources.cpu.mems", "0-99999999", "linux.resources.cpu.mems"),
    ("linux.resources.cpu", [], "linux.resources.cpu"),
    ("linux.resources.hugepageLimits", [{"pageSize": "3XB", "limit": 1}], "hugepageLimits[0]"),
    ("linux.resources.hugepageLimits", [{"pageSize": "2MB"}], "hugepageLimits[0]"),
    ("linux.resources.hugepageLimits", {}, "hugepageLimits"),
    ("linux.devices", [{"path": "/dev/x", "type": "c", "major": 1}], "linux.devices[0]"),
    ("linux.devices", [{"path": "/dev/x", "type": "z", "major": 1, "minor": 2}], "linux.devices[0]"),
    ("linux.cgroupsPath", 7, "linux.cgroupsPath"),
    ("process.env", "A=1", "process.env"),
    ("annotations", {"a": 1}, "annotations"),
    ("annotations", {"io.kubernetes.cri-o.Labels": "{not json"}, "io.kubernetes.cri-o.Labels"),
])
def test_bad_fields_are_named(path, value, named):
    with pytest.raises(RuntimeInputError, match=named.replace(".", r"\.").replace("[", r"\[")):
        runtime_container(_with(path, value), CID)


def test_a_spec_that_is_not_an_object_is_refused():
    with pytest.raises(RuntimeInputError, match="spec must be an object"):
        runtime_container(["not", "a", "spec"], CID)

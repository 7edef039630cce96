"""The virtual nodes' objects: what a kubelet on the synthetic machine would report, names and
counts checked with one line each."""

from __future__ import annotations

import pytest

from nri_numa.cluster.virtual_node_objects import (VirtualNodeError, allocatable, capacity,
                                                   default_config, lease_object, micro_time,
                                                   node_object, parse_spec, virtual_nodes)
from nri_numa.engine.config_reader import config_from_mapping


def test_capacity_and_allocatable_come_from_the_machine_and_the_configuration():
    [dgx] = virtual_nodes([parse_spec("dgx-h100")], default_config())
    assert dgx.name == "virtual-dgx-h100-0"
    cap, alloc = capacity(dgx.ctx), allocatable(dgx.ctx)
    assert (cap["cpu"], alloc["cpu"]) == ("224", "222")  # kubeReserved cpu 2: one core
    assert cap["nvidia.com/gpu"] == alloc["nvidia.com/gpu"] == "8"
    # nri-numa's own pci/<vendor>:<device> names are not resource names the API accepts
    assert not [name for name in cap if name.startswith("pci/")]
    huge = int(cap["hugepages-1Gi"])
    assert huge > 0 and int(alloc["memory"]) == int(cap["memory"]) - huge

    reserved = config_from_mapping({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0-3",
                                    "systemReserved": {"memory": "1Gi"}})
    [gb] = virtual_nodes([parse_spec("gb200")], reserved, prefix="lab-")
    assert gb.name == "lab-gb200-0"
    assert allocatable(gb.ctx)["cpu"] == "140"
    assert int(capacity(gb.ctx)["memory"]) - int(allocatable(gb.ctx)["memory"]) \
        == 2**30 + int(capacity(gb.ctx)["hugepages-2Mi"])


def test_counts_make_one_node_each_and_bad_specs_are_one_line():
    nodes = virtual_nodes([parse_spec("dgx-h100=2"), parse_spec("amd-epyc-2s-nps4")],
                          default_config())
    assert [n.name for n in nodes] == ["virtual-dgx-h100-0", "virtual-dgx-h100-1",
                                       "virtual-amd-epyc-2s-nps4-0"]
    assert nodes[0].ctx is nodes[1].ctx  # one engine context per preset
    for text, problem in (("nope", "no preset 'nope'"), ("gb200=0", "count must be 1 to"),
                          ("gb200=two", "count must be 1 to")):
        with pytest.raises(VirtualNodeError, match=problem) as e:
            parse_spec(text)
        assert "\n" not in str(e.value)
    with pytest.raises(VirtualNodeError, match="named twice"):
        virtual_nodes([parse_spec("gb200"), parse_spec("gb200")], default_config())
    with pytest.raises(VirtualNodeError, match="not a DNS label"):
        virtual_nodes([parse_spec("gb200")], default_config(), prefix="Big_")
    with pytest.raises(VirtualNodeError, match="does not fit"):
        virtual_nodes([parse_spec("gb200")], config_from_mapping(
            {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0-999"}))


def test_the_node_is_ready_tainted_and_its_lease_is_owned_by_it():
    [node] = virtual_nodes([parse_spec("gb200")], default_config())
    obj = node_object(node, 1_800_000_000.5)
    ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert obj["spec"]["taints"] == [{"key": "numa.nri.io/virtual-node", "value": "gb200",
                                      "effect": "NoSchedule"}]
    assert "taints" not in node_object(node, 0, taint=False)["spec"]
    assert all(obj["status"]["nodeInfo"].values())  # typed clients require every field
    lease = lease_object(node.name, 1_800_000_000.25, "uid-1")
    assert lease["spec"]["renewTime"] == "2027-01-15T08:00:00.250000Z"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    # The client drops a zero fraction; the API server refuses a MicroTime without one.
    assert micro_time(1_800_000_000.0).endswith(".000001Z")


def test_the_command_line_refuses_bad_input_with_one_line(tmp_path):
    import subprocess
    import sys

    bad_config = tmp_path / "config.yaml"
    bad_config.write_text("topologyManagerPolicy: sometimes\n")
    for args, problem in ((["nope"], "no preset 'nope'"),
                          (["--config", str(tmp_path / "missing.yaml"), "gb200"], "--config"),
                          (["--config", str(bad_config), "gb200"], "sometimes")):
        done = subprocess.run([sys.executable, "-m", "nri_numa.cluster.virtual_nodes", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.startswith("virtual-nodes: error: ") and problem in done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr

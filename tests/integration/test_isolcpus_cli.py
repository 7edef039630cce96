"""`nri-numa topology` and `nri-numa simulate` on a machine with isolated CPUs, read from a
sysfs tree that has /sys/devices/system/cpu/isolated."""

from __future__ import annotations

import json

import pytest

from nri_numa.cli import main
from nri_numa.topology.synthetic import MachineSpec, build_topology, write_tree

PODS = """\
apiVersion: v1
kind: Pod
metadata: {name: be}
spec:
  containers: [{name: app}]
---
apiVersion: v1
kind: Pod
metadata:
  name: iso
  annotations: {numa.nri.io/isolated-cpus: require}
spec:
  containers:
  - name: app
    resources:
      limits: {cpu: "2", memory: 1Gi}
      requests: {cpu: "2", memory: 1Gi}
"""


@pytest.fixture
def root(tmp_path):
    machine = tmp_path / "machine"
    machine.mkdir()
    write_tree(build_topology(MachineSpec(name="iso", sockets=1, nodes_per_socket=2,
                                          cores_per_node=4, threads_per_core=1,
                                          isolcpus={2, 3, 7})), machine)
    return str(machine)


def run(capsys, *argv: str) -> str:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert (rc, err) == (0, ""), err
    return out


def test_topology_shows_the_isolated_cpus_of_each_node(capsys, root):
    table = run(capsys, "topology", "--root", root, "--no-nvml").splitlines()
    assert table[0].split()[:4] == ["node", "cpus", "#cpus", "isolated"]
    assert table[1].split()[:4] == ["0", "0-3", "4", "2-3"]
    assert table[2].split()[:4] == ["1", "4-7", "4", "7"]
    tree = run(capsys, "topology", "--root", root, "--no-nvml", "--tree").splitlines()
    assert "    NUMANode 0 (64.0 GiB; isolated CPUs 2-3)" in tree
    assert "    NUMANode 1 (64.0 GiB; isolated CPUs 7)" in tree


def test_simulate_keeps_isolated_cpus_out_of_the_pool_and_counts_them(capsys, root, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n"
                      "topologyManagerPolicy: single-numa-node\n")
    pods = tmp_path / "pods.yaml"
    pods.write_text(PODS)
    argv = ("simulate", "--root", root, "--no-nvml", "--config", str(config), "--pods", str(pods))
    text = run(capsys, *argv).splitlines()
    assert "shared pool: 0-1,4-6 (5 CPUs)" in text
    header = next(line for line in text if line.startswith("NODE"))
    assert header.split()[:7] == ["NODE", "CPUS", "EXCLUSIVE", "RESERVED", "FREE", "CPUS",
                                  "ISOLATED"]
    summary = json.loads(run(capsys, *argv, "--json"))
    assert summary["shared_pool"] == "0-1,4-6"
    [be, iso] = summary["steps"]
    assert iso["decision"]["placements"][0]["cpus"] == "2-3"
    nodes = {n["node"]: n for n in summary["nodes"]}
    assert (nodes["0"]["isolated"], nodes["0"]["free_isolated"]) == ("2-3", "0")
    assert (nodes["1"]["isolated"], nodes["1"]["free_isolated"]) == ("7", "1")
    assert nodes["0"]["free_cpus"] == "1"

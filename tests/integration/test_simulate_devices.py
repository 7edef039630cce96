"""Devices through the real `nri-numa simulate`: GPUs by limits, NICs by the per-container
annotation, aligned on one node and chosen by PCIe proximity and link score; refusals that name
the devices."""

from __future__ import annotations

import json

import yaml

from nri_numa.cli import main
from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.parts import pcie_level
from nri_numa.topology.synthetic import preset_topology

CX7 = "pci/15b3:1021"


def _simulate(capsys, tmp_path, preset: str, config: dict, pods: list[dict]) -> list[dict]:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(pods))
    rc = main(["simulate", "--preset", preset, "--config", str(tmp_path / "config.yaml"),
               "--pods", str(tmp_path / "pods.yaml"), "--json"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    return [s for s in json.loads(out)["steps"] if s["action"] == "admit"]


def _pod(name: str, cpu: str, gpus: int, annotations: dict | None = None) -> dict:
    limits = {"cpu": cpu, "memory": "16Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
    return {"metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def _config(policy: str, reserved: str) -> dict:
    return {"topologyManagerPolicy": policy, "cpuManagerPolicy": "static",
            "reservedSystemCPUs": reserved, "memoryManagerPolicy": "Static",
            "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}


def test_dgx_cpus_memory_gpus_and_a_nic_on_one_node_the_nic_beside_the_gpus(capsys, tmp_path):
    dgx = preset_topology("dgx-h100")
    pods = [_pod("train", "8", 2, {"numa.nri.io/devices.main": "nic=1"})]
    [step] = _simulate(capsys, tmp_path, "dgx-h100", _config("single-numa-node", "0,112"), pods)
    [placement] = step["decision"]["placements"]
    gpus = [g for g in dgx.gpus if g.uuid in placement["devices"]["nvidia.com/gpu"]]
    [nic] = placement["devices"][CX7]
    cpus = parse_list(placement["cpus"])
    nodes = ({c.numa for c in dgx.cpus if c.id in cpus} | {g.numa_node for g in gpus}
             | set(parse_list(placement["mems"])) | {dgx.pci(nic).numa_node})
    assert len(cpus) == 8 and len(gpus) == 2 and len(nodes) == 1
    assert [pcie_level(dgx.pci(nic), dgx.pci(g.pci_address)) for g in gpus].count("single") == 1


def test_pcie_4gpu_takes_gpus_by_switch_pair(capsys, tmp_path):
    t = preset_topology("pcie-4gpu")
    switch = {g.uuid: t.pci(g.pci_address).bridges[:2] for g in t.gpus}  # root port + upstream
    steps = _simulate(capsys, tmp_path, "pcie-4gpu", _config("best-effort", "0"),
                      [_pod("pair", "2", 2), _pod("other-pair", "2", 2)])
    pairs = [step["decision"]["placements"][0]["devices"]["nvidia.com/gpu"] for step in steps]
    assert all(len({switch[g] for g in pair}) == 1 for pair in pairs)  # both behind one switch
    assert set(pairs[0]).isdisjoint(pairs[1])
    [four] = _simulate(capsys, tmp_path, "pcie-4gpu", _config("best-effort", "0"),
                       [_pod("four", "2", 4)])
    got = four["decision"]["placements"][0]["devices"]["nvidia.com/gpu"]
    assert sorted(got) == sorted(switch) and len(set(switch.values())) == 2  # both pairs


def test_devices_that_cannot_be_aligned_are_refused_naming_them(capsys, tmp_path):
    [step] = _simulate(capsys, tmp_path, "pcie-4gpu", _config("restricted", "0"),
                       [_pod("three", "2", 3)])
    rejection = step["decision"]["rejection"]
    assert rejection["reason"] == "TopologyAffinityError"
    assert "nvidia.com/gpu: asked 3 devices" in rejection["message"]
    [nic] = _simulate(capsys, tmp_path, "pcie-4gpu", _config("restricted", "0"),
                      [_pod("nics", "2", 0, {"numa.nri.io/devices.main": "nic=3"})])
    rejection = nic["decision"]["rejection"]
    assert rejection["reason"] == "TopologyAffinityError"
    assert "pci/15b3:101d: asked 3 devices; free node 0: 1 free, node 1: 1 free" in \
        rejection["message"]

import json
from dataclasses import replace

import pytest

from nri_numa.topology.model import Topology, TopologyFormatError
from nri_numa.topology.parts import Cpu, Gpu, HugePages, Nic, NumaNode, PciDevice, pcie_level


def small_topology() -> Topology:
    return Topology(
        cpus=(Cpu(0, 0, core=0, socket=0, die=0, l3=0), Cpu(1, 0, core=0, socket=0, die=0, l3=0),
              Cpu(2, 1, core=2, socket=1, die=2, l3=2), Cpu(3, 1, online=False)),
        numa_nodes=(NumaNode(0, {0, 1}, 2**34, {2048: HugePages(8, 6)}, {0: 10, 1: 21}),
                    NumaNode(1, {2}, 2**34, {}, {0: 21, 1: 10}),
                    NumaNode(4, set(), 2**35, {}, {0: 40, 1: 40, 4: 10})),
        isolcpus={1},
        pci_devices=(PciDevice("0000:1b:00.0", 0, 0x030200, 0x10DE, 0x2330, {0, 1},
                               ("0000:00:01.0", "0000:01:00.0", "0000:02:00.0"), "pci0000:00"),),
        nics=(Nic("ib0", "0000:1a:00.0", ("0000:1a:00.2",), ("mlx5_0",)),),
        gpus=(Gpu(0, "GPU-1", "0000:1b:00.0", 0, minor=3, name="H100", nvswitch_links=18,
                  nvlink_peers={"0000:43:00.0": 18}, pcie={"0000:43:00.0": "node"}),),
        warnings=("something odd",),
    )


def test_json_round_trip_is_identity():
    t = small_topology()
    again = Topology.from_json(t.to_json())
    assert again == t
    assert again.to_json() == t.to_json()


def test_json_has_the_documented_top_level_keys():
    keys = set(json.loads(small_topology().to_json()))
    assert keys == {"schema_version", "cpus", "isolcpus", "numa_nodes", "pci_devices", "nics",
                    "gpus", "warnings"}


def test_values_are_immutable():
    t = small_topology()
    with pytest.raises(AttributeError):
        t.cpus = ()
    with pytest.raises(TypeError):
        t.numa_nodes[0].distances[0] = 99
    with pytest.raises(TypeError):
        t.gpus[0].nvlink_peers["x"] = 1


def test_lookups_by_node_id_and_pci_address():
    topo = small_topology()
    assert topo.node(4).distances == {0: 40, 1: 40, 4: 10}
    with pytest.raises(KeyError, match="no NUMA node 2"):
        topo.node(2)
    assert topo.pci("0000:1b:00.0").vendor == 0x10DE and topo.pci("0000:1a:00.0") is None
    # The index is no part of the value: equal before and after a lookup, fresh after replace.
    assert topo == small_topology() and json.loads(topo.to_json()) == json.loads(
        small_topology().to_json())
    fewer = replace(topo, pci_devices=())
    assert fewer.pci("0000:1b:00.0") is None and topo.pci("0000:1b:00.0") is not None


def test_collections_are_kept_sorted():
    t = Topology(cpus=(Cpu(3, 0), Cpu(1, 0)), numa_nodes=(NumaNode(2, (), 0), NumaNode(0, (), 0)))
    assert [c.id for c in t.cpus] == [1, 3]
    assert [n.id for n in t.numa_nodes] == [0, 2]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("cpus"), "cpus is missing"),
    (lambda d: d.update(schema_version=99), "schema_version is 99"),
    (lambda d: d["cpus"][0].update(id="x"), r"cpus\[0\].id must be an integer"),
    (lambda d: d["cpus"][1].update(online="yes"), r"cpus\[1\].online must be true or false"),
    (lambda d: d["numa_nodes"][0].update(cpus="0-a"), r"numa_nodes\[0\].cpus"),
    (lambda d: d["numa_nodes"][1]["distances"].update({"0": None}),
     r"numa_nodes\[1\].distances.0 must be an integer"),
    (lambda d: d["gpus"][0]["pcie"].update({"0000:43:00.0": "far"}), r"gpus\[0\].pcie"),
    (lambda d: d.update(nics={}), "nics must be a list"),
    (lambda d: d["pci_devices"][0].update(bridges="x"), "bridges must be a list"),
])
def test_bad_json_names_the_field(mutate, message):
    data = json.loads(small_topology().to_json())
    mutate(data)
    with pytest.raises(TopologyFormatError, match=message):
        Topology.from_dict(data)


def test_not_json_at_all():
    with pytest.raises(TopologyFormatError, match="not JSON"):
        Topology.from_json("{")
    with pytest.raises(TopologyFormatError, match="must be an object"):
        Topology.from_json("[]")


def _dev(address, bridges, host="pci0000:00", node=0):
    return PciDevice(address, node, 0x030200, 0x10DE, 1, (), tuple(bridges), host)


@pytest.mark.parametrize("a, b, level", [
    # two GPUs on the downstream ports of one switch under root port 00:01.0
    (_dev("0000:03:00.0", ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]),
     _dev("0000:04:00.0", ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]), "single"),
    # two functions of one card directly under a root port
    (_dev("0000:01:00.0", ["0000:00:01.0"]), _dev("0000:01:00.1", ["0000:00:01.0"]), "single"),
    # a second-level switch: one device crosses two switches
    (_dev("0000:05:00.0", ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0",
                           "0000:04:00.0"]),
     _dev("0000:06:00.0", ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]), "multiple"),
    # different root ports of one host bridge
    (_dev("0000:03:00.0", ["0000:00:01.0"]), _dev("0000:04:00.0", ["0000:00:02.0"]), "hostbridge"),
    # different host bridges, same node / other node / unknown node
    (_dev("0000:03:00.0", ["0000:00:01.0"]), _dev("0000:83:00.0", ["0000:80:01.0"], "pci0000:80"),
     "node"),
    (_dev("0000:03:00.0", ["0000:00:01.0"]),
     _dev("0000:83:00.0", ["0000:80:01.0"], "pci0000:80", node=1), "system"),
    (_dev("0000:03:00.0", ["0000:00:01.0"], node=None),
     _dev("0000:83:00.0", ["0000:80:01.0"], "pci0000:80", node=None), "system"),
])
def test_pcie_level(a, b, level):
    assert pcie_level(a, b) == level
    assert pcie_level(b, a) == level
    assert pcie_level(a, a) == "internal"

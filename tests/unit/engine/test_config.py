"""Engine configuration: KubeletConfiguration keys, the kubelet's checks, and machine checks."""

from __future__ import annotations

from typing import Any

import pytest

from nri_numa.engine.config import (ConfigError, CpuManagerOptions, CpuManagerPolicy, EngineConfig,
                                    MemoryManagerPolicy, MemoryReservation, TopologyPolicy,
                                    TopologyScope)
from nri_numa.engine.config_machine import validate_for_topology
from nri_numa.engine.config_reader import KNOWN_KEYS, config_from_mapping
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, HugePages, NumaNode

GI = 2**30
STATIC = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}


def problems(obj: Any) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as e:
        config_from_mapping(obj)
    return e.value.problems


def one_problem(obj: Any) -> str:
    found = problems(obj)
    assert len(found) == 1, found
    return found[0]


def machine(nodes: int = 2, sockets: int = 2, cpus_per_node: int = 4, *,
            distances: bool = True, hugepages_1g: int = 0) -> Topology:
    """`nodes` NUMA nodes spread evenly over `sockets` sockets, no SMT, 8 GiB per node."""
    cpus, numa = [], []
    for node in range(nodes):
        ids = range(node * cpus_per_node, (node + 1) * cpus_per_node)
        socket = node * sockets // nodes
        cpus += [Cpu(i, node, core=i, socket=socket) for i in ids]
        numa.append(NumaNode(
            node, frozenset(ids), 8 * GI,
            hugepages={1048576: HugePages(hugepages_1g, hugepages_1g)} if hugepages_1g else {},
            distances={other: 10 if other == node else 20 for other in range(nodes)}
            if distances else {}))
    return Topology(tuple(cpus), tuple(numa))


# --- defaults and reading -----------------------------------------------------------------


def test_defaults():
    for config in (EngineConfig(), config_from_mapping({}), config_from_mapping(None)):
        assert config.topology_manager_policy is TopologyPolicy.NONE
        assert config.topology_manager_scope is TopologyScope.CONTAINER
        assert config.cpu_manager_policy is CpuManagerPolicy.NONE
        assert config.memory_manager_policy is MemoryManagerPolicy.NONE
        assert config.topology_manager_policy_options == {}
        assert config.cpu_options == CpuManagerOptions()
        assert config.reserved_system_cpus == frozenset()
        assert config.reserved_memory == ()
        assert config.allow_pod_overrides is True
        assert config.prefer_closest_numa_nodes is False
        assert config.max_allowable_numa_nodes is None  # no limit unless asked for


def test_full_configuration():
    config = config_from_mapping({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
        "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true",
                                         "max-allowable-numa-nodes": "16"},
        "cpuManagerPolicy": "static",
        "cpuManagerPolicyOptions": {"full-pcpus-only": "true",
                                    "distribute-cpus-across-numa": "True",
                                    "strict-cpu-reservation": "0"},
        "reservedSystemCPUs": "0-1,8-9",
        "kubeReserved": {"cpu": "500m", "memory": "1Gi"},
        "systemReserved": {"cpu": "1", "ephemeral-storage": "10Gi", "pid": "1000"},
        "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}},
                           {"numaNode": 1, "limits": {"memory": "512Mi", "hugepages-1Gi": "1Gi"}}],
        "allowPodOverrides": False,
    })
    assert config.topology_manager_policy is TopologyPolicy.SINGLE_NUMA_NODE
    assert config.topology_manager_scope is TopologyScope.POD
    assert config.prefer_closest_numa_nodes is True
    assert config.max_allowable_numa_nodes == 16
    assert config.cpu_options == CpuManagerOptions(full_pcpus_only=True,
                                                   distribute_cpus_across_numa=True)
    assert config.reserved_system_cpus == {0, 1, 8, 9}
    assert config.num_reserved_cpus == 4  # the explicit list wins over kube/systemReserved
    assert config.kube_reserved == {"cpu": 500, "memory": GI}
    assert config.reserved_memory == (MemoryReservation(0, {"memory": GI}),
                                      MemoryReservation(1, {"memory": GI // 2,
                                                            "hugepages-1Gi": GI}))
    assert config.reserved_memory_by_node == {0: {"memory": GI},
                                              1: {"memory": GI // 2, "hugepages-1Gi": GI}}
    assert config.allow_pod_overrides is False


def test_yaml_scalars_in_option_maps_are_taken_as_strings():
    config = config_from_mapping({**STATIC, "cpuManagerPolicyOptions": {"full-pcpus-only": True},
                                  "topologyManagerPolicyOptions": {"max-allowable-numa-nodes": 8}})
    assert config.cpu_manager_policy_options == {"full-pcpus-only": "true"}
    assert config.max_allowable_numa_nodes == 8


def test_reserved_cpus_from_kube_and_system_reserved():
    config = config_from_mapping({"cpuManagerPolicy": "static", "kubeReserved": {"cpu": "500m"},
                                  "systemReserved": {"cpu": "1"}})
    assert config.num_reserved_cpus == 2  # ⌈1.5⌉: fractional CPUs cannot be exclusive
    assert config.reserved_system_cpus == frozenset()


def test_direct_construction_coerces_and_checks():
    config = EngineConfig(topology_manager_policy="restricted", cpu_manager_policy="static",
                          reserved_system_cpus=[0, 1])
    assert config.topology_manager_policy is TopologyPolicy.RESTRICTED
    assert config.reserved_system_cpus == frozenset({0, 1})
    with pytest.raises(ConfigError, match="topologyManagerPolicy: 'strict' is not one of none, "
                                          "best-effort, restricted, single-numa-node"):
        EngineConfig(topology_manager_policy="strict")


def test_policy_strictness_order():
    assert [p.strictness for p in (TopologyPolicy.NONE, TopologyPolicy.BEST_EFFORT,
                                   TopologyPolicy.RESTRICTED,
                                   TopologyPolicy.SINGLE_NUMA_NODE)] == [0, 1, 2, 3]
    assert TopologyScope.CONTAINER.strictness < TopologyScope.POD.strictness


# --- key errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("obj, fragment", [
    ({"topologyManagerPolicy": "strict"},
     "topologyManagerPolicy: 'strict' is not one of none, best-effort, restricted, "
     "single-numa-node"),
    ({"topologyManagerScope": "node"}, "topologyManagerScope: 'node' is not one of container, pod"),
    ({"cpuManagerPolicy": "Static"}, "cpuManagerPolicy: 'Static' is not one of none, static"),
    ({"memoryManagerPolicy": "static"},
     "memoryManagerPolicy: 'static' is not one of None, Static"),
    ({"topologyManagerPolicyOptions": ["a"]},
     "topologyManagerPolicyOptions: must be a map of option name to string value"),
    ({"cpuManagerPolicyOptions": {"full-pcpus-only": None}},
     "cpuManagerPolicyOptions: option 'full-pcpus-only' must have a string value, not None"),
    ({"reservedSystemCPUs": "0-a"},
     "reservedSystemCPUs: invalid configuration: unable to parse reservedSystemCPUs "
     "(--reserved-cpus) 0-a, error:"),
    ({"reservedSystemCPUs": ["0"]}, "reservedSystemCPUs: must be a CPU list"),
    ({"kubeReserved": {"cpu": "lots"}}, 'kubeReserved: cpu: bad quantity "lots"'),
    ({"systemReserved": {"gpu": "1"}}, "systemReserved: cannot reserve 'gpu' (allowed: cpu, "
                                       "memory, ephemeral-storage, pid)"),
    ({"reservedMemory": {"numaNode": 0}}, "reservedMemory: must be a list"),
    ({"reservedMemory": [{"numaNode": -1, "limits": {"memory": "1Gi"}}]},
     "reservedMemory: [0].numaNode: must be a NUMA node id (0 or more), not -1"),
    ({"reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gb"}}]},
     'reservedMemory: [0].limits.memory: bad quantity "1Gb"'),
    ({"reservedMemory": [{"numaNode": 0, "limit": {"memory": "1Gi"}}]},
     "reservedMemory: [0]: must be a map with the keys numaNode and limits"),
    ({"allowPodOverrides": "yes"}, "allowPodOverrides: must be true or false, not 'yes'"),
    ({"kind": "Pod"}, "kind: 'Pod' is not 'KubeletConfiguration'"),
    ({"apiVersion": "v1"}, "apiVersion: 'v1' is not 'kubelet.config.k8s.io/v1beta1'"),
])
def test_bad_values_name_key_value_and_allowed(obj, fragment):
    assert fragment in one_problem(obj)


def test_unknown_key_lists_known_keys_and_suggests():
    message = one_problem({"topologyManagerPolcy": "restricted"})
    assert "unknown key 'topologyManagerPolcy'; did you mean topologyManagerPolicy?" in message
    for key in KNOWN_KEYS:
        assert key in message
    assert "did you mean" not in one_problem({"colour": "blue"})


def test_every_problem_is_reported_at_once():
    found = problems({"topologyManagerPolicy": "x", "cpuManagerPolicy": "y", "bogus": 1})
    assert len(found) == 3
    with pytest.raises(ConfigError) as e:
        config_from_mapping({"topologyManagerPolicy": "x", "cpuManagerPolicy": "y"})
    assert str(e.value).startswith("2 problems in the configuration:\n  - topologyManagerPolicy")


def test_configuration_must_be_a_map():
    assert "must be a map of keys, not list" in one_problem(["topologyManagerPolicy"])


# --- the kubelet's combination checks -----------------------------------------------------


@pytest.mark.parametrize("obj, text", [
    ({"topologyManagerPolicyOptions": {"prefer-nearest": "true"}},
     'unknown Topology Manager Policy option: "prefer-nearest"'),
    ({"topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "yes"}},
     'bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: parsing "yes": '
     "invalid syntax"),
    ({"topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "many"}},
     'unable to convert policy option to integer "max-allowable-numa-nodes": strconv.Atoi: '
     'parsing "many": invalid syntax'),
    ({"topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "99999999999999999999"}},
     "value out of range"),
    ({"topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "4"}},
     'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
    ({"cpuManagerPolicyOptions": {"full-pcpus-only": "true"}},
     "None policy: received unsupported options=map[full-pcpus-only:true]"),
    ({**STATIC, "cpuManagerPolicyOptions": {"full-pcpu-only": "true"}},
     'unknown CPU Manager Policy option: "full-pcpu-only"'),
    ({**STATIC, "cpuManagerPolicyOptions": {"align-by-socket": "on"}},
     'bad value for option "align-by-socket": strconv.ParseBool: parsing "on": invalid syntax'),
    ({**STATIC, "cpuManagerPolicyOptions": {"full-pcpus-only": "true",
                                            "distribute-cpus-across-cores": "true"}},
     "static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at "
     "the same time"),
    ({**STATIC, "cpuManagerPolicyOptions": {"distribute-cpus-across-numa": "true",
                                            "distribute-cpus-across-cores": "true"}},
     "static policy options distribute-cpus-across-numa and distribute-cpus-across-cores can not"),
    ({**STATIC, "cpuManagerPolicyOptions": {"prefer-align-cpus-by-uncorecache": "true",
                                            "distribute-cpus-across-cores": "1"}},
     "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-cores"),
    ({**STATIC, "cpuManagerPolicyOptions": {"prefer-align-cpus-by-uncorecache": "true",
                                            "distribute-cpus-across-numa": "t"}},
     "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa"),
    ({**STATIC, "topologyManagerPolicy": "single-numa-node",
      "cpuManagerPolicyOptions": {"align-by-socket": "true"}},
     "single-numa-node policy is incompatible with CPUManager align-by-socket policy option"),
    ({"cpuManagerPolicy": "static"},
     "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be "
     "greater than zero"),
    ({"cpuManagerPolicy": "static", "kubeReserved": {"memory": "1Gi"}},
     "the static policy requires systemreserved.cpu + kubereserved.cpu"),
    ({"memoryManagerPolicy": "Static"},
     "[memorymanager] you should specify the system reserved memory"),
    ({"memoryManagerPolicy": "Static",
      "reservedMemory": [{"numaNode": 0, "limits": {"hugepages-2Mi": "2Mi"}}]},
     "[memorymanager] you should specify the system reserved memory"),
    ({"reservedMemory": [{"numaNode": 0, "limits": {"cpu": "1"}}]},
     'the limit type "cpu" for NUMA node 0 is not supported, only [memory '
     "hugepages-<HugePageSize>] is accepted"),
    ({"reservedMemory": [{"numaNode": 0, "limits": {"hugepages-x": "1"}}]},
     'the limit type "hugepages-x" for NUMA node 0 is not supported'),
    ({"reservedMemory": [{"numaNode": 1, "limits": {"memory": "0"}}]},
     'reserved memory may not be zero for NUMA node 1 and resource "memory"'),
    ({"reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}},
                         {"numaNode": 0, "limits": {"memory": "2Gi"}}]},
     'reservedMemory[1]: invalid configuration: the reserved memory has a duplicate value for '
     'NUMA node 0 and resource "memory"'),
])
def test_kubelet_combination_errors(obj, text):
    assert text in one_problem(obj)


def test_options_are_only_parsed_when_named():
    config = config_from_mapping({**STATIC, "cpuManagerPolicyOptions": {
        "align-by-socket": "false", "full-pcpus-only": "F"}})
    assert config.cpu_options == CpuManagerOptions()


def test_align_by_socket_is_fine_with_other_policies():
    config = config_from_mapping({**STATIC, "topologyManagerPolicy": "restricted",
                                  "cpuManagerPolicyOptions": {"align-by-socket": "true"}})
    assert config.cpu_options.align_by_socket


# --- machine checks -----------------------------------------------------------------------


def check(obj: dict, topology: Topology) -> tuple[str, ...]:
    try:
        validate_for_topology(config_from_mapping(obj), topology)
    except ConfigError as e:
        return e.problems
    return ()


def test_a_sound_configuration_passes_on_its_machine():
    obj = {**STATIC, "topologyManagerPolicy": "single-numa-node",
           "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true"},
           "memoryManagerPolicy": "Static",
           "reservedMemory": [{"numaNode": 1, "limits": {"memory": "1Gi", "hugepages-1Gi": "1Gi"}}]}
    assert check(obj, machine(hugepages_1g=2)) == ()


def test_no_numa_node_limit_unless_set():
    big = machine(nodes=16, sockets=2, cpus_per_node=1)
    assert check({"topologyManagerPolicy": "restricted"}, big) == ()
    limited = {"topologyManagerPolicy": "restricted",
               "topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "8"}}
    assert check(limited, big) == (
        "topologyManagerPolicyOptions: unsupported on machines with more than 8 NUMA Nodes "
        "(this machine has 16)",)
    # With policy none the kubelet does not count nodes either.
    assert check({**limited, "topologyManagerPolicy": "none"}, big) == ()


def test_prefer_closest_needs_distances():
    obj = {"topologyManagerPolicy": "best-effort",
           "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true"}}
    found = check(obj, machine(distances=False))
    assert len(found) == 2
    assert "cannot discover NUMA topology: error getting NUMA distances: NUMA node 0" in found[0]
    assert check({"topologyManagerPolicy": "best-effort"}, machine(distances=False)) == ()


def test_align_by_socket_needs_no_more_sockets_than_numa_nodes():
    obj = {**STATIC, "cpuManagerPolicyOptions": {"align-by-socket": "true"}}
    assert check(obj, machine(nodes=2, sockets=2)) == ()
    assert check(obj, machine(nodes=4, sockets=2)) == ()
    assert check(obj, machine(nodes=1, sockets=1)) == ()
    sockets_without_nodes = Topology(
        tuple(Cpu(i, 0, core=i, socket=i) for i in range(2)),
        (NumaNode(0, frozenset({0, 1}), GI),))
    assert check(obj, sockets_without_nodes) == (
        "cpuManagerPolicyOptions: Align by socket is not compatible with hardware where number "
        "of sockets are more than number of NUMA",)


def test_reserved_cpus_must_be_online():
    found = check({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,64"}, machine())
    assert found == ('reservedSystemCPUs: not all reserved cpus: "0,64" are present in '
                     'defaultCpuSet: "0-7"',)


def test_cannot_reserve_more_cpus_than_the_machine_has():
    found = check({"cpuManagerPolicy": "static", "systemReserved": {"cpu": "9"}}, machine())
    assert found == ("kubeReserved/systemReserved: [cpumanager] unable to reserve the required "
                     "amount of CPUs (size of 0-7 did not equal 9)",)
    # Only the static policy reserves CPUs.
    assert check({"systemReserved": {"cpu": "9"}}, machine()) == ()


def test_reserved_memory_must_fit_the_nodes():
    obj = {"reservedMemory": [{"numaNode": 2, "limits": {"memory": "1Gi"}},
                              {"numaNode": 0, "limits": {"memory": "9Gi"}},
                              {"numaNode": 1, "limits": {"hugepages-1Gi": "3Gi"}}]}
    assert check(obj, machine(hugepages_1g=2)) == (
        "reservedMemory[0]: the reserved memory configuration references a NUMA node 2 that does "
        "not exist on this machine",
        "reservedMemory[1]: reserves 9663676416 bytes of memory on NUMA node 0, which has "
        "8589934592",
        "reservedMemory[2]: reserves 3221225472 bytes of hugepages-1Gi on NUMA node 1, which has "
        "2147483648",
    )
    assert "which has 0" in check(
        {"reservedMemory": [{"numaNode": 0, "limits": {"hugepages-2Mi": "2Mi"}}]}, machine())[0]

import pytest

from nri_numa.engine.config import ConfigError
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import GPU_RESOURCE, EngineContext
from nri_numa.topology.synthetic import preset_topology


def test_reserved_cpus_from_kube_and_system_reserved_are_whole_cores_lowest_first():
    # intel-2s-ht: 48 cores, SMT sibling = cpu + 48; 1500m + 500m → 2 CPUs → core 0's threads
    ctx = EngineContext.build(preset_topology("intel-2s-ht"), config_from_mapping({
        "cpuManagerPolicy": "static", "kubeReserved": {"cpu": "1500m"},
        "systemReserved": {"cpu": "500m"}}))
    assert ctx.reserved_cpus == {0, 48}


def test_reserved_system_cpus_win():
    ctx = EngineContext.build(preset_topology("intel-2s-ht"), config_from_mapping({
        "cpuManagerPolicy": "static", "reservedSystemCPUs": "3,51",
        "kubeReserved": {"cpu": "4"}}))
    assert ctx.reserved_cpus == {3, 51}


def test_strict_reservation_keeps_reserved_cpus_out_of_the_shared_pool():
    topology = preset_topology("intel-2s-ht")
    ctx = EngineContext.build(topology, config_from_mapping({
        "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,48",
        "cpuManagerPolicyOptions": {"strict-cpu-reservation": "true"}}))
    assert ctx.empty_allocations().shared == topology.online_cpus - {0, 48}


def test_gpus_become_a_device_resource_keyed_by_uuid_on_their_node():
    topology = preset_topology("dgx-h100")
    resource = EngineContext.build(topology, config_from_mapping({})).devices[GPU_RESOURCE]
    for gpu in topology.gpus:
        assert resource.numa_nodes_of(gpu.uuid) == {gpu.numa_node}


def test_static_memory_without_reserved_memory_is_refused():
    with pytest.raises(ConfigError, match="reserved memory"):
        EngineContext.build(preset_topology("intel-2s-ht"),
                            config_from_mapping({"memoryManagerPolicy": "Static"}))

"""What a hook decides with: the configuration (JSON without the YAML parser, or YAML), a given
topology file, and the discovery kept in the state folder while the online CPUs match it."""

from __future__ import annotations

import json

import pytest

from nri_numa.hook.machine import (TOPOLOGY_CACHE, MachineError, cached_topology, load_config,
                                   load_machine)
from nri_numa.topology.model import Topology
from nri_numa.topology.synthetic import preset_topology, write_tree
from tests.integration.hook.fake_host import topology_file
from tests.tmpfs import fast_tmp

PRESET = preset_topology("intel-2s-ht")


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory):
    with fast_tmp(tmp_path_factory.mktemp("sysfs")) as root:
        write_tree(PRESET, root)
        yield root


def test_json_and_yaml_configs(tmp_path):
    as_json = tmp_path / "c.json"
    as_json.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}))
    as_yaml = tmp_path / "c.yaml"
    as_yaml.write_text("cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n")
    assert load_config(as_json) == load_config(as_yaml)
    assert str(load_config(as_json).cpu_manager_policy) == "static"
    assert str(load_config(None).cpu_manager_policy) == "none"


@pytest.mark.parametrize("text, named", [
    ('{"cpuManagerPolicy": "static"}', "reserved"),  # static needs a reservation
    ('{"topologyManagerPolcy": "none"}', "topologyManagerPolcy"),
    ("cpuManagerPolicy: [", "not valid YAML"),
])
def test_bad_configs_name_the_file_and_the_problem(tmp_path, text, named):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(MachineError, match=named) as e:
        load_config(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(MachineError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")


def test_discovery_is_kept_while_the_online_cpus_match(sysfs, tmp_path, monkeypatch):
    state = tmp_path / "state"
    first = cached_topology(state, sysfs)
    assert first.online_cpus == PRESET.online_cpus
    assert (state / TOPOLOGY_CACHE).is_file()

    def no_discovery(root):
        raise AssertionError("discovered again although the cache matches")

    import nri_numa.topology

    monkeypatch.setattr(nri_numa.topology, "discover", no_discovery)
    assert cached_topology(state, sysfs) == first


def test_a_changed_cpu_list_or_a_damaged_cache_means_discovering_again(sysfs, tmp_path):
    state = tmp_path / "state"
    cached_topology(state, sysfs)
    online = sysfs / "sys/devices/system/cpu/online"
    original = online.read_text()
    try:
        online.write_text("0-47\n")  # half the CPUs went offline
        again = cached_topology(state, sysfs)
    finally:
        online.write_text(original)
    assert again.online_cpus == frozenset(range(48))  # discovered again, and kept
    assert Topology.from_json((state / TOPOLOGY_CACHE).read_text()) == again
    (state / TOPOLOGY_CACHE).write_text("{damaged")
    assert cached_topology(state, sysfs).online_cpus == PRESET.online_cpus


def test_a_topology_file_and_a_config_that_does_not_fit(tmp_path):
    path = topology_file(tmp_path, PRESET)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "200"}))
    with pytest.raises(MachineError, match="does not fit this machine"):
        load_machine(tmp_path / "state", config, path)
    config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}))
    machine = load_machine(tmp_path / "state", config, path)
    assert machine.topology == PRESET and machine.ctx.reserved_cpus == {0}
    with pytest.raises(MachineError, match="cannot read topology file"):
        load_machine(tmp_path / "state", config, tmp_path / "missing.json")

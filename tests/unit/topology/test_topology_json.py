"""Topology.from_dict: what to_json writes reads back as the same value, and a record that is
no object is refused in one line naming it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nri_numa.topology.cpulist import parse_list
from nri_numa.topology.model import Topology, TopologyFormatError
from nri_numa.topology.synthetic.presets import PRESETS, preset_topology


def _machine() -> dict:
    return json.loads(preset_topology("dgx-h100").to_json())


@pytest.mark.parametrize("record", [None, [], "cpu", 3])
def test_a_record_that_is_no_object_is_refused_naming_it(record):
    data = _machine()
    data["cpus"][2] = record
    data["pci_devices"][1] = record
    with pytest.raises(TopologyFormatError) as e:
        Topology.from_dict(data)
    assert str(e.value) == f"cpus[2] must be an object, not {type(record).__name__}"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_machine_reads_back_as_written(name):
    text = preset_topology(name).to_json()
    topology = Topology.from_dict(json.loads(text))
    assert topology == preset_topology(name) and topology.to_json() == text


def test_devices_that_share_a_cpu_list_text_each_get_its_cpus():
    data = _machine()
    texts = [d["local_cpus"] for d in data["pci_devices"]]
    assert len(set(texts)) < len(texts)
    topology = Topology.from_dict(data)
    for device in data["pci_devices"]:
        assert topology.pci(device["address"]).local_cpus == parse_list(device["local_cpus"])


def test_online_cpus_are_those_of_each_value():
    """Cached once a value is asked: a value made from it by replace has its own."""
    topology = preset_topology("intel-2s-ht")
    assert topology.online_cpus == frozenset(c.id for c in topology.cpus if c.online)
    fewer = replace(topology, cpus=topology.cpus[:3])
    assert fewer.online_cpus == frozenset(c.id for c in topology.cpus[:3] if c.online)
    assert topology.online_cpus != fewer.online_cpus

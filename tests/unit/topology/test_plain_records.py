"""Topology.from_dict reads CPUs and PCI devices in their plain form in one pass
(``_plain_cpu``, ``_plain_pci``): it must accept, make and refuse exactly what the field-by-field
reader does, with the same one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nri_numa.topology import model
from nri_numa.topology.cpulist import MAX_ID, parse_list
from nri_numa.topology.model import Topology, TopologyFormatError
from nri_numa.topology.synthetic.presets import PRESETS, preset_topology
from tests.unit.odd_fields import GONE, change

NUMBERS = [0, 7, -1, MAX_ID, MAX_ID + 1, True, False, None, 3.0, "7", "0x10de", " 9 ", "1_0",
           "x", "", "9" * 41, [], {}, GONE]
STRINGS = ["a", "", None, 3, True, ["a"], GONE]
STRING_LISTS = [[], ["a", "b"], ["a", 3], "a", None, {}, GONE]
CPU_LISTS = ["0-3,8", "", "0-a", "70000", [1, 2], [True], [-1], None, 3, GONE]
BOOLS = [True, False, 1, 0, "true", None, GONE]

CPU_FIELDS = {"id": NUMBERS, "numa": NUMBERS, "core": NUMBERS, "socket": NUMBERS,
              "die": NUMBERS, "l3": NUMBERS, "online": BOOLS}
PCI_FIELDS = {"address": STRINGS, "numa_node": NUMBERS, "class": NUMBERS, "vendor": NUMBERS,
              "device": NUMBERS, "local_cpus": CPU_LISTS, "bridges": STRING_LISTS,
              "virtfns": STRING_LISTS, "host_bridge": STRINGS, "physfn": STRINGS,
              "driver": STRINGS}


def _outcome(data: dict) -> tuple[str, object]:
    try:
        topology = Topology.from_dict(data)
    except TopologyFormatError as e:
        return "error", str(e)
    return "value", (topology, topology.to_json())


def _checked_only(monkeypatch: pytest.MonkeyPatch, data: dict) -> tuple[str, object]:
    """What the field-by-field reader alone makes of ``data``."""
    with monkeypatch.context() as m:
        m.setattr(model, "_plain_cpu", lambda raw: None)
        m.setattr(model, "_plain_pci", lambda raw, lists: None)
        return _outcome(data)


def _machine() -> dict:
    return json.loads(preset_topology("dgx-h100").to_json())



@pytest.mark.parametrize("key, value", [(k, v) for k, vs in CPU_FIELDS.items() for v in vs])
def test_a_cpu_field_reads_as_the_checked_reader_reads_it(monkeypatch, key, value):
    data = _machine()
    change(data["cpus"][5], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("key, value", [(k, v) for k, vs in PCI_FIELDS.items() for v in vs])
def test_a_pci_field_reads_as_the_checked_reader_reads_it(monkeypatch, key, value):
    data = _machine()
    change(data["pci_devices"][3], key, value)
    assert _outcome(data) == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("record", [None, [], "cpu", 3])
def test_a_record_that_is_no_object_gets_the_same_error(monkeypatch, record):
    data = _machine()
    data["cpus"][2] = record
    data["pci_devices"][1] = record
    outcome = _outcome(data)
    assert outcome == ("error", f"cpus[2] must be an object, not {type(record).__name__}")
    assert outcome == _checked_only(monkeypatch, data)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_machine_reads_alike_both_ways(monkeypatch, name):
    data = json.loads(preset_topology(name).to_json())
    kind, (topology, text) = _outcome(data)
    assert kind == "value" and topology == preset_topology(name)
    assert (kind, (topology, text)) == _checked_only(monkeypatch, data)


def test_devices_that_share_a_cpu_list_text_each_get_its_cpus():
    data = _machine()
    texts = [d["local_cpus"] for d in data["pci_devices"]]
    assert len(set(texts)) < len(texts)  # the case the per-read cache of lists is for
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

"""One log line per decision, with the decision's facts as fields for the JSON format."""

from __future__ import annotations

import json
import logging

import pytest

from nri_numa.agent.logs import JsonFormatter
from nri_numa.nri.session import PluginError
from nri_numa.topology.cpulist import parse_list
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import create, new_plugin


def decisions(caplog) -> list[dict]:
    return [json.loads(JsonFormatter().format(r)) for r in caplog.records
            if getattr(r, "event", None)]


def test_a_placement_is_one_line_with_its_fields(caplog):
    plugin = new_plugin()
    g = msg.pod("g", namespace="shop")
    with caplog.at_level(logging.INFO):
        reply = create(plugin, g, msg.guaranteed(g, "app", cpus=2))
    [entry] = decisions(caplog)
    cpus = reply.adjust.linux.resources.cpu.cpus
    assert entry["msg"].startswith("placed pod shop/g container app: policy single-numa-node")
    assert {k: entry[k] for k in ("event", "pod", "pod_uid", "container", "container_id",
                                  "policy", "cpus", "exclusive", "preferred")} == {
        "event": "placed", "pod": "shop/g", "pod_uid": "uid-g", "container": "app",
        "container_id": "ctr-g-app", "policy": "single-numa-node", "cpus": cpus,
        "exclusive": True, "preferred": True}
    assert entry["mems"] is None and reply.adjust.linux.resources.cpu.mems == ""  # left alone
    assert entry["hint"] == sorted({c // 4 for c in parse_list(cpus)}) and entry["devices"] == {}


def test_a_refusal_is_one_line_with_its_reason(caplog):
    plugin = new_plugin()
    big = msg.pod("big")
    with caplog.at_level(logging.INFO), pytest.raises(PluginError):
        create(plugin, big, msg.guaranteed(big, "app", cpus=5))
    [entry] = decisions(caplog)
    assert entry["event"] == "refused" and entry["reason"] == "TopologyAffinityError"
    assert entry["pod"] == "default/big" and entry["container"] == "app"
    assert entry["policy"] == "single-numa-node"
    assert entry["detail"].startswith("TopologyAffinityError: container app: Resources cannot")
    assert entry["msg"] == f"refused pod default/big container app: {entry['detail']}"


def test_a_placement_with_a_device_names_it_in_words_and_fields(caplog):
    plugin = new_plugin()
    g = msg.pod("g")
    c = msg.guaranteed(g, "app", cpus=1)
    c.annotations["numa.nri.io/devices"] = "nvidia.com/gpu=1"
    with caplog.at_level(logging.INFO):
        create(plugin, g, c)
    [entry] = decisions(caplog)
    [gpu] = entry["devices"]["nvidia.com/gpu"]
    assert entry["msg"].endswith(f", devices nvidia.com/gpu={gpu}")


def test_a_bad_device_annotation_is_one_refusal_line(caplog):
    plugin = new_plugin()
    g = msg.pod("g")
    c = msg.guaranteed(g, "app", cpus=1)
    c.annotations["numa.nri.io/devices"] = "nvidia.com/gpu=two"
    with caplog.at_level(logging.INFO), pytest.raises(PluginError, match="InvalidAnnotation"):
        create(plugin, g, c)
    [entry] = decisions(caplog)
    assert entry["event"] == "refused" and entry["reason"] == "InvalidAnnotation"
    assert entry["msg"].startswith("refused pod default/g container app: InvalidAnnotation: ")

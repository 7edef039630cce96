"""Topology JSON (``--topology``, as ``nri-numa topology --json`` writes it) with any value at
any field, or any text: ``nri-numa topology`` and ``simulate`` read it or refuse it with one
bounded line naming the file, exit status 1, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nri_numa.topology.synthetic import preset_topology
from tests.property.bad_input import VALUE, YAML_TEXT, check_lines, cli, examples, with_value

BASE = preset_topology("pcie-4gpu").to_dict()


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into the topology's JSON form, a few items of each list."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:2]):
            found += paths(item, (*prefix, i))
    return found


FIELDS = paths(BASE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("topology")
    (folder / "config.yaml").write_text("cpuManagerPolicy: static\nreservedSystemCPUs: '0'\n")
    (folder / "pods.yaml").write_text("metadata: {name: p}\nspec: {containers: [{name: c}]}\n")
    return folder


def read(folder: Path, text: str, command: str) -> None:
    path = folder / "node.json"
    path.write_text(text, errors="surrogatepass")
    argv = ["topology", "--topology", str(path)] if command == "topology" else [
        "simulate", "--topology", str(path), "--config", str(folder / "config.yaml"),
        "--pods", str(folder / "pods.yaml")]
    code, out, err = cli(argv)
    assert code in (0, 1), (code, err)
    lines = check_lines(err, "nri-numa: error: ")
    assert (code == 1) == bool(lines), (code, err)


@settings(max_examples=examples(60))
@given(st.sampled_from(FIELDS), VALUE, st.sampled_from(["topology", "simulate"]))
@example(("cpus", 0, "core"), None, "simulate")  # found by CI: an internal error, not a refusal
def test_any_field_of_a_topology_is_read_or_refused_in_one_line(folder, field, value, command):
    read(folder, json.dumps(with_value(BASE, field, value)), command)


@settings(max_examples=examples(30))
@given(st.one_of(YAML_TEXT, VALUE.map(json.dumps)))
def test_any_text_is_refused_in_one_line(folder, text):
    read(folder, text, "topology")

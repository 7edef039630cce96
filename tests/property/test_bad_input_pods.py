"""Pods files for ``nri-numa simulate`` and ``explain``, through the real command line: a Pod
manifest with any value at any of its fields, deletions of anything, any YAML text. A bad
entry is one bounded error line (and one row of the table), the others run on; a file that
cannot be read is one line; exit status 0 without bad entries, 1 with; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property.bad_input import TEXT, VALUE, YAML_TEXT, check_lines, cli, examples, with_value

BASE = {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns",
                     "annotations": {"numa.nri.io/topology-policy": "single-numa-node"}},
        "spec": {"containers": [{"name": "c", "resources": {
            "limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": 1}}}]}}
FIELDS = [("kind",), ("metadata",), ("metadata", "name"), ("metadata", "namespace"),
          ("metadata", "uid"), ("metadata", "annotations"),
          ("metadata", "annotations", "numa.nri.io/topology-policy"),
          ("metadata", "annotations", "numa.nri.io/topology-scope"),
          ("metadata", "annotations", "numa.nri.io/devices.c"),
          ("metadata", "annotations", "numa.nri.io/unknown"),
          ("spec",), ("spec", "resources"), ("spec", "containers"), ("spec", "initContainers"),
          ("spec", "containers", 0), ("spec", "containers", 0, "name"),
          ("spec", "containers", 0, "restartPolicy"), ("spec", "containers", 0, "resources"),
          ("spec", "containers", 0, "resources", "limits"),
          ("spec", "containers", 0, "resources", "limits", "cpu"),
          ("spec", "containers", 0, "resources", "limits", "memory"),
          ("spec", "containers", 0, "resources", "limits", "hugepages-2Mi"),
          ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
          ("spec", "containers", 0, "resources", "requests")]


PODS = st.builds(with_value, st.just(BASE), st.sampled_from(FIELDS), VALUE)
ENTRIES = st.lists(st.one_of(PODS, st.builds(lambda t: {"delete": t}, VALUE),
                             st.just(BASE)), min_size=1, max_size=4)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pods")
    (folder / "config.yaml").write_text("cpuManagerPolicy: static\nreservedSystemCPUs: '0'\n"
                                        "topologyManagerPolicy: single-numa-node\n")
    return folder


def run(folder: Path, text: str, command: list[str]) -> None:
    pods = folder / "pods.yaml"
    pods.write_text(text, errors="surrogatepass")
    code, out, err = cli([*command, "--preset", "pcie-4gpu", "--config",
                          str(folder / "config.yaml"), "--pods", str(pods)])
    assert code in (0, 1), (code, err)
    lines = check_lines(err, "nri-numa: error: ", at_most=None)
    assert (code == 1) == bool(lines), (code, err)
    assert "Traceback" not in out
    if "--json" in command and out:
        json.loads(out)


@settings(max_examples=examples(40))
@given(ENTRIES, st.booleans())
def test_any_pod_entry_is_run_or_one_error_line(folder, entries, as_json):
    command = ["simulate", "--json"] if as_json else ["simulate"]
    run(folder, json.dumps(entries), command)


@settings(max_examples=examples(25))
@given(ENTRIES, TEXT)
def test_explain_names_an_unknown_pod_in_one_line(folder, entries, pod):
    name = pod.replace("\x00", "") or "p"
    # One argument, so that a name starting with "-" is not read as an option.
    run(folder, json.dumps(entries), ["explain", f"--pod={name}"])


@settings(max_examples=examples(40))
@given(YAML_TEXT)
def test_any_yaml_text_is_run_or_refused_in_one_line(folder, text):
    run(folder, text, ["simulate"])

"""Configuration files, YAML and JSON, through the real command line (``nri-numa simulate``)
and through what ``nri-numa run`` reads before it starts: any file is either read or refused
with one bounded line naming it, exit status 1, never a traceback (docs/refusals.md, "Bad
input"; docs/configuration.md, "Bounds on the file")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.agent.inputs import InputFileError, read_config_document
from nri_numa.agent.settings import KEYS, SECTION, SettingsError, resolve
from nri_numa.engine.config import ConfigError
from nri_numa.engine.config_reader import KNOWN_KEYS
from nri_numa.engine.context import EngineContext
from nri_numa.topology.synthetic import preset_topology
from tests.property.bad_input import VALUE, YAML_TEXT, check_line, check_lines, cli, examples

PODS = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n"
ENGINE_KEYS = st.sampled_from(KNOWN_KEYS)
SETTINGS = st.dictionaries(st.one_of(st.sampled_from([k.name for k in KEYS]), st.text(max_size=8)),
                           VALUE, max_size=3)
CONFIGS = st.one_of(
    st.dictionaries(ENGINE_KEYS, VALUE, max_size=3),
    st.dictionaries(st.one_of(ENGINE_KEYS, st.just(SECTION)),
                    st.one_of(VALUE, SETTINGS), max_size=3),
    VALUE,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("config")
    (folder / "pods.yaml").write_text(PODS)
    return folder


def simulate(folder: Path, text: str, suffix: str) -> None:
    config = folder / f"config{suffix}"
    config.write_text(text, errors="surrogatepass")
    code, out, err = cli(["simulate", "--preset", "intel-2s-ht", "--config", str(config),
                          "--pods", str(folder / "pods.yaml")])
    assert code in (0, 1), (code, err)
    if code == 0:
        assert err == "" and "STEP" in out
    else:
        [line] = check_lines(err, "nri-numa: error: ")
        assert str(config) in line or "does not fit this machine" in line, line


@settings(max_examples=examples(30))
@given(CONFIGS)
def test_any_json_config_is_read_or_refused_in_one_line(folder, config):
    simulate(folder, json.dumps(config), ".json")


@settings(max_examples=examples(40))
@given(YAML_TEXT)
def test_any_yaml_text_is_read_or_refused_in_one_line(folder, text):
    simulate(folder, text, ".yaml")


@settings(max_examples=examples(25))
@given(CONFIGS)
def test_what_the_agent_reads_before_it_starts_is_one_line(folder, config):
    """``nri-numa run``'s reading of the file and its settings, and the context it builds,
    without starting the agent (which would connect to a runtime)."""
    path = folder / "agent.json"
    path.write_text(json.dumps(config))
    try:
        document = read_config_document(path)
        resolve(document.settings, str(path), {})
        EngineContext.build(preset_topology("intel-2s-ht"), document.engine)
    except (InputFileError, SettingsError) as e:
        check_line(str(e))
    except ConfigError as e:  # the CLI and the agent join its problems with join_problems
        for problem in e.problems:
            check_line(problem)

"""The agent's settings: defaults, the config file's nriNuma map, the flags, and their checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_numa.agent.inputs import InputFileError, config_document
from nri_numa.agent.settings import (AgentSettings, MetricsAddress, SettingsError,
                                     parse_metrics_address, resolve)

NO_FLAGS: dict[str, str | None] = {}


def test_defaults_without_file_or_flags():
    settings = resolve(None, "x.yaml", NO_FLAGS)
    assert settings == AgentSettings()
    assert settings.metrics_address == MetricsAddress("127.0.0.1", 9109)
    assert (settings.log_format, settings.log_level, settings.plugin_index) == ("text", "info", "90")
    assert settings.given == frozenset()


def test_file_values_are_read_and_flags_win_over_them():
    section = {"nriSocket": "/run/containerd/nri.sock", "stateDir": "/srv/state",
               "metricsAddress": "0.0.0.0:9200", "logFormat": "JSON", "logLevel": "debug",
               "pluginIndex": 95, "pluginName": "numa", "topologyFile": None,
               "podResourcesSocket": ""}
    settings = resolve(section, "c.yaml", {"state_dir": "/flag/state", "log_level": None})
    assert settings.nri_socket == "/run/containerd/nri.sock"
    assert settings.state_dir == Path("/flag/state")  # the flag
    assert settings.metrics_address == MetricsAddress("0.0.0.0", 9200)
    assert (settings.log_format, settings.log_level) == ("json", "debug")  # a flag not given
    assert (settings.plugin_name, settings.plugin_index) == ("numa", "95")
    assert settings.pod_resources_socket == ""
    assert "metrics_address" in settings.given and "log_file" not in settings.given


@pytest.mark.parametrize("raw, expected", [
    ("127.0.0.1:9109", MetricsAddress("127.0.0.1", 9109)),
    ("[::1]:0", MetricsAddress("::1", 0)),
    ("node.example:80", MetricsAddress("node.example", 80)),
    ("off", None), ("", None), ("OFF", None),
])
def test_metrics_addresses(raw, expected):
    assert parse_metrics_address(raw) == expected
    if expected is not None:
        assert parse_metrics_address(str(expected)) == expected


@pytest.mark.parametrize("section, message", [
    ({"metricsAddress": "localhost"}, "nriNuma.metricsAddress: 'localhost' is not HOST:PORT"),
    ({"metricsAddress": "1.2.3.4:65536"}, "nriNuma.metricsAddress: '1.2.3.4:65536' is not"),
    ({"metricsAddress": "::1:80"}, "put an IPv6 address in brackets"),
    ({"metricsAddress": "[nope]:80"}, "'[nope]:80' is not HOST:PORT"),
    ({"metricsAddress": 9109}, "nriNuma.metricsAddress: must be a string"),
    ({"logFormat": "xml"}, "nriNuma.logFormat: 'xml' is not one of text, json"),
    ({"logLevel": "trace"}, "nriNuma.logLevel: 'trace' is not one of debug, info, warning, error"),
    ({"stateDir": 5}, "nriNuma.stateDir: must be a string (a path), not int 5"),
    ({"stateDir": " "}, "nriNuma.stateDir: ' ' is not a path"),
    ({"pluginIndex": 5}, "nriNuma.pluginIndex: 5 is not a plugin index: two digits, 00 to 99 "
                         "(quote it in YAML: \"05\")"),
    ({"pluginIndex": "123"}, "nriNuma.pluginIndex: '123' is not a plugin index"),
    ({"pluginName": "my plugin"}, "nriNuma.pluginName: 'my plugin' is not a plugin name"),
    ({"metricAddress": "x"}, "nriNuma: unknown key 'metricAddress'; did you mean metricsAddress?"),
    (["nriSocket"], "nriNuma must be a map of settings, not list"),
])
def test_each_bad_file_value_is_named_with_what_is_allowed(section, message):
    with pytest.raises(SettingsError) as e:
        resolve(section, "c.yaml", NO_FLAGS)
    assert str(e.value).startswith("c.yaml: ")
    assert message in str(e.value)
    assert len(e.value.problems) == 1


def test_every_problem_is_reported_at_once_in_one_line():
    with pytest.raises(SettingsError) as e:
        resolve({"logFormat": "xml", "stateDir": 1}, "c.yaml",
                {"metrics_address": "nope", "plugin_index": "9"})
    text = str(e.value)
    assert "\n" not in text
    for part in ("nriNuma.logFormat", "nriNuma.stateDir", "--metrics-address: 'nope'",
                 "--index: '9'"):
        assert part in text


def test_the_file_section_is_split_from_the_kubelet_keys():
    document = config_document("cpuManagerPolicy: static\nreservedSystemCPUs: '0'\n"
                               "nriNuma:\n  logFormat: json\n", "c.yaml")
    assert str(document.engine.cpu_manager_policy) == "static"
    assert document.settings == {"logFormat": "json"}
    assert config_document("", "c.yaml").settings is None


def test_a_misspelt_section_is_named_as_such():
    with pytest.raises(InputFileError, match="unknown key 'nriNUMA'; did you mean nriNuma?"):
        config_document("nriNUMA:\n  logFormat: json\n", "c.yaml")
    with pytest.raises(InputFileError, match="unknown key 'bogus'"):  # the engine's own error
        config_document("bogus: 1\n", "c.yaml")


def test_the_light_copies_of_names_match_their_owners():
    # Repeated so that the CLI need not import the runtime layer, nor inputs the settings.
    from nri_numa.agent import inputs
    from nri_numa.agent import settings as agent_settings
    from nri_numa.runtime import cdi

    assert agent_settings.DEVICE_INJECTIONS == cdi.INJECTION_MODES
    assert agent_settings.DEFAULT_CDI_SPEC_DIRS == cdi.DEFAULT_SPEC_DIRS
    assert inputs.SETTINGS_KEY == agent_settings.SECTION

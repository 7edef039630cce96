import json

import pytest

from nri_numa.agent.inputs import (InputFileError, NotYamlError, config_from_text, read_config_file,
                             read_topology_file)
from tests.unit.test_model import small_topology


def test_json_and_yaml_configs_read_the_same():
    as_yaml = config_from_text("cpuManagerPolicy: static\nreservedSystemCPUs: '0'\n", "c")
    as_json = config_from_text('{"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}', "c")
    assert as_yaml == as_json and str(as_json.cpu_manager_policy) == "static"


def test_an_empty_config_is_every_default():
    assert str(config_from_text("", "c").topology_manager_policy) == "none"


@pytest.mark.parametrize("text, error, message", [
    ("a: [\n", NotYamlError, "cfg.yaml: not valid YAML: line 2"),
    ("a: 1\n---\nb: 2\n", InputFileError, "cfg.yaml: holds 2 YAML documents; a config is one"),
    ("topologyManagerPolicy: strict\n", InputFileError, "cfg.yaml: topologyManagerPolicy"),
])
def test_bad_config_text_names_the_file(text, error, message):
    with pytest.raises(error) as e:
        config_from_text(text, "cfg.yaml")
    assert message in str(e.value)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(InputFileError, match="cannot read config file .*missing.yaml"):
        read_config_file(tmp_path / "missing.yaml")
    with pytest.raises(InputFileError, match="cannot read topology file .*node.json"):
        read_topology_file(tmp_path / "node.json")


def test_topology_files_round_trip_and_bad_ones_name_the_field(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(small_topology().to_json())
    assert read_topology_file(path) == small_topology()
    path.write_text('{"schema_version": 1}')
    with pytest.raises(InputFileError, match="node.json: cpus is missing"):
        read_topology_file(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(InputFileError, match="not a text file"):
        read_topology_file(path)


@pytest.mark.parametrize("field", ["core", "socket"])
def test_an_online_cpu_without_its_core_or_socket_is_refused_naming_it(tmp_path, field):
    """The engine places on cores and sockets: such a file is refused here, in one line, for
    every command that reads it (it was an internal error of the engine)."""
    document = small_topology().to_dict()
    document["cpus"][1][field] = None
    path = tmp_path / "node.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputFileError, match=f"node.json: cpu 1 is online but has no {field}$"):
        read_topology_file(path)

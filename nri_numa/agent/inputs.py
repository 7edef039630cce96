"""The files a person hands nri-numa: a configuration and a captured topology.

One reader for every front door (CLI, simulate, the NRI daemon and plugin, the hook), so a file
gets the same checks and the same words everywhere. Errors name the file; each caller turns them
into its own error type.

A config file may carry the ``nri-numa run`` agent's own settings in a ``nriNuma:`` map next to
the kubelet's keys (nri_numa.agent.settings). Every reader accepts the map, so one file serves
the agent, the hook and the CLI; only the agent reads it (``read_config_document``).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_numa.engine.config import ConfigError, EngineConfig
from nri_numa.engine.config_reader import KNOWN_KEYS, config_from_mapping
from nri_numa.topology.model import Topology, TopologyFormatError


class InputFileError(ValueError):
    """A file that cannot be used; the message names it and the problem."""


class NotYamlError(InputFileError):
    """The text does not parse as YAML (or JSON) at all."""


def read_topology_file(path: Path) -> Topology:
    """A topology captured with ``nri-numa topology --json``."""
    try:
        return Topology.from_json(read_text(path, "topology"))
    except TopologyFormatError as e:
        raise InputFileError(f"{path}: {e}") from None


SETTINGS_KEY = "nriNuma"  # nri_numa.agent.settings.SECTION, named here to keep this module light


@dataclass(frozen=True)
class ConfigDocument:
    engine: EngineConfig
    settings: object  # the nriNuma map as written (None: absent); agent.settings checks it


def read_config_file(path: Path) -> EngineConfig:
    """KubeletConfiguration keys from a YAML or JSON file."""
    return read_config_document(path).engine


def read_config_document(path: Path) -> ConfigDocument:
    """KubeletConfiguration keys and the agent's settings from a YAML or JSON file."""
    return config_document(read_text(path, "config"), str(path))


def config_from_text(text: str, where: str) -> EngineConfig:
    """KubeletConfiguration keys from YAML or JSON text; an empty text is every default."""
    return config_document(text, where).engine


def config_document(text: str, where: str) -> ConfigDocument:
    documents = [d for d in yaml_documents(text, where) if d is not None]
    if len(documents) > 1:
        raise InputFileError(f"{where}: holds {len(documents)} YAML documents; a config is one")
    mapping = documents[0] if documents else {}
    settings = None
    if isinstance(mapping, dict):
        mapping = dict(mapping)
        settings = mapping.pop(SETTINGS_KEY, None)
        _check_settings_key_spelling(mapping, where)
    try:
        return ConfigDocument(config_from_mapping(mapping), settings)
    except ConfigError as e:
        raise InputFileError(f"{where}: {'; '.join(e.problems)}") from None


def _check_settings_key_spelling(mapping: dict, where: str) -> None:
    # The engine lists only its own keys: a misspelt nriNuma would be named without the hint.
    for key in mapping:
        if (isinstance(key, str) and key not in KNOWN_KEYS
                and difflib.get_close_matches(key.lower(), [SETTINGS_KEY.lower()], cutoff=0.75)):
            raise InputFileError(f"{where}: unknown key {key!r}; did you mean {SETTINGS_KEY}? "
                                 f"(the agent's settings go in a {SETTINGS_KEY}: map)")


def yaml_documents(text: str, where: str) -> list[Any]:
    """Every document of a YAML text. JSON is read without loading the YAML parser, which
    short-lived hook processes would pay for on every container start."""
    if text.lstrip().startswith("{"):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError:
            pass  # YAML flow style is not always JSON: let the YAML parser judge it
    import yaml

    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        raise NotYamlError(f"{where}: not valid YAML: {_yaml_problem(e)}") from None


def _yaml_problem(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise InputFileError(f"cannot read {what} file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not a text file") from None

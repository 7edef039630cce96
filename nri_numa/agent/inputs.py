"""The files a person hands nri-numa: a configuration and a captured topology.

One reader for every front door (CLI, simulate, the NRI daemon and plugin, the hook), so a file
gets the same checks and the same words everywhere. Errors name the file; each caller turns them
into its own error type.

A config file may carry the ``nri-numa run`` agent's own settings in a ``nriNuma:`` map next to
the kubelet's keys (nri_numa.agent.settings). Every reader accepts the map, so one file serves
the agent, the hook and the CLI; only the agent reads it (``read_config_document``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nri_numa.safeio.bounds import quote, join_problems
from nri_numa.safeio.documents import DocumentError, NotParsedError, documents
from nri_numa.topology.model import Topology, TopologyFormatError

if TYPE_CHECKING:
    from nri_numa.engine.config import EngineConfig


class InputFileError(ValueError):
    """A file that cannot be used; the message names it and the problem."""


class NotYamlError(InputFileError):
    """The text does not parse as YAML (or JSON) at all."""


# Far above any file of its kind (a topology of 8192 CPUs is about 2 MiB, a config a few
# hundred bytes): a larger file is refused before it is read into memory and parsed.
MAX_BYTES = {"config": 1 << 20, "pods": 8 << 20, "topology": 64 << 20,
             "fake kubelet state": 8 << 20}


def read_topology_file(path: Path) -> Topology:
    """A topology captured with ``nri-numa topology --json``, one the engine can place on: every
    online CPU names its core and socket."""
    try:
        topology = Topology.from_json(read_text(path, "topology"))
    except TopologyFormatError as e:
        raise InputFileError(f"{path}: {e}") from None
    for cpu in topology.cpus:
        missing = [what for what, value in (("core", cpu.core), ("socket", cpu.socket))
                   if value is None]
        if cpu.online and missing:
            raise InputFileError(f"{path}: cpu {cpu.id} is online but has no {missing[0]}")
    return topology


SETTINGS_KEY = "nriNuma"  # nri_numa.agent.settings.SECTION, named here to keep this module light


@dataclass(frozen=True, slots=True)
class ConfigDocument:
    engine: EngineConfig
    settings: object  # the nriNuma map as written (None: absent); agent.settings checks it
    # KubeletConfiguration keys in the file that nri-numa has no use for (a kubelet's own file)
    ignored_kubelet_keys: tuple[str, ...] = ()


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
    # The engine is imported here, not at the top: reading a topology file (`nri-numa
    # topology --topology`) needs none of it.
    from nri_numa.engine.config import ConfigError
    from nri_numa.engine.config_reader import read_kubelet_configuration

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
        engine, ignored = read_kubelet_configuration(mapping)
        return ConfigDocument(engine, settings, ignored)
    except ConfigError as e:
        raise InputFileError(f"{where}: {join_problems(e.problems)}") from None


def _like_settings_key(key: str) -> bool:
    import difflib  # only for an unknown key: a hook process reads its configuration every run

    return bool(difflib.get_close_matches(key.lower(), [SETTINGS_KEY.lower()], cutoff=0.75))


def _check_settings_key_spelling(mapping: dict, where: str) -> None:
    # The engine lists only its own keys: a misspelt nriNuma would be named without the hint.
    from nri_numa.engine.config_reader import KNOWN_KEYS

    for key in mapping:
        if isinstance(key, str) and key not in KNOWN_KEYS and _like_settings_key(key):
            raise InputFileError(f"{where}: unknown key {quote(key)}; did you mean {SETTINGS_KEY}? "
                                 f"(the agent's settings go in a {SETTINGS_KEY}: map)")


def yaml_documents(text: str, where: str) -> list[Any]:
    """Every document of a YAML text, read with nri_numa.safeio.documents' bounds (nesting, size,
    plain tags, digits). JSON is read without loading the YAML parser, which short-lived hook
    processes would pay for on every container start."""
    try:
        return documents(text, where)
    except NotParsedError as e:
        raise NotYamlError(str(e)) from None
    except DocumentError as e:
        raise InputFileError(str(e)) from None


def read_text(path: Path, what: str) -> str:
    """The file's text (UTF-8), refused past MAX_BYTES for ``what`` before it is read whole."""
    limit = MAX_BYTES.get(what, 1 << 20)
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise InputFileError(f"cannot read {what} file {path}: {e.strerror}") from None
    if len(raw) > limit:
        raise InputFileError(f"{path}: larger than {limit >> 20} MiB, more than any {what} "
                             "file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not a text file") from None

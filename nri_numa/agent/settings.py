"""Settings of the ``nri-numa run`` agent: where it connects, keeps its state, serves metrics
and logs (docs/configuration.md, "Plugin settings").

They come from three places, each later one winning: the defaults here, the ``nriNuma:`` map of
the configuration file (next to the KubeletConfiguration keys, which the engine reads), and the
command line. Every value is checked before the agent starts; all problems are reported at once,
each naming the key (or flag), the value and what is allowed.

This module loads nothing heavy: the CLI imports it for the defaults it prints in its help.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from nri_numa.podresources import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET
from nri_numa.safeio.bounds import clip, join_problems, quote

SECTION = "nriNuma"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_STATE_DIR = "/var/lib/nri-numa"
DEFAULT_NAME = "nri-numa"
DEFAULT_INDEX = "90"
DEFAULT_DEV_ROOT = "/dev"
# How GPUs are given (docs/devices.md): device nodes, CDI names, or CDI where the runtime
# applies it and a spec names the GPU. The spec dirs are CDI's own defaults.
DEVICE_INJECTIONS = ("nodes", "cdi", "auto")
DEFAULT_DEVICE_INJECTION = "auto"
DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
METRICS_OFF = ("", "off")
# The NodeResourceTopology export (docs/kubernetes.md): "auto" exports when a kubeconfig is given
# or the agent runs in a pod with a service account.
NRT_EXPORTS = ("auto", "on", "off")
DEFAULT_NRT_RESYNC_S = 60.0
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_PATH = 4096  # bytes: Linux's PATH_MAX; no system call takes a longer path


class SettingsError(ValueError):
    """Settings the agent cannot start with; ``problems`` has one line per bad key or flag."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(join_problems(problems))
        self.problems = problems


class _Bad(Exception):
    """One value is wrong; the caller prefixes the key or flag."""


@dataclass(frozen=True, slots=True)
class MetricsAddress:
    host: str
    port: int  # 0: any free port (the agent logs the one it got)

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    nri_socket: str = DEFAULT_SOCKET
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    topology_file: Path | None = None  # None: discover this machine
    plugin_name: str = DEFAULT_NAME
    plugin_index: str = DEFAULT_INDEX
    metrics_address: MetricsAddress | None = MetricsAddress("127.0.0.1", 9109)  # None: off
    log_format: str = "text"
    log_level: str = "info"
    log_file: Path | None = None  # None: standard error
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET  # the kubelet's; "": not used
    dev_root: Path = Path(DEFAULT_DEV_ROOT)  # the host's device nodes
    device_injection: str = DEFAULT_DEVICE_INJECTION
    cdi_spec_dirs: tuple[Path, ...] = tuple(Path(d) for d in DEFAULT_CDI_SPEC_DIRS)
    kubeconfig: Path | None = None  # None: the in-cluster service account, if any
    node_name: str = ""  # "": $NODE_NAME, else this host's name
    nrt_export: str = "auto"
    nrt_resync_period: float = DEFAULT_NRT_RESYNC_S  # seconds between checks of the object
    # Refused pods owned by a controller are evicted after this many refusals, no sooner than
    # this many seconds after the first (docs/kubernetes.md, "Refusals").
    evict_refused_pods: bool = True
    evict_after_refusals: int = 3
    eviction_delay: float = 30.0
    # The kubelet's root: its cpu_manager_state and memory_manager_state are adopted at the
    # first Synchronize (docs/migrating-from-kubelet.md). None: /var/lib/kubelet when it has them.
    kubelet_state_dir: Path | None = None
    given: frozenset[str] = frozenset()  # the fields the file or the flags set


# --- one reader per kind of value ---------------------------------------------------------


def _text(raw: Any, what: str) -> str:
    if not isinstance(raw, str):
        raise _Bad(f"must be a string ({what}), not {type(raw).__name__} {quote(raw)}")
    return raw


def _path(raw: Any) -> Path:
    text = _text(raw, "a path")
    if not text.strip() or "\0" in text:
        raise _Bad(f"{quote(raw)} is not a path")
    if len(text) > MAX_PATH:
        raise _Bad(f"{quote(raw)} is not a path: longer than {MAX_PATH} characters")
    return Path(text)


def _optional_path(raw: Any) -> Path | None:
    return None if raw is None else _path(raw)


def _paths(raw: Any) -> tuple[Path, ...]:
    """A list of paths; on the command line one string, comma-separated."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not items:
        raise _Bad(f"must be a non-empty list of paths (comma-separated on the command line), "
                   f"not {quote(raw)}")
    return tuple(_path(item.strip() if isinstance(item, str) else item) for item in items)


def _socket(raw: Any) -> str:
    return str(_path(raw))


def _optional_socket(raw: Any) -> str:
    return "" if raw == "" else _socket(raw)


def _plugin_name(raw: Any) -> str:
    text = _text(raw, "a plugin name")
    if not text or any(c.isspace() or c == "/" for c in text):
        raise _Bad(f"{quote(text)} is not a plugin name: it must be non-empty, without spaces or "
                   "'/'")
    return text


def _plugin_index(raw: Any) -> str:
    # YAML reads 90 as a number (and 05 as octal 5), so whole numbers from 10 on are taken as
    # written and anything below must be quoted: NRI wants exactly two digits.
    if isinstance(raw, int) and not isinstance(raw, bool) and 10 <= raw <= 99:
        return str(raw)
    if isinstance(raw, str) and len(raw) == 2 and raw.isascii() and raw.isdigit():
        return raw
    hint = " (quote it in YAML: \"05\")" if isinstance(raw, int) else ""
    raise _Bad(f"{quote(raw)} is not a plugin index: two digits, 00 to 99{hint}")


def parse_metrics_address(raw: Any) -> MetricsAddress | None:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address); "" or "off": no metrics server."""
    text = _text(raw, 'HOST:PORT, or "off"')
    if text.strip().lower() in METRICS_OFF:
        return None
    allowed = 'HOST:PORT such as 127.0.0.1:9109 or [::1]:9109 (port 0-65535), or "off"'
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        import ipaddress

        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _Bad(f"{quote(text)} is not {allowed}") from None
    elif ":" in host:  # an IPv6 address without brackets: the port would be ambiguous
        raise _Bad(f"{quote(text)} is not {allowed}; put an IPv6 address in brackets")
    if (not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5
            or int(port) > 65535):
        raise _Bad(f"{quote(text)} is not {allowed}")
    return MetricsAddress(host, int(port))


def _node_name(raw: Any) -> str:
    import re

    text = _text(raw, "a Kubernetes node name")
    # A DNS subdomain (RFC 1123), as the API server checks a Node's name; "" is the default.
    label = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    if text and (len(text) > 253 or not re.fullmatch(rf"{label}(\.{label})*", text)):
        raise _Bad(f"{quote(text)} is not a node name: lowercase letters, digits, '-' and '.'")
    return text


def _seconds_from(least: float) -> Callable[[Any], float]:
    def read(raw: Any) -> float:
        try:
            value = (float(raw) if isinstance(raw, int | float | str) and not isinstance(raw, bool)
                     else None)
        except ValueError:
            value = None
        if value is None or not least <= value <= 86400.0:
            raise _Bad(f"{quote(raw)} is not a number of seconds from {least:g} to 86400")
        return value
    return read


def _count(raw: Any) -> int:
    if isinstance(raw, str) and raw.isascii() and raw.isdigit():
        raw = int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool) or not 1 <= raw <= 1000:
        raise _Bad(f"{quote(raw)} is not a whole number from 1 to 1000")
    return raw


def _flag(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise _Bad(f"{quote(raw)} is not true or false")


def _choice(allowed: tuple[str, ...]) -> Callable[[Any], str]:
    def read(raw: Any) -> str:
        if not isinstance(raw, str) or raw.lower() not in allowed:
            raise _Bad(f"{quote(raw)} is not one of {', '.join(allowed)}")
        return raw.lower()
    return read


@dataclass(frozen=True, slots=True)
class _Key:
    name: str  # in the file, camelCase like the kubelet's keys
    flag: str  # on the command line
    field: str  # of AgentSettings
    read: Callable[[Any], Any]


KEYS = (
    _Key("nriSocket", "--nri-socket", "nri_socket", _socket),
    _Key("stateDir", "--state-dir", "state_dir", _path),
    _Key("topologyFile", "--topology", "topology_file", _optional_path),
    _Key("pluginName", "--name", "plugin_name", _plugin_name),
    _Key("pluginIndex", "--index", "plugin_index", _plugin_index),
    _Key("metricsAddress", "--metrics-address", "metrics_address", parse_metrics_address),
    _Key("logFormat", "--log-format", "log_format", _choice(LOG_FORMATS)),
    _Key("logLevel", "--log-level", "log_level", _choice(LOG_LEVELS)),
    _Key("logFile", "--log-file", "log_file", _optional_path),
    _Key("podResourcesSocket", "--pod-resources-socket", "pod_resources_socket",
         _optional_socket),
    _Key("devRoot", "--dev-root", "dev_root", _path),
    _Key("deviceInjection", "--device-injection", "device_injection",
         _choice(DEVICE_INJECTIONS)),
    _Key("cdiSpecDirs", "--cdi-spec-dirs", "cdi_spec_dirs", _paths),
    _Key("kubeconfig", "--kubeconfig", "kubeconfig", _optional_path),
    _Key("nodeName", "--node-name", "node_name", _node_name),
    _Key("nrtExport", "--nrt-export", "nrt_export", _choice(NRT_EXPORTS)),
    _Key("nrtResyncPeriod", "--nrt-resync-period", "nrt_resync_period", _seconds_from(1.0)),
    _Key("evictRefusedPods", "--evict-refused-pods", "evict_refused_pods", _flag),
    _Key("evictAfterRefusals", "--evict-after-refusals", "evict_after_refusals", _count),
    _Key("evictionDelay", "--eviction-delay", "eviction_delay", _seconds_from(0.0)),
    _Key("kubeletStateDir", "--kubelet-state-dir", "kubelet_state_dir", _optional_path),
)
_BY_NAME = {k.name: k for k in KEYS}
_BY_FIELD = {k.field: k for k in KEYS}
assert set(_BY_FIELD) == {f.name for f in fields(AgentSettings)} - {"given"}


def from_section(section: Any) -> tuple[dict[str, Any], list[str]]:
    """The settings the file's ``nriNuma`` map gives (by field), and its problems."""
    if section is None:
        return {}, []
    if not isinstance(section, Mapping):
        return {}, [f"{SECTION} must be a map of settings, not {type(section).__name__}"]
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, raw in section.items():
        key = _BY_NAME.get(name)
        if key is None:
            problems.append(f"{SECTION}: {_unknown(name)}")
            continue
        try:
            values[key.field] = key.read(raw)
        except _Bad as e:
            problems.append(f"{SECTION}.{clip(name)}: {e}")
    return values, problems


def from_flags(flags: Mapping[str, str | None]) -> tuple[dict[str, Any], list[str]]:
    """The settings the command line gives (by field; None: flag not given), and problems."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for field_name, raw in flags.items():
        if raw is None:
            continue
        key = _BY_FIELD[field_name]
        try:
            values[field_name] = key.read(raw)
        except _Bad as e:
            problems.append(f"{key.flag}: {e}")
    return values, problems


def resolve(section: Any, where: str, flags: Mapping[str, str | None]) -> AgentSettings:
    """Defaults, then the file's section, then the flags; SettingsError lists every problem."""
    from_file, problems = from_section(section)
    given, flag_problems = from_flags(flags)
    if problems:  # one line: the file named once, as for the kubelet keys
        problems = [f"{where}: {join_problems(problems)}"]
    if problems or flag_problems:
        raise SettingsError(problems + flag_problems)
    values = {**from_file, **given}
    return replace(AgentSettings(), **values, given=frozenset(values))


def _unknown(name: Any) -> str:
    import difflib

    known = [k.name for k in KEYS]
    # A name longer than any known one is no typo of one: difflib is not asked.
    close = (difflib.get_close_matches(name, known, n=1)
             if isinstance(name, str) and len(name) <= 64 else [])
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown key {quote(name)}{hint} (known keys: {', '.join(known)})"

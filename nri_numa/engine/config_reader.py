"""Reading a KubeletConfiguration mapping into an ``EngineConfig``.

Kept apart from config.py, which holds the values and the checks the kubelet makes on them:
this module only knows the keys (KubeletConfiguration's names) and turns each one's raw YAML
value into an ``EngineConfig`` field. ``config_from_mapping`` reads an already-parsed mapping
(the CLI parses YAML); every key is checked and every problem is reported at once in one
``ConfigError``, then ``EngineConfig`` runs its own checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from nri_numa.engine.config import (ConfigError, CpuManagerPolicy, EngineConfig,
                                    MemoryManagerPolicy, MemoryReservation, TopologyPolicy,
                                    TopologyScope, not_one_of)
from nri_numa.safeio.bounds import clip, quote
from nri_numa.topology.cpulist import MAX_ID, ListFormatError, parse_list

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"
RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")  # kubeReserved / systemReserved keys


def config_from_mapping(obj: Any) -> EngineConfig:
    """An EngineConfig from a parsed mapping with KubeletConfiguration keys; absent keys keep
    their defaults. Raises ConfigError listing every problem found."""
    return read_kubelet_configuration(obj)[0]


def read_kubelet_configuration(obj: Any) -> tuple[EngineConfig, tuple[str, ...]]:
    """The EngineConfig of a whole KubeletConfiguration, and the kubelet keys in it that
    nri-numa has no use for (sorted). A key that is neither read nor a kubelet key is a
    problem; ConfigError lists every problem, the checks of the values read included."""
    if obj is None:
        obj = {}
    if not isinstance(obj, Mapping):
        raise ConfigError([f"the configuration must be a map of keys, not {type(obj).__name__}"])
    problems: list[str] = []
    values: dict[str, Any] = {}
    ignored: list[str] = []
    bad_keys: set[str] = set()
    unknown: list[Any] = []
    for key, raw in obj.items():
        reader = _READERS.get(key)
        if reader is None:
            if _is_kubelet_key(key):
                ignored.append(key)
            else:
                unknown.append(key)
            continue
        try:
            values.update(reader(key, raw))
        except _KeyProblem as e:
            problems.append(f"{key}: {e}")
            bad_keys.add(key)
    # The known keys are listed for a lone unknown key: several typos must fit on one line.
    problems[:0] = [_unknown_key(key, listed=len(unknown) == 1) for key in unknown]
    try:
        config = EngineConfig(**values)
    except ConfigError as e:
        # Checks across keys (static without reserved CPUs...) are reported with the key
        # problems, not after they are fixed; a check on a key whose value was refused would
        # judge its default instead, so it is left out.
        problems += [p for p in e.problems
                     if not ({_problem_key(p)} | _JUDGED_WITH.get(_problem_key(p), set()))
                     & bad_keys]
        if not problems:
            raise
    if problems:
        raise ConfigError(problems)
    return config, tuple(sorted(ignored))


# The keys a policy's own check reads besides the policy (config.py's cross-key checks).
_JUDGED_WITH = {"cpuManagerPolicy": {"reservedSystemCPUs", "kubeReserved", "systemReserved"},
                "memoryManagerPolicy": {"reservedMemory"}}


def _problem_key(problem: str) -> str:
    return re.split(r"[:\[]", problem, maxsplit=1)[0]


def _is_kubelet_key(key: Any) -> bool:
    """Whether ``key`` is one of the kubelet's keys nri-numa leaves alone. Their list loads
    with the first key nri-numa does not read: a configuration of its own keys never needs it."""
    from nri_numa.engine.kubelet_keys import IGNORED_KUBELET_KEYS

    return isinstance(key, str) and key in IGNORED_KUBELET_KEYS


class _KeyProblem(Exception):
    """One key's value is wrong; config_from_mapping prefixes the key."""


def _unknown_key(key: Any, listed: bool = True) -> str:
    import difflib  # only for an unknown key: a hook process reads its configuration every run

    from nri_numa.engine.kubelet_keys import IGNORED_KUBELET_KEYS

    # A key longer than any known one is no typo of one: difflib is not asked.
    text = key if isinstance(key, str) else quote(key)
    # The kubelet's other keys are candidates too: "evictonHard" is a typo of one of them.
    candidates = [*KNOWN_KEYS, *sorted(IGNORED_KUBELET_KEYS)]
    close = difflib.get_close_matches(text, candidates, n=1) if len(text) <= 64 else []
    hint = f"; did you mean {close[0]}?" if close else ""
    known = f" (known keys: {', '.join(KNOWN_KEYS)})" if listed else ""
    return f"unknown key {quote(key)}{hint}{known}"


def _choice(enum: type[StrEnum]) -> Callable[[str, Any], dict[str, Any]]:
    def read(key: str, raw: Any) -> dict[str, Any]:
        # A map or list is unhashable: it must not reach the set's lookup.
        if not isinstance(raw, str) or raw not in {e.value for e in enum}:
            raise _KeyProblem(not_one_of(raw, enum))
        return {_snake(key): enum(raw)}
    return read


def _fixed(expected: str) -> Callable[[str, Any], dict[str, Any]]:
    def read(key: str, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, str) or raw != expected:
            raise _KeyProblem(f"{quote(raw)} is not {expected!r}")
        return {}
    return read


def _options(key: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _KeyProblem(f"must be a map of option name to string value, not {quote(raw)}")
    options = {}
    for name, value in raw.items():
        # YAML turns an unquoted true or 8 into a bool or an int; the kubelet wants strings,
        # but the intent is plain, so take them.
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int):
            value = str(value)
        if not isinstance(name, str) or not isinstance(value, str):
            raise _KeyProblem(f"option {quote(name)} must have a string value, not "
                              f"{quote(value)}")
        options[name] = value
    return {_snake(key): options}


def _cpu_list(key: str, raw: Any) -> dict[str, Any]:
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(text, str):
        raise _KeyProblem(f'must be a CPU list such as "0-1,32-33", not {quote(raw)}')
    try:
        return {"reserved_system_cpus": parse_list(text)}
    except ListFormatError as e:
        raise _KeyProblem(f"invalid configuration: unable to parse reservedSystemCPUs "
                          f"(--reserved-cpus) {clip(text)}, error: {e}") from None


def _reserved(key: str, raw: Any) -> dict[str, Any]:
    # Quantities are read only here and in _reservation: a configuration without reservations
    # never loads them.
    from nri_numa.engine.quantity import QuantityError, resource_amount

    if not isinstance(raw, Mapping):
        raise _KeyProblem(f'must be a map such as {{cpu: "1", memory: "1Gi"}}, not {quote(raw)}')
    amounts = {}
    for resource, value in raw.items():
        if resource not in RESERVABLE:
            raise _KeyProblem(f"cannot reserve {quote(resource)} (allowed: "
                              f"{', '.join(RESERVABLE)})")
        try:
            amounts[resource] = resource_amount(resource, value)
        except QuantityError as e:
            raise _KeyProblem(f"{resource}: {e}") from None
    return {_snake(key): amounts}


def _reserved_memory(key: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, list):
        raise _KeyProblem("must be a list of {numaNode: N, limits: {memory: \"1Gi\"}}")
    return {"reserved_memory": tuple(_reservation(e, f"[{i}]") for i, e in enumerate(raw))}


def _reservation(entry: Any, where: str) -> MemoryReservation:
    if not isinstance(entry, Mapping) or set(entry) - {"numaNode", "limits"}:
        raise _KeyProblem(f"{where}: must be a map with the keys numaNode and limits")
    node = entry.get("numaNode")
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise _KeyProblem(f"{where}.numaNode: must be a NUMA node id (0 or more), not "
                          f"{quote(node)}")
    if node > MAX_ID:  # the engine makes a bit of each node id: 2**1000 would be a big one
        raise _KeyProblem(f"{where}.numaNode: {quote(node)} is above {MAX_ID}, more than any "
                          "kernel has")
    limits = entry.get("limits")
    if not isinstance(limits, Mapping) or not limits:
        raise _KeyProblem(f"{where}.limits: must be a map such as {{memory: \"1Gi\"}}")
    from nri_numa.engine.quantity import QuantityError, resource_amount

    amounts = {}
    for resource, value in limits.items():
        if not isinstance(resource, str):
            raise _KeyProblem(f"{where}.limits: {quote(resource)} is not a resource name")
        try:
            amounts[resource] = resource_amount(resource, value)
        except QuantityError as e:
            raise _KeyProblem(f"{where}.limits.{clip(resource)}: {e}") from None
    return MemoryReservation(node, amounts)


def _flag(key: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, bool):
        raise _KeyProblem(f"must be true or false, not {quote(raw)}")
    return {_snake(key): raw}


# A Go duration as the kubelet writes it ("10s", "1m30s", "500ms") or a number of seconds.
# Compiled (and kept) by re on first use: few configurations set a period.
_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)"
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                 "h": 3600.0}
MAX_RECONCILE_PERIOD = 86400.0


def _period(key: str, raw: Any) -> dict[str, Any]:
    seconds = _seconds(raw)
    if seconds is None or not 0 <= seconds <= MAX_RECONCILE_PERIOD:
        raise _KeyProblem(f"{quote(raw)} is not a duration from 0s to 24h (such as \"10s\"; "
                          f"0 turns the check off)")
    return {_snake(key): seconds}


def _seconds(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        return float(raw)
    if not isinstance(raw, str) or len(raw) > 40:
        return None
    text = raw.strip()
    if text == "0":
        return 0.0
    parts = re.findall(_DURATION_PART, text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _snake(key: str) -> str:
    return {"reservedSystemCPUs": "reserved_system_cpus"}.get(
        key, re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), key))


_READERS = {
    "apiVersion": _fixed(API_VERSION),
    "kind": _fixed(KIND),
    "topologyManagerPolicy": _choice(TopologyPolicy),
    "topologyManagerScope": _choice(TopologyScope),
    "topologyManagerPolicyOptions": _options,
    "cpuManagerPolicy": _choice(CpuManagerPolicy),
    "cpuManagerPolicyOptions": _options,
    "reservedSystemCPUs": _cpu_list,
    "kubeReserved": _reserved,
    "systemReserved": _reserved,
    "memoryManagerPolicy": _choice(MemoryManagerPolicy),
    "reservedMemory": _reserved_memory,
    "allowPodOverrides": _flag,
    "sharedPoolIncludesIsolcpus": _flag,
    "cpuManagerReconcilePeriod": _period,
}
KNOWN_KEYS = tuple(_READERS)

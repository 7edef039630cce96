"""topologyManagerPolicyOptions, parsed as the kubelet parses them, with the kubelet's errors.

* ``prefer-closest-numa-nodes`` (Go ParseBool syntax: 1 t T TRUE true True, 0 f F FALSE false
  False): among equally wide masks, pick the one with the smallest average NUMA distance.
* ``max-allowable-numa-nodes`` (decimal integer, at least 8, default 8): the kubelet refuses to
  run a policy other than ``none`` on a machine with more NUMA nodes than this, because its merge
  walks every combination of every resource's hints. Our merge does not (docs/merge-algorithm.md),
  so it has no need for the limit; it is still enforced, with the kubelet's message, so that a
  configuration moved from a kubelet behaves the same. Raise it to use machines with more nodes.

Both options are GA in the kubelet release this follows, so no feature gate applies. An unknown
name is an error: ``unknown Topology Manager Policy option: "<name>"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from nri_numa.engine.hints import MergeError

PREFER_CLOSEST_NUMA_NODES = "prefer-closest-numa-nodes"
MAX_ALLOWABLE_NUMA_NODES = "max-allowable-numa-nodes"
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_GO_DECIMAL = r"[+-]?[0-9]+"  # compiled (and kept) by re on first use
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


class PolicyOptionError(MergeError):
    """A topologyManagerPolicyOptions entry the kubelet would refuse, with the kubelet's words."""


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    prefer_closest_numa_nodes: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES


def parse_policy_options(options: Mapping[str, str] | None) -> PolicyOptions:
    """Options by kubelet name → values; the first bad entry (in the mapping's order) raises."""
    prefer_closest = False
    max_nodes = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name, value in (options or {}).items():
        if not isinstance(name, str):
            raise PolicyOptionError(f"Topology Manager Policy option names are strings, got {name!r}")
        if name == PREFER_CLOSEST_NUMA_NODES:
            prefer_closest = _parse_bool(name, value)
        elif name == MAX_ALLOWABLE_NUMA_NODES:
            max_nodes = _parse_max_nodes(name, value)
        else:
            raise PolicyOptionError(f"unknown Topology Manager Policy option: {go_quote(name)}")
    return PolicyOptions(prefer_closest, max_nodes)


def go_quote(text: str) -> str:
    """Go's %q for the strings that appear in these messages."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _parse_bool(name: str, value: object) -> bool:
    text = _text(name, value)
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    raise PolicyOptionError(
        f"bad value for option {go_quote(name)}: strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")


def _parse_max_nodes(name: str, value: object) -> int:
    text = _text(name, value)
    prefix = f"unable to convert policy option to integer {go_quote(name)}: strconv.Atoi: parsing {go_quote(text)}"
    if not re.fullmatch(_GO_DECIMAL, text):
        raise PolicyOptionError(f"{prefix}: invalid syntax")
    number = int(text)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise PolicyOptionError(f"{prefix}: value out of range")
    if number < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
        raise PolicyOptionError(
            f"the minimum value of {go_quote(name)} should not be less than {DEFAULT_MAX_ALLOWABLE_NUMA_NODES}")
    return number


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise PolicyOptionError(f"option {go_quote(name)}: values are strings, got {value!r}")
    return value

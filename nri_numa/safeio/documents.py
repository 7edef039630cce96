"""YAML and JSON documents read with bounds, for every file and message nri-numa parses.

A parser left to itself turns a short text into unbounded work: PyYAML's composer recurses once
per nesting level (1000 ``[`` raise RecursionError), a chain of aliases expands a kilobyte into
billions of values for whoever walks the result, ``&a [*a]`` is a list that contains itself,
tags construct values no reader expects (``!!binary``, ``!!set``, dates) or fail with a bare
ValueError (``!!float y``), and a long run of digits costs quadratic time to convert or raises
past 4300 digits. Here every document is measured before it is constructed: nesting, values
counted as often as aliases use them, cycles, tags, digits. Every failure is a
``DocumentError`` with one line: ``<where>: line <n>: <problem>``.

Only plain values come out: strings, integers, floats, booleans, null, lists and maps. An
unquoted date or ``=`` stays a string, as Kubernetes' YAML reader keeps it; an explicit tag
outside that set is refused.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from nri_numa.safeio.bounds import (MAX_DEPTH, MAX_DIGITS, MAX_NODES, BoundError, check_tree, quote,
                                    quote_some)

_YAML = "tag:yaml.org,2002:"
PLAIN_TAGS = frozenset(_YAML + t for t in ("str", "int", "float", "bool", "null", "seq", "map",
                                           "merge"))
_CHECKED_SCALARS = frozenset(_YAML + t for t in ("int", "float", "bool", "null"))
_DROPPED_RESOLVERS = frozenset(_YAML + t for t in ("timestamp", "value"))
_MAX_FLOAT_TEXT = 64


class DocumentError(ValueError):
    """A document past a bound, or with a value nri-numa does not read; one line."""


class NotParsedError(DocumentError):
    """The text does not parse as YAML (or JSON) at all; ``detail`` is the parser's word,
    for callers that phrase the line their own way."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail or message


# --- JSON ------------------------------------------------------------------------------------


class _LongNumber(Exception):
    pass


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _LongNumber()
    return int(text)


def _float(text: str) -> float:
    if len(text) > _MAX_FLOAT_TEXT:
        raise _LongNumber()
    return float(text)


def load_json(text: str | bytes, where: str) -> Any:
    """The JSON value of ``text``; NotParsedError when it is not JSON, DocumentError past the
    bounds (nesting, values, digits)."""
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float)
    except _LongNumber:
        raise DocumentError(f"{where}: holds a number of more than {MAX_DIGITS} digits") from None
    except RecursionError:  # the C scanner stops at the interpreter's limit, before any crash
        raise DocumentError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        detail = f"not UTF-8 at byte {e.start}"
        raise NotParsedError(f"{where}: not JSON: {detail}", detail) from None
    except json.JSONDecodeError as e:
        raise NotParsedError(f"{where}: not JSON: {e}", str(e)) from None
    try:
        check_tree(value, where)
    except BoundError as e:
        raise DocumentError(str(e)) from None
    return value


# --- YAML ------------------------------------------------------------------------------------


def load_yaml(text: str, where: str, *, fast: bool = False) -> list[Any]:
    """Every document of a YAML text, each a plain value. ``fast``: libyaml's parser where it
    is installed (its messages differ from PyYAML's; for files read by machines, not people)."""
    import yaml

    documents: list[Any] = []
    loader = None
    try:
        # PyYAML's reader refuses some characters as it is made: inside the try.
        loader = _loader_class(fast)(text)
        while loader.check_node():
            node = loader.get_node()
            _check_nodes(node)
            documents.append(loader.construct_document(node))
    except _At as e:
        raise DocumentError(f"{where}: line {e.line}: {e.problem}") from None
    except yaml.YAMLError as e:
        detail = yaml_problem(e)
        raise NotParsedError(f"{where}: not valid YAML: {detail}", detail) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # Checked above; kept so that no constructor's surprise leaves as a traceback.
        raise DocumentError(f"{where}: cannot read a value: {type(e).__name__}: "
                            f"{quote(str(e), 80)}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return documents


def yaml_problem(e: Exception) -> str:
    """``line N: <problem>`` of a YAMLError."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


_LOADERS: dict[bool, type] = {}


def _loader_class(fast: bool) -> type:
    if fast not in _LOADERS:
        _LOADERS[fast] = _make_loader(fast)
    return _LOADERS[fast]


def _make_loader(fast: bool) -> type:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader) if fast else yaml.SafeLoader

    class BoundedLoader(base):  # type: ignore[misc, valid-type]
        # Dates and "=" are read as the strings they are (as Kubernetes does), not as dates
        # and PyYAML's value tag.
        yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED_RESOLVERS]
            for first, resolvers in base.yaml_implicit_resolvers.items()}

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0

        # PyYAML's own composer recurses per level: stop it long before the interpreter's
        # limit. (libyaml's parser, in C, stops at its own limit of 1000 with a YAMLError.)
        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise _At(self.peek_event().start_mark,
                              f"nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return BoundedLoader


def _scalar_patterns() -> dict[str, list[Any]]:
    import yaml

    patterns: dict[str, list[Any]] = {}
    for resolvers in yaml.SafeLoader.yaml_implicit_resolvers.values():
        for tag, rx in resolvers:
            if tag in _CHECKED_SCALARS and rx not in patterns.setdefault(tag, []):
                patterns[tag].append(rx)
    return patterns


_PATTERNS: dict[str, list[Any]] = {}


def _check_nodes(root: Any) -> None:
    """_At for a document past the bounds: nesting deeper than MAX_DEPTH or more
    than MAX_NODES values with aliases expanded, an alias inside the node it names, a tag
    that is not plain, a scalar its tag cannot read, a number too long. Each distinct node is
    visited once (aliases share theirs), without recursion."""
    import yaml

    if not _PATTERNS:
        _PATTERNS.update(_scalar_patterns())
    measured: dict[int, tuple[int, int]] = {}  # id(node) → (values, nesting)
    open_nodes: set[int] = set()  # the path from the root: an alias to one is a cycle
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            kids = _children(node)
            size = 1 + sum(measured[id(k)][0] for k in kids)
            depth = (1 + max((measured[id(k)][1] for k in kids), default=0)
                     if not isinstance(node, yaml.ScalarNode) else 0)
            if depth > MAX_DEPTH:
                raise _At(node, f"nested deeper than {MAX_DEPTH} levels")
            if size > MAX_NODES:
                raise _At(node, f"holds more than {MAX_NODES} values (aliases counted "
                                "each time they are used)")
            measured[key] = (size, depth)
            continue
        if key in measured:
            continue
        if key in open_nodes:
            raise _At(node, "an alias refers to a node it is inside of")
        _check_tag(node)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in measured)


class _At(Exception):
    """A problem at a place in the text: a node, or a mark (PyYAML's position)."""

    def __init__(self, at: Any, problem: str) -> None:
        super().__init__(problem)
        mark = getattr(at, "start_mark", at)
        self.line = mark.line + 1 if mark is not None else "?"
        self.problem = problem


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _check_tag(node: Any) -> None:
    import yaml

    tag = node.tag
    if tag not in PLAIN_TAGS:
        shown = "!!" + tag[len(_YAML):] if tag.startswith(_YAML) else tag
        raise _At(node, f"tag {quote(shown)} is not read (only strings, numbers, booleans, "
                        "null, lists and maps)")
    if not isinstance(node, yaml.ScalarNode) or tag not in _CHECKED_SCALARS:
        return
    value = node.value
    if tag.endswith(":int") and sum(c.isdigit() for c in value) > MAX_DIGITS:
        raise _At(node, f"holds a number of more than {MAX_DIGITS} digits")
    if tag.endswith(":float") and len(value) > _MAX_FLOAT_TEXT:
        raise _At(node, f"holds a number of more than {_MAX_FLOAT_TEXT} characters")
    # An explicit tag on a value it does not fit (!!float y) would fail in the constructor.
    if not any(rx.match(value) for rx in _PATTERNS.get(tag, ())):
        raise _At(node, f"{quote(value)} cannot be read as !!{tag[len(_YAML):]}")


def documents(text: str, where: str) -> list[Any]:
    """Every document of a YAML text; a text that is a JSON object or array is read as JSON,
    without loading the YAML parser (short-lived hook processes would pay for it on every
    container start, and it is much slower)."""
    if text.lstrip().startswith(("{", "[")):
        try:
            return [load_json(text, where)]
        except NotParsedError:
            pass  # YAML flow style is not always JSON: let the YAML parser judge it
    return load_yaml(text, where)


def known_mapping(data: Any, where: str, keys: Collection[str],
                  error: type[Exception]) -> Mapping[str, Any]:
    """``data`` when it is a mapping with only ``keys``; else ``error`` with one line naming
    ``where`` and the unknown keys (quoted: a key may be any text)."""
    if not isinstance(data, Mapping):
        raise error(f"{where} must be a mapping, not {type(data).__name__}")
    unknown = [k for k in data if k not in keys]
    if unknown:
        raise error(f"{where}: unknown keys {quote_some(unknown)} (known: "
                    f"{', '.join(sorted(keys))})")
    return data

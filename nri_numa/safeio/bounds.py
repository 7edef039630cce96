"""Bounds on what nri-numa reads, and the words its one-line errors quote a bad value with.

Every input class (configuration, pods files, topology JSON, the OCI state and spec, NRI
messages, annotations, CDI specs, PodResources replies, the hook daemon's requests) is checked
against a bound before anything is expanded from it: a CPU list is measured before its ranges
become sets, a document's nesting before it is walked (docs/refusals.md, "Bad input"). A value
that breaks one is refused with one line that names the field by its path and quotes at most a
short prefix of the value: an error that echoes a megabyte back is a second failure.

This module sits below every package and imports nothing of nri-numa's, so that the topology
layer and the hook's thin client can use it as the CLI does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from reprlib import Repr
from typing import Any

QUOTE_LIMIT = 40  # characters of a bad value an error line shows
LINE_LIMIT = 500  # characters of an error line, its prefix included
MAX_DEPTH = 64  # nesting of any document read: a pod manifest nests about 10 deep
MAX_NODES = 250_000  # values in one document, aliases counted as often as they are used
MAX_DIGITS = 40  # of a number in a document: ids, sizes and times have at most 20
MAX_NAME = 1024  # characters of a container or pod id or name, a namespace or a uid
MAX_ANNOTATION_VALUE = 4096  # characters of a numa.nri.io/ annotation's value


class BoundError(ValueError):
    """A value past one of the bounds; the message is one line naming the value's path."""


# A short repr of any value: a few items of a container, a few levels deep, never recursing
# through a deep document (repr would raise RecursionError there) nor through a huge one.
_SHORT = Repr()
_SHORT.maxlevel = 3
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxfrozenset = 4
_SHORT.maxstring = _SHORT.maxother = QUOTE_LIMIT
_SHORT.maxlong = MAX_DIGITS


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` when it is short; else a prefix of it, an ellipsis and the size:
    ``'0-4294967295,0-4294…' (1048576 characters)``. Newlines, control characters and lone
    surrogates come out escaped, as repr writes them, so the result is one line that any
    stream can encode."""
    if isinstance(value, str | bytes):
        shown = repr(value[:limit])
        if len(shown) > limit + 2:  # escapes (\udc80 is six characters) count too
            shown = _cut_repr(value[:limit], limit)
        elif len(value) <= limit:
            return shown
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{shown[:-1]}…{shown[-1]} ({len(value)} {unit})"
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        # str() of an int past 4300 digits raises; the size says enough.
        if value.bit_length() > 3 * MAX_DIGITS:
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
        return repr(value)
    try:
        text = _SHORT.repr(value)
    except Exception:  # a value whose repr fails: its type says what it is
        text = f"<{type(value).__name__}>"
    text = printable(text)
    if len(text) > limit + 20:  # containers get a little more room for their brackets
        text = text[:limit + 20] + "…"
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        text += f" ({len(value)} {'keys' if isinstance(value, Mapping) else 'items'})" \
            if len(value) > 4 else ""
    return text


def quote_some(values: list[Any], shown: int = 3) -> str:
    """The first ``shown`` values quoted, then how many more: unknown keys of a document, which
    may be any text (newlines and lone surrogates included) and any number of them."""
    named = ", ".join(quote(v) for v in values[:shown])
    return named + (f" and {len(values) - shown} more" if len(values) > shown else "")


def _cut_repr(value: str | bytes, limit: int) -> str:
    """The repr of the longest prefix of ``value`` whose repr, quotes aside, fits ``limit``:
    cut between escapes, never inside one."""
    whole = repr(value)
    quote_mark, body = whole[-1], []
    size = 0
    for i in range(len(value)):
        piece = repr(value[i:i + 1])
        piece = piece[piece.index(piece[-1]) + 1:-1]  # bytes reprs start with b
        if size + len(piece) > limit:
            break
        body.append(piece)
        size += len(piece)
    return f"{whole[:whole.index(quote_mark)]}{quote_mark}{''.join(body)}{quote_mark}"


def clip(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` as it is when short and printable, for messages that show a value bare (the
    kubelet's texts do); else escaped and cut like ``quote``, without the quotes."""
    if len(text) <= limit and text.isprintable():
        return text
    cut = printable(text[:limit])
    if len(cut) <= limit and len(text) <= limit:
        return cut
    return f"{cut[:limit]}… ({len(text)} characters)"


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """A message as one line of at most ``limit`` characters: whitespace runs (newlines
    included) become one space, characters a stream cannot write (lone surrogates) or a
    terminal would act on (control characters) are escaped, and a longer line is cut."""
    line = " ".join(text.split())
    if not line.isprintable():
        line = printable(line)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def printable(text: str) -> str:
    """``text`` with every character that is not printable (newlines, control characters,
    lone surrogates) escaped as repr escapes it; printable text, non-ASCII included, is kept."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def join_problems(problems: Iterable[str], limit: int = LINE_LIMIT - 100) -> str:
    """Problems joined with "; " up to about ``limit`` characters, then how many more there
    are: a file with ten thousand bad keys is one line too."""
    shown: list[str] = []
    size = 0
    problems = list(problems)
    for i, problem in enumerate(problems):
        if shown and size + len(problem) > limit:
            left = len(problems) - i
            shown.append(f"and {left} more problem{'s' if left > 1 else ''}")
            break
        shown.append(problem)
        size += len(problem) + 2
    return "; ".join(shown)


_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})


def check_tree(value: Any, where: str, max_depth: int = MAX_DEPTH,
               max_nodes: int = MAX_NODES) -> None:
    """BoundError when a parsed document (dicts, lists, scalars) nests deeper than
    ``max_depth`` or holds more than ``max_nodes`` values. Iterative: a document deep enough to
    exhaust the interpreter's stack is measured, not recursed into."""
    if _plainly_within(value, max_depth, max_nodes):
        return
    _walk(value, where, max_depth, max_nodes)


def _plainly_within(value: Any, max_depth: int, max_nodes: int) -> bool:
    """True when a document of plain dicts, lists and scalars is within both bounds: one pass
    per level over exact types, without the ABC checks ``_walk`` makes of every value. False
    for anything else, out of bounds or not plain: ``_walk`` then decides, and words the error
    exactly as it always did."""
    level = [value]
    depth = nodes = 0
    while level:
        depth += 1
        nodes += len(level)
        if nodes > max_nodes:
            return False
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind in _PLAIN_SCALARS:
                continue
            if depth > max_depth:
                return False
            if kind is dict:
                below += item
                below += item.values()
            elif kind is list:
                below += item
            else:
                return False
        level = below
    return True


def _walk(value: Any, where: str, max_depth: int, max_nodes: int) -> None:
    stack = [(value, 1)]
    nodes = 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise BoundError(f"{where}: holds more than {max_nodes} values")
        if isinstance(item, Mapping):
            children: Iterable[Any] = (x for pair in item.items() for x in pair)
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > max_depth:
            raise BoundError(f"{where}: nested deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children)

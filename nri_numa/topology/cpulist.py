"""The kernel's two ways of writing a set of small integers: lists and masks.

A *list* is ``0-3,8,10-11`` (sysfs ``cpulist``, ``online``, cgroup ``cpuset.cpus``); a *mask* is
comma-separated 32-bit hex words, most significant first (``0000,00000f0f``). Files read from sysfs
may end in NUL bytes or carry stray whitespace, and an empty string is the empty set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from nri_numa.safeio.bounds import quote as _shown  # the whole of a short text, a prefix of a long one

_JUNK = " \t\r\n\x00"
# Far above any kernel's CPU or NUMA node ids (NR_CPUS is at most 8192). A list read from a
# damaged file ("0-4000000000") would otherwise build a set of billions of ints.
MAX_ID = (1 << 16) - 1
# What one list may expand to in all: each id once. A list naming more is not a set of a
# machine's CPUs ("0-65535,0-65535,..." would cost a second per thousand repeats), and is
# refused from the lengths of its ranges, before any is expanded.
MAX_EXPANDED = MAX_ID + 1
# One element: ASCII digits only (int() would take "١" or "1_0"), few enough of them that no
# conversion is slow; a longer number is above MAX_ID anyway.
_ELEMENT = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?(?::([0-9]{1,20}))?")


class ListFormatError(ValueError):
    """A string that is not a kernel list or mask."""


def parse_list(text: str) -> frozenset[int]:
    """``"0-3,8"`` → ``{0, 1, 2, 3, 8}``. Accepts the ``A-B:S`` stride form the kernel reads."""
    text = text.strip(_JUNK)
    if not text:
        return frozenset()
    spans = []
    expanded = 0
    for part in text.split(","):
        part = part.strip(_JUNK)
        if not part:
            raise ListFormatError(f"empty element in list {_shown(text)}")
        element = _ELEMENT.fullmatch(part)
        if element is None:
            raise ListFormatError(f"bad element {_shown(part)} in list {_shown(text)}")
        first_text, last_text, stride_text = element.groups()
        first = int(first_text)
        last = int(last_text) if last_text is not None else first
        stride = int(stride_text) if stride_text is not None else 1
        if last < first or stride < 1:
            raise ListFormatError(f"bad range {_shown(part)} in list {_shown(text)}")
        if last > MAX_ID:
            raise ListFormatError(f"{_shown(part)}: ids go up to {MAX_ID}")
        expanded += (last - first) // stride + 1
        if expanded > MAX_EXPANDED:
            raise ListFormatError(f"list {_shown(text)} names more than {MAX_EXPANDED} ids, "
                                  "counting repeats")
        spans.append(range(first, last + 1, stride))
    out: set[int] = set()
    for span in spans:
        out.update(span)
    return frozenset(out)


def format_list(ids: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` → ``"0-3,8"`` (ascending, ranges merged)."""
    parts: list[str] = []
    run_start = run_end = None
    for i in sorted(set(ids)):
        if run_end is not None and i == run_end + 1:
            run_end = i
            continue
        if run_start is not None:
            parts.append(_span(run_start, run_end))
        run_start = run_end = i
    if run_start is not None:
        parts.append(_span(run_start, run_end))
    return ",".join(parts)


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def parse_mask(text: str) -> frozenset[int]:
    """``"0000,0000000f"`` → ``{0, 1, 2, 3}``."""
    text = text.strip(_JUNK).replace(",", "")
    if not text:
        return frozenset()
    try:
        value = int(text, 16)
    except ValueError:
        raise ListFormatError(f"bad mask {_shown(text)}") from None
    if value.bit_length() > MAX_ID + 1:
        raise ListFormatError(f"mask {_shown(text)}: ids go up to {MAX_ID}")
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_mask(ids: Iterable[int], width_bits: int = 32) -> str:
    """``{0, 1, 2, 3}`` → ``"0000000f"``; at least ``width_bits`` wide, 32-bit words, MSW first."""
    value = 0
    for i in ids:
        value |= 1 << i
    words = max(1, -(-max(width_bits, value.bit_length()) // 32))
    return ",".join(f"{value >> (32 * w) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))


# The plugin formats one shared pool (a frozenset, which keeps its hash) into many updates and
# checkpoint records per decision: each pool is formatted once. The cache holds its sets: a
# pool of a 5120-CPU machine is ~130 KB, so it keeps only the recent ones.
format_cached = lru_cache(maxsize=32)(format_list)

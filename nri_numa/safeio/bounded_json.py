"""JSON read from files nri-numa keeps, with bounds checked before the parser sees it.

``json.loads`` recurses once per nesting level: 100000 ``[`` raise RecursionError, which no
caller expects, and a deeper stack could crash the interpreter. It turns a long run of digits
into an int, which raises ValueError past ``sys.get_int_max_str_digits()`` (4300 by default,
unlimited under PYTHONINTMAXSTRDIGITS=0, where it costs quadratic time instead). So a cheap scan
runs first: strings are cut out (a bracket or digit inside one means nothing), then the depth
of the brackets left and the longest run of digits are measured, all with bytes methods at C
speed (a regular expression over the strings took twice as long as the parse). Nothing
nri-numa writes comes near either bound.
"""

from __future__ import annotations

import json
from itertools import accumulate
from typing import Any

# The bounds every document has (a checkpoint nests about 10 deep, a topology about 6).
from nri_numa.safeio.bounds import MAX_DEPTH, MAX_DIGITS


_DIGITS_AS_ZEROS = bytes(ord("0") if chr(b) in "0123456789" else ord(" ") for b in range(256))
_LONG_NUMBER = b"0" * (MAX_DIGITS + 1)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
for _b in b"[{":
    _STEP[_b] = 1
for _b in b"]}":
    _STEP[_b] = -1


class JsonShapeError(ValueError):
    """Bytes that are not JSON, or JSON past the bounds; the message is one line."""


def loads(raw: bytes) -> Any:
    """The JSON value of UTF-8 ``raw``; JsonShapeError for anything else, the bounds
    included."""
    check_shape(raw)
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise JsonShapeError(f"not JSON (truncated or garbled?): not UTF-8 at byte "
                             f"{e.start}") from None
    except ValueError as e:  # JSONDecodeError, or an int the interpreter will not convert
        raise JsonShapeError(f"not JSON (truncated or garbled?): {_first_line(e)}") from None
    except RecursionError:  # the scan rules it out; kept so that no stack depth escapes
        raise JsonShapeError(f"JSON nested deeper than {MAX_DEPTH} levels") from None


def check_shape(raw: bytes) -> None:
    """JsonShapeError when ``raw`` nests deeper than MAX_DEPTH or holds a number longer than
    MAX_DIGITS digits. Bytes that are not JSON may pass: the parser then says so."""
    outside = _outside_strings(raw)
    if _LONG_NUMBER in outside.translate(_DIGITS_AS_ZEROS):
        raise JsonShapeError(f"holds a number of more than {MAX_DIGITS} digits")
    brackets = outside.translate(None, _NOT_BRACKETS)
    # Over the part a parser accepts, this running sum is its depth. Past its first error the
    # parser stops, so a maximum reached there only refuses a file it refuses anyway.
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH:
        raise JsonShapeError(f"JSON nested deeper than {MAX_DEPTH} levels")


def _outside_strings(raw: bytes) -> bytes:
    """``raw`` without its strings' contents. In JSON a backslash occurs only in a string and
    always starts a two-byte escape (``\\uXXXX`` goes on with hex digits), so dropping the
    escaped backslashes, then the escaped quotes, leaves quotes that only open and close
    strings: every other piece between them is outside. Past the first error of a file that
    is not JSON the pieces may be wrong, and the parser refuses that file anyway."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b" ".join(raw.split(b'"')[0::2])


def _first_line(e: Exception) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__

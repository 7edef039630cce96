"""JSON read from nri-numa's own files: nesting and long numbers refused before the parser
recurses or converts, and brackets, digits, quotes and backslashes inside strings never
counted."""

from __future__ import annotations

import json

import pytest

from nri_numa.safeio.bounded_json import MAX_DEPTH, MAX_DIGITS, JsonShapeError, loads


@pytest.mark.parametrize("raw, why", [
    (b"[" * 100_000, "JSON nested deeper than 64 levels"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "JSON nested deeper than 64 levels"),
    (b'{"a":' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "nested deeper"),
    (b'{"version": 1' + b"0" * 5000 + b"}", "holds a number of more than 40 digits"),
    (b"[0." + b"1" * (MAX_DIGITS + 1) + b"]", "more than 40 digits"),
    (b'{"a": "x"} trailing', "not JSON (truncated or garbled?): Extra data"),
    (b'{"a": "\\u00e9\xff"}', "not JSON (truncated or garbled?): not UTF-8 at byte 13"),
    (b'"\\', "not JSON"),
])
def test_what_is_refused(raw, why):
    with pytest.raises(JsonShapeError) as caught:
        loads(raw)
    assert why in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("value", [
    "[" * 1000,  # brackets inside a string are text
    {"a": "]" * 10 + "[" * 200},
    {"id": "1" * 500},  # digits inside a string are text
    {"q": '\\"[[[[' * 50},  # escaped backslashes and quotes around brackets
    {"q": "\\" * 7 + '"' + "[" * 100},
    {"n": 10 ** (MAX_DIGITS - 1), "f": 1.5e300, "neg": -12},
    json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH),
])
def test_what_passes_as_json_does(value):
    raw = json.dumps(value).encode()
    assert loads(raw) == value


def test_a_big_checkpoint_like_document_passes():
    value = {"containers": [{"id": f"{i:064x}", "cpus": "0-3", "request": {"a": "v[]\\\""}}
                            for i in range(2000)]}
    assert loads(json.dumps(value).encode()) == value

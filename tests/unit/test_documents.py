"""nri_numa.safeio.documents: YAML and JSON read with their nesting, size, tags and digits bounded,
each refusal one line naming the line of the text."""

from __future__ import annotations

import pytest

from nri_numa.safeio.documents import DocumentError, NotParsedError, documents, load_json, load_yaml

LAUGHS = "".join(f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10 if p else ["x"] * 10) + "]\n"
                 for p, c in zip(["", "a", "b", "c", "d", "e"], "abcdef"))


@pytest.mark.parametrize("text, problem", [
    ("a: !!float y", "f: line 1: 'y' cannot be read as !!float"),
    ("a: !!binary aGVsbG8=", "f: line 1: tag '!!binary' is not read"),
    ("a: !!python/object:os.system x", "f: line 1: tag '!!python/object:os.system' is not read"),
    ("a: !!set {x}", "f: line 1: tag '!!set' is not read"),
    ("a: " + "[" * 1000, "f: line 1: nested deeper than 64 levels"),
    ("- " * 100 + "x", "f: line 1: nested deeper than 64 levels"),
    ("&a [*a]", "f: line 1: an alias refers to a node it is inside of"),
    (LAUGHS, "f: line 6: holds more than 250000 values (aliases counted each time they are "
             "used)"),
    ("a: " + "9" * 41, "f: line 1: holds a number of more than 40 digits"),
])
@pytest.mark.parametrize("fast", [False, True], ids=["pyyaml", "libyaml"])
def test_yaml_past_a_bound_is_one_line(text, problem, fast):
    with pytest.raises(DocumentError) as e:
        load_yaml(text, "f", fast=fast)
    assert str(e.value).startswith(problem) or (fast and "nesting" in str(e.value)), e.value


def test_plain_yaml_reads_as_before_with_dates_as_strings():
    text = "a: 1\nb: [x, 2.5, true, null]\nc: 2024-01-01\nd: =\ne: &x {k: v}\nf: *x\n"
    assert load_yaml(text, "f") == [{"a": 1, "b": ["x", 2.5, True, None], "c": "2024-01-01",
                                     "d": "=", "e": {"k": "v"}, "f": {"k": "v"}}]
    assert load_yaml("a: 1\n---\nb: 2\n", "f") == [{"a": 1}, {"b": 2}]


def test_text_that_is_not_yaml_keeps_the_parsers_word():
    with pytest.raises(NotParsedError, match="f: not valid YAML: line 2") as e:
        load_yaml("a: [\n", "f")
    assert e.value.detail.startswith("line 2")
    with pytest.raises(NotParsedError, match="special characters are not allowed"):
        load_yaml("\x1f", "f")


@pytest.mark.parametrize("text, problem", [
    ("[" * 100_000, "j: nested deeper than 64 levels"),
    ("[" * 70 + "]" * 70, "j: nested deeper than 64 levels"),
    ('{"a": ' + "1" * 41 + "}", "j: holds a number of more than 40 digits"),
    ("[" + "1" * 5000 + "]", "j: holds a number of more than 40 digits"),
])
def test_json_past_a_bound_is_one_line(text, problem):
    with pytest.raises(DocumentError, match=problem):
        load_json(text, "j")


def test_json_objects_and_arrays_skip_the_yaml_parser():
    assert documents('{"a": "\\udc80"}', "f") == [{"a": "\udc80"}]
    assert documents("[1, 2]", "f") == [[1, 2]]
    assert documents("{a: 1}", "f") == [{"a": 1}]  # flow YAML, not JSON

"""nri_numa.safeio.bounds: how a bad value is shown, and the one line every refusal becomes; the
CLI's line for a bug of its own."""

from __future__ import annotations

import pytest

from nri_numa.cli import main
from nri_numa.safeio.bounds import BoundError, check_tree, clip, join_problems, one_line, quote


@pytest.mark.parametrize("value, shown", [
    ("static", "'static'"),
    ({"a": 1}, "{'a': 1}"),
    ("a\nb\udc80", "'a\\nb\\udc80'"),
    ("x" * 41, "'" + "x" * 40 + "…' (41 characters)"),
    (b"\xff" * 50, "b'" + "\\xff" * 10 + "…' (50 bytes)"),
    (list(range(100)), "[0, 1, 2, 3, ...] (100 items)"),
    (10 ** 5000, "an integer of about 5001 digits"),
    (float("nan"), "nan"),
], ids=lambda v: repr(v)[:20] if not isinstance(v, int) else "int")
def test_quote_shows_a_short_prefix_and_the_size(value, shown):
    assert quote(value) == shown


def test_quote_survives_what_repr_does_not():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert quote(deep) == "[[[[...]]]]"


def test_clip_keeps_a_short_printable_text_bare_and_cuts_the_rest():
    assert clip("0-3,8") == "0-3,8"
    assert clip("0-65535," * 10) == "0-65535,0-65535,0-65535,0-65535,0-65535,… (80 characters)"
    assert clip("a\nb") == "a\\nb"


def test_one_line_joins_escapes_and_cuts():
    assert one_line("2 problems:\n  - a\n  - b") == "2 problems: - a - b"
    assert one_line("id \udc80x\x1b[2J") == "id \\udc80x\\x1b[2J"
    assert one_line("x" * 600) == "x" * 499 + "…"


def test_join_problems_says_how_many_it_left_out():
    assert join_problems(["a", "b"]) == "a; b"
    joined = join_problems([f"problem {i} " + "x" * 100 for i in range(100)])
    assert joined.endswith("and 97 more problems") and len(joined) < 500


def test_check_tree_measures_without_recursing():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(BoundError, match="f: nested deeper than 64 levels"):
        check_tree(deep, "f")
    with pytest.raises(BoundError, match="holds more than 10 values"):
        check_tree(list(range(20)), "f", max_nodes=10)
    check_tree({"a": [1, {"b": 2}]}, "f")


def test_a_bug_is_one_line_and_its_traceback_is_asked_for(monkeypatch, capsys):
    import nri_numa.cli.presets as presets

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(presets, "cmd_presets", broken)  # the parser is built at each main()
    monkeypatch.setattr("nri_numa.agent.logs._configured", False)  # no agent's log set up
    monkeypatch.delenv("NRI_NUMA_DEBUG", raising=False)
    assert main(["presets"]) == 1
    assert capsys.readouterr().err == ("nri-numa: internal error: RuntimeError: boom second line "
                                       "(a bug in nri-numa; NRI_NUMA_DEBUG=1 shows where)\n")
    monkeypatch.setenv("NRI_NUMA_DEBUG", "1")
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("shows where)\n")

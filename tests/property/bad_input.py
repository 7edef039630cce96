"""What the bad-input property tests share: hostile values and texts, and the checks every
refusal must pass (docs/refusals.md, "Bad input"): one line, at most LINE_LIMIT characters, no
traceback, writable by any stream."""

from __future__ import annotations

import copy
import io
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from nri_numa.cli import main
from nri_numa.safeio.bounds import LINE_LIMIT

def with_value(document: Any, path: tuple, value: Any) -> Any:
    """A copy of ``document`` with the item at ``path`` (keys and indexes) set to ``value``."""
    changed = copy.deepcopy(document)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


def examples(n: int) -> int:
    """``n`` examples, sized for CI (a few seconds a test on two cores); a longer hunt sets
    BAD_INPUT_EXAMPLES."""
    return int(os.environ.get("BAD_INPUT_EXAMPLES", n))


# A value one field of an input may hold: anything JSON or YAML can say, and then some.
LONG = st.builds(lambda c, n: c * n, st.sampled_from(["x", "9", "0-65535,", "\n", "\udc80", "é"]),
                 st.integers(1000, 200_000))
TEXT = st.one_of(
    st.text(max_size=30),
    # Lone surrogates (what JSON's "\udc80" gives), control characters, line separators.
    st.text(alphabet=st.characters(categories=["Cs", "Cc", "Zl", "Zp", "Ll", "Nd"]),
            max_size=30),
    st.sampled_from(["", " ", "\n", "a\nb", "\udc80x", "0-4294967295", "0-65535,0-65535",
                     "1_0", "١", "9" * 50, "-1", "none", "static", "Static", "pod", "true",
                     "nvidia.com/gpu=2", "numa.nri.io/x", "2Gi", "1e999", "NaN"]),
    LONG,
)
NUMBER = st.one_of(st.integers(), st.integers(-(10 ** 60), 10 ** 60),
                   st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0, -1, 1, 65535, 65536, 2 ** 63, 2 ** 64, 10 ** 39]))
SCALAR = st.one_of(st.none(), st.booleans(), NUMBER, TEXT)


def deep(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


NESTED = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
VALUE = st.one_of(
    NESTED, NESTED, NESTED,  # three in five: the other two are rarer shapes
    st.builds(deep, st.integers(60, 400)),
    st.builds(lambda n: list(range(n)), st.integers(100, 3000)),
)
# Texts a YAML or JSON reader must survive: its syntax, tags, anchors and aliases.
YAML_PIECES = ["[", "]", "{", "}", ": ", "- ", "\n", "  ", "&a ", "*a", "!!float ", "!!binary ",
               "!!set ", "!!python/object ", "? ", "|", ">", "'", '"', "#", ",", "---\n",
               "\\udc80", "0x1f", "9" * 45, "2024-01-01", "=", "<<: ", "key", "1.5", "~"]
YAML_TEXT = st.one_of(
    st.lists(st.sampled_from(YAML_PIECES), max_size=40).map("".join),
    st.text(max_size=200),
    st.builds(lambda n: "a: " + "[" * n, st.integers(60, 3000)),
    st.builds(lambda n: "- " * n + "x", st.integers(60, 500)),
)


def check_line(line: str, prefix: str = "") -> None:
    """A refusal as the user sees it: one bounded line, no traceback, any stream can take it."""
    assert "\n" not in line and "\r" not in line, repr(line[:300])
    assert len(line) <= LINE_LIMIT, (len(line), line[:300])
    assert line.startswith(prefix), line[:300]
    assert "Traceback" not in line
    line.encode("utf-8")  # no lone surrogate


def check_lines(err: str, prefix: str, *, at_most: int | None = 1) -> list[str]:
    """``err`` is whole lines, each a refusal; at most ``at_most`` of them (None: any)."""
    assert "Traceback" not in err and "Logging error" not in err, err[:2000]
    if not err:
        return []
    assert err.endswith("\n"), err[-300:]
    lines = err[:-1].split("\n")
    if at_most is not None:
        assert len(lines) <= at_most, err[:2000]
    for line in lines:
        check_line(line, prefix)
        # One line still, but a bad input should be named, not met by a bug of ours.
        assert "internal error" not in line, line
    return lines


def cli(argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """``nri-numa ARGV`` in process, with standard streams as a process has them (UTF-8;
    standard error escapes what it cannot encode, standard output does not unless told):
    exit status, standard output, standard error."""
    out_bytes, err_bytes = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(err_bytes, encoding="utf-8", errors="backslashreplace",
                           write_through=True)
    stdin_stream = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin_stream, out, err
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: not an input this suite sends
        raise AssertionError(f"argparse refused {argv}: {e}") from None
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return code, out_bytes.getvalue().decode("utf-8"), err_bytes.getvalue().decode("utf-8")


def files_under(folder: Path, skip: Iterable[Path] = ()) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` but those under ``skip``: name → (size, mtime)."""
    skipped = [str(p) for p in skip]
    found = {}
    for root, _, names in os.walk(folder):
        if any(root == s or root.startswith(s + os.sep) for s in skipped):
            continue
        for name in names:
            path = os.path.join(root, name)
            st_ = os.lstat(path)
            found[path] = (st_.st_size, st_.st_mtime_ns)
    return found

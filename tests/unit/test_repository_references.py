"""Every reference in the repository resolves inside the repository.

Users get the repository and nothing beside it, so a document that code or docs point at must be
in it. Three checks, each a function of a repository root that returns one message per dead
reference (``file:line: what``), so they can be run against any checkout:

``markdown_link_failures``
    Every relative link ``[text](target)``, ``![alt](target)``, reference definition
    ``[label]: target`` and ``<a href="target">`` in a Markdown file resolves, relative to the
    file's own folder, to a file or folder inside the repository; a link that leaves the
    repository root fails even where the target exists. A ``#anchor`` must name a heading of the
    target Markdown file (or of the file itself for a bare ``#anchor``), slugged the way GitHub
    does: lowercase, punctuation other than ``-`` and ``_`` dropped, each space a ``-``, and
    ``-1``, ``-2``... appended to repeated headings. Targets with a scheme (``http:``,
    ``https:``, ``mailto:``...) are not checked. Links inside code spans and fenced code blocks
    are text, not links, and are skipped.

``markdown_path_failures``
    Every path to a Markdown file (a token such as ``docs/engine.md`` or ``tests/e2e/README.md``,
    or one going up with ``../``: at least one ``/``, ending in ``.md``) named anywhere in a text
    file (code, comments, docstrings, scripts, YAML, TOML, Markdown, code blocks included)
    exists. The rule: such a path is taken relative to the repository root, and, failing that,
    relative to the folder of the file that names it (how a Markdown file links its
    neighbours); either way it must stay inside the repository. A path that is part of a URL
    (``https://.../README.md``) is skipped.

``bare_markdown_name_failures``
    Every bare Markdown file name (no ``/`` before it, e.g. ``engine.md`` in "see engine.md §2")
    is the name of some Markdown file of the repository, so citing a document that lives
    elsewhere by its bare name is caught too. An upstream document is cited by its URL (or by
    project and title), which neither this check nor the one above reads as a local name.

The files scanned are those git lists as tracked or as untracked but not ignored (a document
being written counts as soon as it exists); binary files are skipped. This file builds the dead
names of its own examples at run time, so that it passes its own checks.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]

MD = ".md"


# -------------------------------------------------------------------------------------- files

def repository_files(root: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files of the checkout at ``root``, as posix paths."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True).stdout
    names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
    return [n for n in names if (root / n).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _text_files(root: Path) -> Iterator[tuple[str, str]]:
    for name in repository_files(root):
        text = _text(root / name)
        if text is not None:
            yield name, text


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _inside(root: Path, target: Path) -> bool:
    try:
        target.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------------- markdown

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)")
_REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
_HREF = re.compile(r"<a\s[^>]*?href\s*=\s*[\"']([^\"']*)[\"']", re.I)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")


def _blank_code(text: str) -> str:
    """``text`` with fenced code blocks and code spans replaced by spaces (offsets kept)."""
    lines = text.splitlines(keepends=True)
    out, fence = [], None
    for line in lines:
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", line))
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
            out.append(re.sub(r"[^\n]", " ", line))
        else:
            out.append(line)
    joined = "".join(out)
    return _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), joined)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before any ``-N`` suffix for repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def markdown_anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown document, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _blank_fences_only(text).splitlines():
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        anchors.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return anchors


def _blank_fences_only(text: str) -> str:
    lines, out, fence = text.splitlines(keepends=True), [], None
    for line in lines:
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append("\n")
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
            out.append("\n")
        else:
            out.append(line)
    return "".join(out)


def _markdown_targets(text: str) -> Iterator[tuple[int, str]]:
    scan = _blank_code(text)
    for pattern in (_INLINE_LINK, _REFERENCE_DEF, _HREF):
        for m in pattern.finditer(scan):
            target = m.group(1)
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            yield _line_of(text, m.start(1)), target.strip()


def markdown_link_failures(root: Path) -> list[str]:
    root = root.resolve()
    failures = []
    anchors_of: dict[Path, set[str]] = {}

    def anchors(path: Path) -> set[str]:
        if path not in anchors_of:
            anchors_of[path] = markdown_anchors(path.read_text(encoding="utf-8"))
        return anchors_of[path]

    for name in repository_files(root):
        if not name.endswith(MD):
            continue
        source = root / name
        text = source.read_text(encoding="utf-8")
        for line, target in _markdown_targets(text):
            if not target or _SCHEME.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?", 1)[0])
            if path_part.startswith("/"):
                resolved = root / path_part.lstrip("/")
            elif path_part:
                resolved = source.parent / path_part
            else:
                resolved = source
            where = f"{name}:{line}"
            if not _inside(root, resolved):
                failures.append(f"{where}: link {target!r} leaves the repository")
                continue
            if not resolved.exists():
                failures.append(f"{where}: link {target!r}: no such file or folder")
                continue
            if anchor and resolved.is_file() and resolved.suffix == MD:
                if unquote(anchor).lower() not in anchors(resolved.resolve()):
                    failures.append(f"{where}: link {target!r}: no heading with anchor "
                                    f"#{anchor} in {resolved.resolve().relative_to(root)}")
    return failures


# ------------------------------------------------------------------------- paths and names

_MD_PATH = re.compile(r"(?<![\w./:@-])((?:[\w.-]+/)+[\w.-]+\.md)(?![\w-])")
_BARE_MD_NAME = re.compile(r"(?<![\w./:@-])([\w][\w.-]*\.md)(?![\w-])")


def markdown_path_failures(root: Path) -> list[str]:
    root = root.resolve()
    failures = []
    for name, text in _text_files(root):
        folder = (root / name).parent
        for m in _MD_PATH.finditer(text):
            path = m.group(1)
            candidates = [root / path, folder / path]
            if not any(_inside(root, c) and c.is_file() for c in candidates):
                failures.append(f"{name}:{_line_of(text, m.start(1))}: {path} does not exist "
                                f"in the repository")
    return failures


def bare_markdown_name_failures(root: Path) -> list[str]:
    root = root.resolve()
    files = repository_files(root)
    known = {Path(n).name for n in files if n.endswith(MD)}
    failures = []
    for name, text in _text_files(root):
        for m in _BARE_MD_NAME.finditer(text):
            bare = m.group(1)
            if bare not in known:
                failures.append(f"{name}:{_line_of(text, m.start(1))}: no file named {bare} "
                                f"in the repository")
    return failures


CHECKERS = (markdown_link_failures, markdown_path_failures, bare_markdown_name_failures)


# --------------------------------------------------------------------------------- the tests

def _report(failures: Iterable[str]) -> str:
    failures = list(failures)
    return f"{len(failures)} dead reference(s):\n" + "\n".join(failures)


@pytest.fixture(scope="module")
def git_checkout() -> Path:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the file list comes from git")
    return REPO


@pytest.mark.parametrize("checker", CHECKERS, ids=lambda c: c.__name__)
def test_every_reference_resolves(git_checkout, checker):
    failures = checker(git_checkout)
    assert not failures, _report(failures)


# The checkers themselves, on a small repository built for the purpose. Its texts write ``{md}``
# for the ``.md`` of their file names, so that this file does not name files it does not have.

def _md(text: str) -> str:
    return text.replace("{md}", MD)


def _write(root: Path, name: str, text: str) -> None:
    (root / _md(name)).write_text(_md(text), encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "pkg").mkdir()
    _write(root, "docs/guide{md}",
           "# Guide\n\n## 1. First part\n\n## Plugin settings (`nriNuma`)\n\n## Again\n\n"
           "## Again\n\n```\n## Not a heading\n```\n")
    _write(root, "README{md}", "# Top\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    _write(tmp_path, "outside{md}", "# Outside\n")
    return root


def test_links_that_resolve_pass(tree):
    _write(tree, "README{md}",
           "# Top\n[g](docs/guide{md}) [s](docs/guide{md}#1-first-part) [d](docs/) "
           "[n](docs/guide{md}#plugin-settings-nrinuma) [r](docs/guide{md}#again-1) [t](#top) "
           "[w](https://example.org/x{md}) `[c](code{md})`\n"
           "[ref]: docs/guide{md}\n<a href=\"docs/guide{md}#again\">a</a>\n"
           "```\n[x](nowhere{md})\n```\n")
    assert markdown_link_failures(tree) == []
    _write(tree, "README{md}", "# Top\n[x](docs/guide{md}#not-a-heading)\n")
    assert len(markdown_link_failures(tree)) == 1


def test_dead_links_are_named_with_file_and_line(tree):
    _write(tree, "README{md}",
           "# Top\n\n[a](docs/gone{md})\n[b](../outside{md})\n"
           "[c](docs/guide{md}#no-such-part)\n[d](#nope)\n<a href=\"gone{md}\">e</a>\n")
    failures = markdown_link_failures(tree)
    assert len(failures) == 5, failures
    assert failures[0].startswith(_md("README{md}:3: ")) and _md("docs/gone{md}") in failures[0]
    assert _md(":4: ") in failures[1] and "leaves the repository" in failures[1]
    assert ":5: " in failures[2] and "#no-such-part" in failures[2]
    assert ":6: " in failures[3] and "#nope" in failures[3]
    assert ":7: " in failures[4] and _md("gone{md}") in failures[4]


def test_markdown_paths_in_code_and_text(tree):
    _write(tree, "pkg/mod.py",
           '"""See docs/guide{md} §1 and docs/missing{md}."""\n'
           "# from the notes: ../outside{md}, and ../shared/docs/notes{md}\n"
           "URL = 'https://example.org/a/b{md}'\n")
    _write(tree, "docs/other{md}", "See ../README{md} and guide{md}.\n")
    assert markdown_path_failures(tree) == [_md(line) for line in (
        "pkg/mod.py:1: docs/missing{md} does not exist in the repository",
        "pkg/mod.py:2: ../outside{md} does not exist in the repository",
        "pkg/mod.py:2: ../shared/docs/notes{md} does not exist in the repository",
    )]


def test_bare_names_must_exist_somewhere(tree):
    _write(tree, "pkg/mod.py", "# guide{md} §1 is here; notes{md} §6 is not\n")
    _write(tree, "run.sh", "#!/bin/sh\n# see README{md}\n")
    assert bare_markdown_name_failures(tree) == [
        _md("pkg/mod.py:1: no file named notes{md} in the repository")]


def test_github_slugs():
    assert github_slug("4.7 takeByTopologyNUMAPacked") == "47-takebytopologynumapacked"
    assert github_slug("Plugin settings (`nriNuma`)") == "plugin-settings-nrinuma"
    assert github_slug("The [link](x{md}) and snake_case".replace("{md}", MD)) == \
        "the-link-and-snake_case"
    assert github_slug("§6. A — B") == "6-a--b"

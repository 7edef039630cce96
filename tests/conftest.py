"""Shared test fixtures: where ../shared lives, and the hwloc sysfs trees unpacked once."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(REPO.parent, "shared")
HWLOC_FIXTURES = SHARED / "fixtures" / "hwloc-sysfs"


def hwloc_fixture_names() -> list[str]:
    if not HWLOC_FIXTURES.is_dir():
        return []
    return sorted(p.name[: -len(".tar.bz2")] for p in HWLOC_FIXTURES.glob("*.tar.bz2"))


@pytest.fixture(scope="session")
def hwloc_trees(tmp_path_factory) -> dict[str, Path]:
    """name → the unpacked folder holding sys/ (and proc/); skips when ../shared is absent."""
    names = hwloc_fixture_names()
    if not names:
        pytest.skip(f"hwloc sysfs fixtures not found at {HWLOC_FIXTURES}")
    base = tmp_path_factory.mktemp("hwloc")
    trees = {}
    for name in names:
        with tarfile.open(HWLOC_FIXTURES / f"{name}.tar.bz2") as tar:
            tar.extractall(base / name, filter="tar")
        # Each tarball holds one top folder; the tree root is the folder that has sys/.
        roots = [p.parent for p in (base / name).rglob("sys") if p.is_dir()]
        trees[name] = min(roots, key=lambda p: len(p.parts))
    return trees


@pytest.fixture(scope="session")
def lstopo() -> str:
    path = shutil.which("lstopo-no-graphics")
    if path is None:
        pytest.skip("lstopo-no-graphics (Debian hwloc) is not installed")
    return path

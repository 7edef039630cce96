"""Shared test fixtures, among them the hwloc project's sysfs test dumps unpacked once.

Those dumps are hwloc's own test data (open-mpi/hwloc ``tests/hwloc/linux/*.tar.bz2``), not
part of this repository: the tests look for them beside the checkout, in
``../shared/fixtures/hwloc-sysfs/``, and skip when that folder is missing (docs/presets.md).
"""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.tmpfs import fast_tmp

# Examples are checked for what they give, not for how fast: a stall of the shared 2-core test
# machine must not fail a property test by its per-example deadline.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(REPO.parent, "shared")
HWLOC_FIXTURES = SHARED / "fixtures" / "hwloc-sysfs"


def hwloc_fixture_names() -> list[str]:
    if not HWLOC_FIXTURES.is_dir():
        return []
    return sorted(p.name[: -len(".tar.bz2")] for p in HWLOC_FIXTURES.glob("*.tar.bz2"))


@pytest.fixture(scope="session")
def hwloc_trees(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """name → the unpacked folder holding sys/ (and proc/); skips when the dumps are absent."""
    names = hwloc_fixture_names()
    if not names:
        pytest.skip(f"hwloc sysfs fixtures not found at {HWLOC_FIXTURES}")
    with fast_tmp(tmp_path_factory.mktemp("hwloc")) as base:
        trees = {}
        for name in names:
            with tarfile.open(HWLOC_FIXTURES / f"{name}.tar.bz2") as tar:
                tar.extractall(base / name, filter="tar")
            # Each tarball holds one top folder; the tree root is the folder that has sys/.
            roots = [p.parent for p in (base / name).rglob("sys") if p.is_dir()]
            trees[name] = min(roots, key=lambda p: len(p.parts))
        yield trees


@pytest.fixture(scope="session")
def lstopo() -> str:
    path = shutil.which("lstopo-no-graphics")
    if path is None:
        pytest.skip("lstopo-no-graphics (Debian hwloc) is not installed")
    return path


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state folder (checkpoint, ledger) on tmpfs where there is one."""
    with fast_tmp(tmp_path) as base:
        yield base / "state"


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A scratch folder on tmpfs where there is one."""
    with fast_tmp(tmp_path) as base:
        yield base

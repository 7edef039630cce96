"""Scratch folders on tmpfs: tests write tens of thousands of small sysfs files, which cost
seconds on disk and milliseconds in memory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def fast_tmp(fallback: Path) -> Iterator[Path]:
    """A fresh folder under /dev/shm where it is writable, else ``fallback``; removed after."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield fallback
        return
    path = Path(tempfile.mkdtemp(prefix="nri-numa-test-", dir=shm))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

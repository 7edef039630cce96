"""The hook's C client, built once per test session for this interpreter, as
``python -m nri_numa.hook.c_client`` builds it on a node; tests that run it skip, saying why,
only where no C compiler exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nri_numa.hook import c_client


@pytest.fixture(scope="session")
def c_client_binary(tmp_path_factory) -> Path:
    if c_client.find_compiler() is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build nri-numa-hook-client")
    folder = tmp_path_factory.mktemp("c-client")
    return c_client.build(folder / c_client.BINARY_NAME, sys.executable)

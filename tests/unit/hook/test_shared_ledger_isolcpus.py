"""The OCI hook's ledger follows the engine's isolcpus rule: shared containers never get
isolated CPUs, exclusive ones only when the container asks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.shared_ledger import Refused, SharedLedger
from nri_numa.runtime import DeviceLocator
from nri_numa.topology.synthetic import preset_topology
from tests.unit.hook.test_shared_ledger import CONFIG, container

ISOLATED = frozenset({2, 3, 4, 5})  # on node 0 of intel-2s-ht


@pytest.fixture
def book() -> SharedLedger:
    topology = replace(preset_topology("intel-2s-ht"), isolcpus=ISOLATED)
    ctx = EngineContext.build(topology, config_from_mapping(CONFIG))
    return SharedLedger(ctx, DeviceLocator(ctx.topology))


def test_the_shared_pool_leaves_isolated_cpus_out(book):
    shared = book.admit(container("s1"))
    assert not shared.exclusive and not shared.cpus & ISOLATED
    placed = book.admit(container("x1", cpus=4))
    assert placed.exclusive and not placed.cpus & ISOLATED


def test_a_container_that_requires_isolated_cpus_gets_them(book):
    placed = book.admit(container("x1", cpus=4,
                                  annotations={"numa.nri.io/isolated-cpus": "require"}))
    assert placed.exclusive and placed.cpus == ISOLATED
    with pytest.raises(Refused, match="NotEnoughIsolatedCPUs"):
        book.admit(container("x2", cpus=2, annotations={"numa.nri.io/isolated-cpus": "require"}))

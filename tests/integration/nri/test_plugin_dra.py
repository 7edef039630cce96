"""Beside a DRA CPU driver (kubernetes-sigs/dra-driver-cpu, nri_numa.nri.dra_cpu): a container
whose CPUs the driver gave (``DRA_CPUSET_<claim>`` in its environment, injected through CDI) is
left to it, at CreateContainer and at Synchronize, with one line; the others are placed as ever."""

from __future__ import annotations

import logging

from nri_numa.nri.pb import api_pb2 as api
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import create, new_plugin

CLAIMED = "DRA_CPUSET_0f1e2d3c-aaaa-bbbb-cccc-000000000001=4-5"


def test_a_container_with_cpus_from_a_dra_driver_is_left_to_it(caplog):
    plugin = new_plugin()
    sandbox = msg.pod("dra")
    claimed = msg.guaranteed(sandbox, "app", cpus=2, env=["PATH=/bin", CLAIMED])
    with caplog.at_level(logging.INFO, logger="nri_numa.nri.plugin"):
        reply = create(plugin, sandbox, claimed)
    assert reply == api.CreateContainerResponse()  # no cpuset, no memory nodes, no update
    assert not plugin.containers and not plugin.ledger.allocations.exclusive_cpus()
    assert caplog.text.count("left to a DRA CPU driver") == 1
    assert "pod default/dra container app (DRA_CPUSET_0f1e2d3c-aaaa-bbbb-cccc-000000000001=4-5)" \
        in caplog.text
    other = msg.guaranteed(sandbox, "other", cpus=2)
    assert create(plugin, sandbox, other).adjust.linux.resources.cpu.cpus  # placed as ever


def test_synchronize_does_not_adopt_it():
    plugin = new_plugin()
    sandbox = msg.pod("dra")
    claimed = msg.container(sandbox, "app", cpu=2000, cpu_limit=2000, memory=1 << 30,
                            env=[CLAIMED], cpus="4-5", state=api.CONTAINER_RUNNING, pid=10)
    plain = msg.guaranteed(sandbox, "plain", cpus=1, state=api.CONTAINER_RUNNING, pid=11)
    plugin.synchronize(api.SynchronizeRequest(pods=[sandbox], containers=[claimed, plain]))
    assert [c.request.name for c in plugin.containers.values()] == ["plain"]

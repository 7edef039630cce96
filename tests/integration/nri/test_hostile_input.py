"""Messages a runtime should never send, through the plugin's handlers: every one is answered
with an error naming the value, or handled, and the ledger keeps its invariants. Pinned after
the e2e hostile-runtime test: a cpuset such as "0-4294967295" used to be expanded in full (minutes
and gigabytes inside a handler the runtime waits 2 s for)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import PluginError
from nri_numa.runtime.container import MAX_CPUSET_ID, RuntimeInputError, parse_cpuset
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from tests import nri_messages as msg
from tests.integration.nri.odd_requests import odd_event
from tests.integration.nri.plugin_env import machine, new_plugin

HANDLERS = {"CreateContainer": "create_container", "UpdateContainer": "update_container",
            "StopContainer": "stop_container", "StateChange": "state_change",
            "Synchronize": "synchronize"}


def one_cpu(sandbox: api.PodSandbox, name: str, cpuset: str, **more) -> api.Container:
    """A Guaranteed one-CPU container that the runtime reports on ``cpuset``."""
    return msg.container(sandbox, name, cpu=1000, cpu_limit=1000, memory=1 << 30, cpus=cpuset,
                         **more)


@pytest.mark.parametrize("text", ["0-4294967295", "0-65536", "4294967296", "1,99999999",
                                  "0-1:99999999", "9" * 5000])
def test_cpuset_ids_beyond_any_kernel_are_refused_before_expanding(text: str) -> None:
    began = time.monotonic()
    with pytest.raises(RuntimeInputError, match=f"cpus: .* names ids above {MAX_CPUSET_ID}"):
        parse_cpuset(text, "cpus")
    assert time.monotonic() - began < 1.0  # expanding 2**32 ids would take minutes


@pytest.mark.parametrize("text, ids", [("", None), (" ", None), ("0-3,8", {0, 1, 2, 3, 8}),
                                       ("65535", {65535}), ("000001", {1}), ("0-6:3", {0, 3, 6})])
def test_cpuset_lists_within_bounds_are_read(text: str, ids: set[int] | None) -> None:
    assert parse_cpuset(text, "cpus") == (None if ids is None else frozenset(ids))


def test_a_huge_cpuset_fails_the_creation_with_its_name() -> None:
    plugin = new_plugin()
    sandbox = msg.pod("big")
    with pytest.raises(PluginError, match="cannot read container .*: container app: cpus: "
                                          "'0-4294967295' names ids above 65535"):
        plugin.create_container(msg.create(sandbox, one_cpu(sandbox, "app", "0-4294967295")))
    assert plugin.containers == {}


def test_synchronize_skips_a_huge_cpuset_and_adopts_the_rest(caplog) -> None:
    plugin = new_plugin()
    sandbox = msg.pod("s")
    bad = one_cpu(sandbox, "bad", "0-99999999", state=api.CONTAINER_RUNNING, pid=5)
    good = one_cpu(sandbox, "good", "0-7", state=api.CONTAINER_RUNNING, pid=6)
    plugin.synchronize(api.SynchronizeRequest(pods=[sandbox], containers=[bad, good]))
    assert list(plugin.containers) == [good.id]
    assert "container ctr-s-bad skipped: container bad: cpus: '0-99999999' names ids" in caplog.text


@pytest.mark.parametrize("seed", range(4))
def test_odd_messages_get_an_answer_and_the_ledger_stays_whole(seed: int, state_dir: Path) -> None:
    rng = random.Random(seed)
    plugin = new_plugin(state_dir)
    outcomes = {"handled": 0, "refused": 0}
    for step in range(150):
        method, request = odd_event(rng)
        try:
            getattr(plugin, HANDLERS[method])(request)
            outcomes["handled"] += 1
        except PluginError as e:
            assert str(e).startswith("nri-numa: "), e
            outcomes["refused"] += 1
        plugin.ledger.ctx.check(plugin.ledger.allocations)
        exclusive = [c.cpus for c in plugin.containers.values() if c.exclusive]
        assert sum(map(len, exclusive)) == len(frozenset().union(*exclusive)), exclusive
        if step % 50 == 49:  # what was written reads back as the same state
            again = new_plugin(state_dir)
            assert again.containers == plugin.containers
            assert again.ledger.allocations == plugin.ledger.allocations
            plugin = again
    assert outcomes["handled"] > 20 and outcomes["refused"] > 20, outcomes
    assert CheckpointStore(state_dir, machine_fingerprint(machine())).load() is not None

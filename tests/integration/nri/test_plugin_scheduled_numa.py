"""The scheduler extender's NUMA nodes honoured by the node (issue 13 item 3), through the whole
agent (``nri_numa.nri.daemon.run`` pre-launched on a socket pair, real protobuf on the wire):
a pod annotated ``numa.nri.io/scheduled-numa-nodes: "1"`` lands on node 1 while it fits, and on
node 0 with one "stale" line once node 1 is full; a wider annotation widens nothing; a bad one
is one warning and changes nothing."""

from __future__ import annotations

import logging

from nri_numa.engine.annotations import SCHEDULED_NUMA_NODES
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.topology.cpulist import parse_list
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FakeRuntime
from tests.integration.nri.plugin_env import serve_agent

NODE_0_CPUS = {1, 2, 3}  # CPU 0 is reserved
NODE_1_CPUS = {4, 5, 6, 7}


def _create(runtime: FakeRuntime, pod: str, cpus: int, chosen: str | None
            ) -> api.CreateContainerResponse:
    sandbox = msg.pod(pod, annotations={} if chosen is None else {SCHEDULED_NUMA_NODES: chosen})
    return runtime.call("CreateContainer", msg.create(sandbox, msg.guaranteed(sandbox, "work",
                                                                              cpus=cpus)),
                        api.CreateContainerResponse)


def _cpus(reply: api.CreateContainerResponse) -> frozenset[int]:
    return parse_list(reply.adjust.linux.resources.cpu.cpus)


def _lines(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_the_chosen_node_while_it_fits_then_a_stale_line(scratch, caplog):
    caplog.set_level(logging.INFO)
    [plain, first, second, late] = serve_agent(scratch, lambda rt: [
        _create(rt, "plain", 1, None),  # alone, the first node that fits: node 0
        _create(rt, "first", 2, "1"),
        _create(rt, "second", 2, "1"),  # node 1 is full after this one
        _create(rt, "late", 2, "1")], pod_resources_socket="")
    assert _cpus(plain) <= NODE_0_CPUS
    assert _cpus(first) <= NODE_1_CPUS and _cpus(second) <= NODE_1_CPUS
    assert len(_cpus(first) | _cpus(second)) == 4
    assert _cpus(late) <= NODE_0_CPUS and len(_cpus(late)) == 2  # decided anew, still aligned
    [stale] = _lines(caplog, "is stale")
    assert stale.startswith("pod default/late container work: the scheduler's choice of NUMA "
                            f"node 1 ({SCHEDULED_NUMA_NODES}) is stale, decided anew: ")
    assert "free node 0: 2 CPUs, node 1: 0 CPUs" in stale  # why: what node 1 had left


def test_a_wider_annotation_widens_nothing_and_a_bad_one_is_a_warning(scratch, caplog):
    caplog.set_level(logging.INFO)
    [wide, bad, unknown] = serve_agent(scratch, lambda rt: [
        _create(rt, "wide", 1, "0-1"),
        _create(rt, "bad", 1, "1,,x"),
        _create(rt, "unknown", 1, "5")], pod_resources_socket="")
    assert len(_cpus(wide)) == 1  # one CPU on one node under single-numa-node, as without it
    for reply in (bad, unknown):  # placed as without the annotation: the first node that fits
        assert len(_cpus(reply)) == 1 and _cpus(reply) <= NODE_0_CPUS
    assert not _lines(caplog, "is stale")
    [bad_line] = _lines(caplog, "pod default/bad container work: annotation")
    assert bad_line.endswith("; ignored, the node decides alone")
    assert f"annotation {SCHEDULED_NUMA_NODES}: empty element" in bad_line
    [unknown_line] = _lines(caplog, "pod default/unknown container work: annotation")
    assert "NUMA node 5 of '5' is not on this machine" in unknown_line


def test_a_stale_choice_is_counted():
    from tests.integration.nri.plugin_env import create
    from tests.integration.nri.test_plugin_metrics import plugin_with_metrics, value

    plugin, metrics = plugin_with_metrics()
    for name in ("a", "b", "c"):  # 2 + 2 CPUs fill node 1; the third is stale
        sandbox = msg.pod(name, annotations={SCHEDULED_NUMA_NODES: "1"})
        create(plugin, sandbox, msg.guaranteed(sandbox, "work", cpus=2))
    assert value(metrics, "scheduled_numa_nodes_stale_total") == 1

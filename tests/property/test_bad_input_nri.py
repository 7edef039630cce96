"""NRI messages with any values in their fields, through the plugin's handlers as the session
serves them (``nri_numa.nri.session._typed``: the bytes a runtime sends in, the status it gets
back): every CreateContainer is answered, placed or refused with one line of at most 500
characters; the ledger keeps its invariants; the checkpoint stays readable by ``nri-numa
state``; nothing is written outside the state folder. Protobuf strings are UTF-8, so lone
surrogates cannot travel here (they come in through the hook)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import _typed
from nri_numa.nri.wire.ttrpc_message import TtrpcError
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import new_plugin
from tests.property.bad_input import TEXT, check_line, cli, examples, files_under

UTF8 = TEXT.map(lambda t: t.encode("utf-8", "replace").decode("utf-8"))
INT64 = st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1), st.sampled_from([0, -1, 1, 2 ** 63 - 1]))
UINT64 = st.one_of(st.integers(0, 2 ** 64 - 1), st.sampled_from([0, 1, 1024, 2 ** 64 - 1]))
CPUSETS = st.one_of(UTF8, st.sampled_from(["0-4294967295", "0-65535," * 5000, "0-3", "9" * 5000,
                                           "1_0", "١", "0-7:2", "0-65535,0-65535"]))
ANNOTATION_KEYS = st.sampled_from(["numa.nri.io/topology-policy", "numa.nri.io/topology-scope",
                                   "numa.nri.io/devices", "numa.nri.io/devices.c",
                                   "numa.nri.io/scheduled-numa-nodes", "numa.nri.io/x",
                                   "other"])
# Values a scheduled-numa-nodes annotation might hold, good and bad, beside any text.
NUMA_LISTS = st.sampled_from(["1", "0-1", "0,1", "5", "", "0-65535", "1,,x", "9" * 5000, "١"])
ANNOTATIONS = st.dictionaries(st.one_of(ANNOTATION_KEYS, UTF8), st.one_of(UTF8, NUMA_LISTS),
                              max_size=3)


def set_id(c: api.Container, v: str) -> None:
    c.id = v or "x"


CHANGES = st.one_of(
    st.tuples(st.just(set_id), UTF8),
    st.tuples(st.just(lambda c, v: setattr(c, "name", v)), UTF8),
    st.tuples(st.just(lambda c, v: setattr(c.linux.resources.cpu, "cpus", v)), CPUSETS),
    st.tuples(st.just(lambda c, v: setattr(c.linux.resources.cpu, "mems", v)), CPUSETS),
    st.tuples(st.just(lambda c, v: setattr(c.linux.resources.cpu.quota, "value", v)), INT64),
    st.tuples(st.just(lambda c, v: setattr(c.linux.resources.cpu.shares, "value", v)), UINT64),
    st.tuples(st.just(lambda c, v: setattr(c.linux.resources.cpu.period, "value", v)), UINT64),
    st.tuples(st.just(lambda c, v: setattr(c.linux.resources.memory.limit, "value", v)), INT64),
    st.tuples(st.just(lambda c, v: c.linux.resources.hugepage_limits.add(
        page_size=v[0], limit=v[1])), st.tuples(UTF8, UINT64)),
    st.tuples(st.just(lambda c, v: c.linux.devices.add(path=v[0], type=v[1], major=v[2],
                                                       minor=v[2])),
              st.tuples(UTF8, st.sampled_from(["c", "b", "x", ""]), INT64)),
    st.tuples(st.just(lambda c, v: c.annotations.update(v)), ANNOTATIONS),
    st.tuples(st.just(lambda c, v: c.env.append(v)), UTF8),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nri")


# The sandbox's linux.pod_resources (the whole pod's CPU and memory, nri_numa.nri.whole_pod).
SANDBOX_CHANGES = st.one_of(
    st.tuples(st.just(lambda r, v: setattr(r.cpu.quota, "value", v)), INT64),
    st.tuples(st.just(lambda r, v: setattr(r.cpu.shares, "value", v)), UINT64),
    st.tuples(st.just(lambda r, v: setattr(r.cpu.period, "value", v)), UINT64),
    st.tuples(st.just(lambda r, v: setattr(r.memory.limit, "value", v)), INT64),
)


@settings(max_examples=examples(50))
@given(st.lists(CHANGES, max_size=3), ANNOTATIONS, st.integers(0, 3),
       st.lists(SANDBOX_CHANGES, max_size=4), st.sampled_from(["container", "pod"]), st.data())
def test_any_container_is_placed_or_refused_in_one_line(folder, changes, pod_annotations,
                                                        cpus, sandbox_changes, scope, data):
    state = folder / f"state-{data.draw(st.integers(0, 10 ** 9))}"
    plugin = new_plugin(state, topologyManagerScope=scope)
    sandbox = msg.pod("p", annotations=pod_annotations)
    for change, value in sandbox_changes:
        change(sandbox.linux.pod_resources, value)
    container = msg.guaranteed(sandbox, "c", cpus) if cpus else msg.container(sandbox, "c")
    for change, value in changes:
        change(container, value)
    handler = _typed("CreateContainer", api.CreateContainerRequest,
                     api.CreateContainerResponse, plugin.create_container)
    before = files_under(folder, skip=[state])
    try:
        handler(api.CreateContainerRequest(pod=sandbox, container=container).SerializeToString())
        event("placed")
    except TtrpcError as e:
        event("refused")
        check_line(e.message)
    plugin.ledger.ctx.check(plugin.ledger.allocations)
    assert files_under(folder, skip=[state]) == before
    if (state / "checkpoint.json").exists():
        code, _, err = cli(["state", "--state-dir", str(state)])
        assert code == 0 and err == "", err

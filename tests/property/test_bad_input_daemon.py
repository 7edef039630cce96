"""Requests to the hook daemon (``nri_numa.hook.daemon.answer``): any line a peer on its socket
may send is answered with an exit status and one bounded line, never an exception that would
stop the daemon. The requests' paths stay inside the test's folder: a hook run that decodes
writes its log and cgroups where its options say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.daemon import DaemonOptions, answer
from nri_numa.hook.machine import Machine
from nri_numa.state.checkpoint import machine_fingerprint
from nri_numa.topology.synthetic import preset_topology
from tests.property.bad_input import NESTED, TEXT, VALUE, check_line, examples, files_under

TOPOLOGY = preset_topology("intel-2s-ht")
MACHINE = Machine(TOPOLOGY, EngineContext.build(TOPOLOGY, config_from_mapping({})),
                  machine_fingerprint(TOPOLOGY))
NOT_A_PATH = NESTED.filter(lambda v: not isinstance(v, str))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("daemon")
    for name in ("cgroup", "proc", "state"):
        (folder / name).mkdir()
    return folder


def check_answer(folder: Path, line: bytes) -> None:
    before = files_under(folder, skip=[folder / "state"])
    reply = answer(line, DaemonOptions(state_dir=folder / "state"), lambda hook: MACHINE)
    assert set(reply) == {"exit", "stdout", "stderr"} and reply["exit"] in (0, 1), reply
    json.dumps(reply)  # what the daemon sends back
    if reply["exit"]:
        assert reply["stderr"].endswith("\n"), reply
        check_line(reply["stderr"][:-1], "nri-numa hook")
    assert files_under(folder, skip=[folder / "state"]) == before


@st.composite
def requests(draw, folder: Path) -> dict:
    options = {"cgroup_root": str(folder / "cgroup"), "proc_root": str(folder / "proc"),
               "log_file": str(folder / "state" / "hook.log")}
    for key in draw(st.sets(st.sampled_from(["timeout", "started", "config", "topology",
                                             "cgroup_root", "proc_root", "log_file", "x"]))):
        # Paths from a request are used as they are: only values that are no path, or
        # paths inside the test's folder, are sent.
        if key in ("cgroup_root", "proc_root", "log_file"):
            options[key] = draw(st.one_of(NOT_A_PATH, st.just(str(folder / "state" / key))))
        else:
            options[key] = draw(VALUE)
    request = {"stage": draw(st.one_of(st.sampled_from(["createRuntime", "poststop",
                                                        "precreate", "prestart"]), TEXT)),
               "stdin": draw(st.one_of(TEXT, VALUE.map(json.dumps))),
               "options": options}
    for key in draw(st.sets(st.sampled_from(["stage", "stdin", "options"]), max_size=1)):
        request[key] = draw(VALUE)
    return request


@settings(max_examples=examples(60))
@given(st.data())
def test_any_request_is_answered_in_one_line(folder, data):
    request = data.draw(requests(folder))
    check_answer(folder, json.dumps(request).encode())


@settings(max_examples=examples(60))
@given(st.one_of(st.binary(max_size=300), VALUE.map(lambda v: json.dumps(v).encode()),
                 st.integers(60, 100_000).map(lambda n: b"[" * n),
                 st.integers(41, 5000).map(lambda n: b'{"stage": ' + b"9" * n + b"}"),
                 st.just(b'{"stage": "poststop", "stdin": "\\ud800", "options": {}}')))
def test_any_line_is_answered_in_one_line(folder, line):
    check_answer(folder, line)

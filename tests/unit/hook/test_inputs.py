"""What a hook reads before deciding: the OCI state, the bundle's spec, its own annotations,
cgroup paths from /proc, and process identities."""

from __future__ import annotations

import io
import json
import os

import pytest

from nri_numa.hook.annotations import engine_annotations
from nri_numa.hook.cgroup import CgroupError, checked_path
from nri_numa.hook.oci import (MAX_INPUT_BYTES, HookInputError, parse_state, read_input,
                               read_spec)
from nri_numa.hook.procs import ProcessId, is_running, process_id


def test_runc_create_runtime_state():
    raw = json.dumps({"ociVersion": "1.0.2-dev", "id": "t1", "status": "creating", "pid": 7867,
                      "bundle": "/b/t1", "annotations": {"numa.nri.io/hook": "true"}})
    state = parse_state(raw.encode())
    assert (state.id, state.status, state.pid, state.bundle) == ("t1", "creating", 7867, "/b/t1")
    assert state.annotations == {"numa.nri.io/hook": "true"}


@pytest.mark.parametrize("extra", [{}, {"pid": 0}])  # runc omits the pid at poststop, crun sends 0
def test_poststop_state_has_no_pid(extra):
    state = parse_state(json.dumps({"id": "t1", "status": "stopped", "bundle": "/b", **extra}))
    assert state.pid is None and state.annotations == {}


@pytest.mark.parametrize("raw, named", [
    (b"", "empty"),
    (b"{", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"pid": 1}', "id must be"),
    (b'{"id": "a\\nb"}', "id must be"),
    (b'{"id": "x", "pid": -1}', "pid must be"),
    (b'{"id": "x", "pid": "7"}', "pid must be"),
    (b'{"id": "x", "annotations": {"a": 1}}', "annotations"),
    (b'{"id": "x", "bundle": 5}', "bundle must be"),
    (b"\xff\xfe", "not JSON"),
])
def test_bad_states_are_refused_with_the_field(raw, named):
    with pytest.raises(HookInputError, match=named):
        parse_state(raw)


def test_read_spec_from_the_bundle(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2"}))
    assert read_spec(str(tmp_path)) == {"ociVersion": "1.0.2"}
    with pytest.raises(HookInputError, match="cannot read the spec"):
        read_spec(str(tmp_path / "missing"))
    with pytest.raises(HookInputError, match="absolute path"):
        read_spec("relative/bundle")
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(HookInputError, match="JSON object"):
        read_spec(str(tmp_path))


def test_stdin_size_is_bounded():
    assert read_input(io.BytesIO(b"{}")) == b"{}"
    with pytest.raises(HookInputError, match="more than"):
        read_input(io.BytesIO(b" " * (MAX_INPUT_BYTES + 1)))


# --- the hook's annotations --------------------------------------------------------------------


def test_the_engine_sees_only_the_overrides():
    annotations = {"numa.nri.io/hook": "true", "numa.nri.io/devices": "x=1",
                   "numa.nri.io/topology-policy": "restricted", "io.container.manager": "libpod"}
    assert engine_annotations(annotations) == {"numa.nri.io/topology-policy": "restricted"}


# --- cgroup paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, clean", [
    ("/libpod_parent/libpod-abc", "/libpod_parent/libpod-abc"),
    ("/system.slice/ohl-sd1.scope", "/system.slice/ohl-sd1.scope"),
    ("//a///b/", "/a/b"),
])
def test_plain_cgroup_paths_pass(raw, clean):
    assert checked_path(raw) == clean


@pytest.mark.parametrize("raw, why", [
    ("/a/../b", r"'\.' or '\.\.'"),
    ("/..", r"'\.' or '\.\.'"),
    ("/a/./b", r"'\.' or '\.\.'"),
    ("relative/path", "not an absolute path"),
    ("/a\x00b", "not an absolute path"),
    ("/a\nb", "not an absolute path"),
    ("/", "root cgroup"),
    ("", "not an absolute path"),
])
def test_unsafe_cgroup_paths_are_refused(raw, why):
    with pytest.raises(CgroupError, match=why):
        checked_path(raw)


# --- process identity --------------------------------------------------------------------------


def test_this_process_has_a_start_time(tmp_path):
    from pathlib import Path

    me = process_id(Path("/proc"), os.getpid())
    assert me is not None and me.pid == os.getpid() and me.start > 0
    assert is_running(Path("/proc"), me)
    assert not is_running(Path("/proc"), ProcessId(me.pid, me.start + 1))  # a reused pid


def test_a_command_name_with_parentheses_does_not_confuse_the_parser(tmp_path):
    fields = ["S"] + ["0"] * 18 + ["4242"] + ["0"] * 30  # field 22 (start time) is 4242
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text("77 (we ird) ) name) " + " ".join(fields) + "\n")
    assert process_id(tmp_path, 77) == ProcessId(77, 4242)
    assert process_id(tmp_path, 78) is None
    (tmp_path / "77" / "stat").write_text("77 (short) S 1\n")
    assert process_id(tmp_path, 77) is None

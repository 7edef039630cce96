"""What the hook daemon keeps between runs (nri_numa.hook.daemon_cache), on a fake host in
process: the ledger is read again exactly when the checkpoint changed under it, cgroup files
already holding their value are not written, and cgroups are found again once they move or
their container goes."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.cgroup import locate, write_cpuset
from nri_numa.hook.machine import Machine
from nri_numa.hook.daemon_cache import DaemonCache
from nri_numa.hook.oci import parse_state
from nri_numa.hook.stages import HookEnv, HookError, create_runtime, precreate
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.cpulist import format_list
from tests.integration.hook.fake_host import FakeHost, oci_state
from tests.integration.hook.test_stages_fake import (CONFIG, PODMAN_ID, TOPOLOGY, create,
                                                     podman_spec, stop)

OLD_NS = 1_000_000_000_000_000_000  # 2001: a file's mtime that only a write changes


@pytest.fixture
def host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path / "host", 1, TOPOLOGY.online_cpus)


def envs(tmp_path, host: FakeHost) -> tuple[HookEnv, HookEnv]:
    """(the daemon's, a hook process's) on one state folder."""
    ctx = EngineContext.build(TOPOLOGY, config_from_mapping(CONFIG))
    fingerprint = machine_fingerprint(TOPOLOGY)
    machine = Machine(TOPOLOGY, ctx, fingerprint)
    store = CheckpointStore(tmp_path / "state", fingerprint)
    return (HookEnv(machine, store, host.fs, 2.0, cache=DaemonCache()),
            HookEnv(machine, CheckpointStore(tmp_path / "state", fingerprint), host.fs, 2.0))


def test_the_ledger_is_read_again_only_when_the_checkpoint_changed(tmp_path, host):
    daemon, process = envs(tmp_path, host)
    create(daemon, host, "a", 1001, cpus=4)
    create(daemon, host, "b", 1002, cpus=4)
    assert daemon.cache.ledger.loads == 1  # the first run only
    create(process, host, "c", 1003, cpus=4)  # a hook that ran in process meanwhile
    create(daemon, host, "d", 1004, cpus=4)
    assert daemon.cache.ledger.loads == 2
    held = [host.cpus(f"/pods/{cid}") for cid in "abcd"]
    assert len(frozenset().union(*held)) == 16  # d did not get c's CPUs
    assert set(daemon.store.load()["processes"]) == set("abcd")


def test_a_checkpoint_removed_under_the_daemon_starts_it_afresh(tmp_path, host):
    daemon, _ = envs(tmp_path, host)
    create(daemon, host, "a", 1001, cpus=4)
    daemon.store.path.unlink()
    create(daemon, host, "b", 1002, cpus=4)
    assert set(daemon.store.load()["processes"]) == {"b"}  # as a hook process would find it
    assert host.cpus("/pods/b") == host.cpus("/pods/a")


def test_a_run_that_fails_keeps_nothing(tmp_path, host):
    daemon, _ = envs(tmp_path, host)
    create(daemon, host, "a", 1001, cpus=46)
    create(daemon, host, "b", 1002, cpus=46)
    with pytest.raises(HookError, match="TopologyAffinityError"):
        create(daemon, host, "c", 1003, cpus=46)
    create(daemon, host, "s", 1004)
    assert daemon.cache.ledger.loads == 2  # read again after the refusal
    assert set(daemon.store.load()["processes"]) == {"a", "b", "s"}


def test_a_value_already_in_place_is_not_written(host):
    host.start(1001, "/pods/a")
    cgroup = locate(host.fs, 1001)
    files = [host.dir("/pods/a") / name for name in ("cpuset.cpus", "cpuset.mems")]
    for path in files:
        os.utime(path, ns=(OLD_NS, OLD_NS))
    assert write_cpuset(cgroup, host.cpus("/pods/a"), host.mems("/pods/a")) == 0
    assert [p.stat().st_mtime_ns for p in files] == [OLD_NS, OLD_NS]
    assert write_cpuset(cgroup, frozenset({2, 3}), host.mems("/pods/a")) == 1
    assert host.cpus("/pods/a") == {2, 3}
    assert files[0].stat().st_mtime_ns != OLD_NS and files[1].stat().st_mtime_ns == OLD_NS


@pytest.mark.parametrize("daemon_run", [True, False], ids=["daemon", "process"])
def test_a_shared_container_already_on_the_pool_is_not_rewritten(tmp_path, host, daemon_run):
    daemon, process = envs(tmp_path, host)
    env = daemon if daemon_run else process
    create(env, host, "x", 1001, cpus=4)
    create(env, host, "s", 1002)
    pool = host.cpus("/pods/s")
    # s's cgroup already has the pool x's release will give it (a person, or a run that
    # failed after writing it): the release must not write it again.
    grown = pool | host.cpus("/pods/x")
    (host.dir("/pods/s") / "cpuset.cpus").write_text(format_list(grown) + "\n")  # as the kernel
    os.utime(host.dir("/pods/s") / "cpuset.cpus", ns=(OLD_NS, OLD_NS))
    stop(env, host, "x", 1001)
    assert host.cpus("/pods/s") == grown
    assert (host.dir("/pods/s") / "cpuset.cpus").stat().st_mtime_ns == OLD_NS


def test_running_twice_writes_nothing_the_second_time(tmp_path, host):
    daemon, _ = envs(tmp_path, host)
    create(daemon, host, "x", 1001, cpus=2)
    files = [host.dir("/pods/x") / name for name in ("cpuset.cpus", "cpuset.mems")]
    for path in files:
        os.utime(path, ns=(OLD_NS, OLD_NS))
    spec = json.loads((host.base / "bundles" / "x" / "config.json").read_text())
    done = create_runtime(daemon, parse_state(oci_state("x", 1001, host.base / "bundles" / "x")),
                          spec)
    assert done.startswith("kept container x")
    assert [p.stat().st_mtime_ns for p in files] == [OLD_NS, OLD_NS]


def test_cgroups_are_forgotten_with_their_container_and_found_again_when_moved(tmp_path, host):
    daemon, _ = envs(tmp_path, host)
    create(daemon, host, "s1", 1001)
    create(daemon, host, "s2", 1002)
    assert len(daemon.cache.cgroups) == 2
    stop(daemon, host, "s2", 1002)
    assert len(daemon.cache.cgroups) == 1
    # s1's process now lives in another cgroup, and the old one is gone.
    host.start(1001, "/pods/s1-moved")
    shutil.rmtree(host.dir("/pods/s1"))
    create(daemon, host, "x", 1003, cpus=4)
    assert host.cpus("/pods/s1-moved") == TOPOLOGY.online_cpus - host.cpus("/pods/x")
    assert len(daemon.cache.cgroups) == 2  # s1's new cgroup, and x's


def test_the_daemons_checkpoint_is_byte_for_byte_a_hook_processs(tmp_path):
    """The daemon saves from its kept encoders (nri_numa.state.encoding), a hook process from
    plain dicts: every save must be the same file."""
    hosts = [FakeHost(tmp_path / name / "host", 1, TOPOLOGY.online_cpus)
             for name in ("daemon", "process")]
    daemon = replace(envs(tmp_path / "daemon", hosts[0])[0], clock=lambda: 1_700_000_000.0)
    process = replace(envs(tmp_path / "process", hosts[1])[1], clock=lambda: 1_700_000_000.0)
    steps = [("create", "s1", 1001, 0), ("create", "x1", 1002, 4), ("create", "s2", 1003, 0),
             ("create", "x2", 1004, 2), ("stop", "x1", 1002, 0), ("die", "s1", 1001, 0),
             ("create", "x3", 1005, 46), ("stop", "s2", 1003, 0), ("create", "s3", 1006, 0),
             ("precreate", PODMAN_ID, 1007, 0), ("create", "x4", 1008, 2),
             ("claim", PODMAN_ID, 1007, 0)]
    for what, cid, pid, cpus in steps:
        files = []
        for env, host in ((daemon, hosts[0]), (process, hosts[1])):
            if what == "create":
                create(env, host, cid, pid, cpus=cpus)
            elif what == "stop":
                stop(env, host, cid, pid)
            elif what == "precreate":  # podman: placed from the spec, no process yet
                precreate(env, podman_spec(cpus))
            elif what == "claim":
                host.start(pid, f"/libpod_parent/libpod-{cid}")
                create_runtime(env, parse_state(oci_state(cid, pid, host.base)), podman_spec(0))
            else:  # exits without a poststop: the next run drops it
                host.stop(pid)
            files.append(env.store.path.read_bytes())
        assert files[0] == files[1], (what, cid)
    assert set(daemon.store.load()["processes"]) == {"x2", "x3", "s3", "x4", PODMAN_ID}

"""The cgroup writer on fake cgroupfs trees (v1 and v2): finding a container's cgroup through its
process, writing and reading back, and every path it must refuse to touch."""

from __future__ import annotations

import os

import pytest

from nri_numa.hook.cgroup import CgroupError, ProcessGone, locate, write_cpuset
from nri_numa.topology.cpulist import parse_list
from tests.integration.hook.fake_host import FakeHost

ONLINE = frozenset(range(8))


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def host(request, tmp_path) -> FakeHost:
    return FakeHost(tmp_path, request.param, ONLINE)


@pytest.mark.parametrize("cgroup", [
    "/ohl/t1",  # runc with a cgroupfs path
    "/libpod_parent/libpod-5aa3cb4ef5e5",  # podman
    "/system.slice/ohl-sd1.scope",  # the systemd driver's slice:prefix:name
    "/kubepods/burstable/pod1/abc",
])
def test_the_cgroup_comes_from_the_process(host, cgroup):
    host.start(4242, cgroup)
    found = locate(host.fs, 4242)
    assert (found.version, found.path, found.dir) == (host.version, cgroup, host.dir(cgroup))


def test_write_then_read_back(host):
    host.start(4242, "/pods/a")
    cgroup = locate(host.fs, 4242)
    write_cpuset(cgroup, frozenset({2, 3}), frozenset({0}))
    effective_cpus, effective_mems = (parse_list((cgroup.dir / name).read_text())
                                      for name in cgroup.effective_names)
    assert host.cpus("/pods/a") == effective_cpus == frozenset({2, 3})
    assert host.mems("/pods/a") == effective_mems == frozenset({0})
    # Without mems only the CPUs change.
    write_cpuset(cgroup, frozenset({5}), None)
    assert host.cpus("/pods/a") == frozenset({5}) and host.mems("/pods/a") == frozenset({0})


def test_a_narrowed_effective_set_is_a_failure(host):
    # cgroup v2 accepts CPUs the parent lacks and only narrows the effective set.
    host.start(4242, "/pods/a")
    effective = host.dir("/pods/a") / ("cpuset.effective_cpus" if host.version == 1
                                        else "cpuset.cpus.effective")
    effective.unlink()
    effective.write_text("0-1\n")
    with pytest.raises(CgroupError, match="wrote 6 but its effective CPUs are 0-1"):
        write_cpuset(locate(host.fs, 4242), frozenset({6}), None)


def test_a_symlinked_file_is_not_written_through(host, tmp_path):
    host.start(4242, "/pods/a")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    target = host.dir("/pods/a") / "cpuset.cpus"
    target.unlink()
    target.symlink_to(elsewhere)
    with pytest.raises(CgroupError, match="symlink"):
        write_cpuset(locate(host.fs, 4242), frozenset({1}), None)
    assert elsewhere.read_text() == "untouched"


def test_a_cgroup_folder_that_escapes_the_hierarchy_is_refused(host, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpuset.cpus").write_text("0-7\n")
    host.dir("/pods").mkdir(parents=True)
    host.dir("/pods/a").symlink_to(outside)
    host.start(4242, "/pods/a")
    with pytest.raises(CgroupError, match="outside"):
        locate(host.fs, 4242)
    assert (outside / "cpuset.cpus").read_text() == "0-7\n"


@pytest.mark.parametrize("line_path, why", [
    ("/pods/../../etc", r"'\.\.'"),
    ("/", "root cgroup"),
    ("pods/a", "not an absolute path"),
])
def test_unsafe_paths_in_proc_are_refused(host, line_path, why):
    (host.proc / "4242").mkdir()
    prefix = "3:cpuset:" if host.version == 1 else "0::"
    (host.proc / "4242" / "cgroup").write_text(prefix + line_path + "\n")
    with pytest.raises(CgroupError, match=why):
        locate(host.fs, 4242)


@pytest.mark.parametrize("own", ["/runtime.slice/engine", "/runtime.slice/engine/sub"])
def test_the_hooks_own_cgroup_and_its_ancestors_are_foreign(host, own):
    host.set_own_cgroup(own)
    host.start(4242, "/runtime.slice/engine")  # e.g. a state.pid that is the runtime itself
    with pytest.raises(CgroupError, match="hook's own cgroup or one of its ancestors"):
        locate(host.fs, 4242)
    host.start(4343, "/runtime.slice/engine-sibling")
    assert locate(host.fs, 4343).path == "/runtime.slice/engine-sibling"


@pytest.mark.parametrize("pid", [0, 1])
def test_pid_one_and_zero_are_never_containers(host, pid):
    with pytest.raises(CgroupError, match="not a container's process"):
        locate(host.fs, pid)


def test_a_process_that_is_gone(host):
    with pytest.raises(ProcessGone, match="4242 is gone"):
        locate(host.fs, 4242)


def test_a_cgroup_without_the_cpuset_controller(host):
    host.start(4242, "/pods/a")
    for name in os.listdir(host.dir("/pods/a")):
        os.unlink(host.dir("/pods/a") / name)
    with pytest.raises(CgroupError, match="cpuset controller is not enabled"):
        locate(host.fs, 4242)


def test_a_missing_cgroup_folder(host):
    host.start(4242, "/pods/a")
    for name in os.listdir(host.dir("/pods/a")):
        os.unlink(host.dir("/pods/a") / name)
    host.dir("/pods/a").rmdir()
    with pytest.raises(CgroupError, match="does not exist"):
        locate(host.fs, 4242)


def test_no_cpuset_anywhere(tmp_path):
    host = FakeHost(tmp_path, 1, ONLINE)
    (host.proc / "4242").mkdir()
    (host.proc / "4242" / "cgroup").write_text("4:memory:/a\n0::/a\n")  # hybrid, no cpuset line
    with pytest.raises(CgroupError, match="in no cpuset cgroup"):
        locate(host.fs, 4242)


def test_an_empty_cpu_set_is_never_written(host):
    host.start(4242, "/pods/a")
    with pytest.raises(CgroupError, match="empty CPU set"):
        write_cpuset(locate(host.fs, 4242), frozenset(), None)
    assert host.cpus("/pods/a") == ONLINE

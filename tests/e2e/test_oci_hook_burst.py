"""A burst of container starts through real runc, with nri-numa's hooks exactly as
hooks/runc-config.example.json ships them (their timeouts and options; only the paths point at
this lab): 50 containers created and started at once, then deleted at once.

No hook is killed at the runtime's timeout: each container is placed, or refused with
nri-numa's reason. No exclusive CPU is given twice (the cgroups and the ledger agree), and once
all are deleted the ledger is empty (poststop ran). The shipped hooks start the hook daemon on
demand (--start-daemon), so the burst also starts it; a second burst runs the same hooks
without that flag: every hook in its own process, where most of them give up at their deadline,
each with the line saying so. Root, runc and busybox-static needed, as for
tests/e2e/test_oci_hooks.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_numa.topology.cpulist import format_list, parse_list
from tests.e2e.harness import hook_burst as hb
from tests.e2e.harness.cgroups import parse_status_allowed, process_cgroup, read_cpuset
from tests.e2e.harness.runtimes import RUNC, RuntimesUnavailable, find_busybox

pytestmark = pytest.mark.e2e

CONTAINERS = 50
EXCLUSIVE = 5  # one exclusive CPU each; the rest BestEffort, on the shared pool
REFUSED = "nri-numa hook createRuntime: "


@pytest.fixture
def lab() -> Iterator[hb.BurstLab]:
    if os.geteuid() != 0:
        pytest.skip("the OCI hook burst test needs root: it runs runc and writes cgroups")
    if not os.access(RUNC, os.X_OK):
        pytest.skip(f"{RUNC} is missing (Debian package runc; scripts/e2e-deps installs it)")
    try:
        busybox = find_busybox()
    except RuntimesUnavailable as e:
        pytest.skip(str(e))
    hook = Path(sys.executable).with_name("nri-numa")
    if not os.access(hook, os.X_OK):
        pytest.skip(f"{hook} is missing: install the package (scripts/setup)")
    lab = hb.make_lab(hook, busybox)
    if len(lab.topology.online_cpus) < 2:
        hb.cleanup(lab)
        pytest.skip("the burst test needs two CPUs: one reserved, one to pin")
    try:
        yield lab
    finally:
        hb.cleanup(lab)


def burst(lab: hb.BurstLab, hooks: dict) -> tuple[dict[str, hb.Outcome], dict[str, hb.Outcome],
                                                 dict]:
    """Create all at once, check what each got, delete all at once."""
    names = [f"ex{i}" for i in range(EXCLUSIVE)] + \
        [f"sh{i}" for i in range(CONTAINERS - EXCLUSIVE)]
    for name in names:
        hb.write_bundle(lab, name, 1 if name.startswith("ex") else 0, hooks)
    try:
        created = hb.at_once(lab, names, ["run", "--detach"])
        held = check_placements(lab, {n for n, o in created.items() if o.returncode == 0})
    finally:
        deleted = hb.at_once(lab, names, ["delete", "--force"])
    return created, deleted, held


def check_placements(lab: hb.BurstLab, started: set[str]) -> dict:
    """Every started container's cgroup as the ledger says; no exclusive CPU twice."""
    payload = lab.ledger()
    records = {r["id"]: r for r in payload["records"]["containers"]}
    assert set(records) == started
    pool = parse_list(payload["ledger"]["allocations"]["shared"]) if started else frozenset()
    held: set[int] = set()
    for name in started:
        pid = hb.runc_pid(lab, name)
        cgroup = process_cgroup(pid, lab.layout)
        on_disk = read_cpuset(lab.layout, cgroup)
        assert parse_status_allowed(Path(f"/proc/{pid}/status").read_text()).cpu_ids == \
            on_disk.cpu_ids
        if records[name]["exclusive"]:
            cpus = parse_list(records[name]["cpus"])
            assert on_disk.cpu_ids == on_disk.effective_cpu_ids == cpus and len(cpus) == 1
            assert not cpus & held, f"{name} got CPU {format_list(cpus)} twice"
            held |= cpus
        else:
            assert on_disk.cpu_ids == pool, name
    assert not held & pool
    return records


def assert_none_killed(outcomes: dict[str, hb.Outcome], stage: str) -> None:
    killed = {n: o.stderr for n, o in outcomes.items() if hb.KILLED in o.stderr}
    assert not killed, f"{len(killed)} {stage} hooks killed at the runtime's timeout: {killed}"


def report(lab: hb.BurstLab, what: str, created: dict[str, hb.Outcome]) -> str:
    runs = hb.hook_runs(lab.log.read_text())
    lines = [f"{what}: {sum(o.returncode == 0 for o in created.values())} of {len(created)} "
             f"started; slowest runc run {max(o.seconds for o in created.values()):.1f} s"]
    for stage in ("createRuntime", "poststop"):
        p50, p99, top = hb.percentiles([r.ms for r in runs if r.stage == stage])
        lines.append(f"  {stage}: p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {top:.0f} ms")
    return "\n".join(lines)


def test_a_burst_with_the_shipped_hooks_places_every_container_or_refuses_it(lab, capsys):
    runtime_timeout, own_timeout = hb.hook_timeouts()
    assert own_timeout < runtime_timeout
    hooks = hb.documented_hooks(lab)
    assert "--start-daemon" in hooks["createRuntime"][0]["args"]
    created, deleted, held = burst(lab, hooks)
    with capsys.disabled():
        print("\n" + report(lab, "burst with the shipped hooks", created))
    assert_none_killed(created, "createRuntime")
    assert_none_killed(deleted, "poststop")
    refused = {n: o.stderr for n, o in created.items() if o.returncode != 0}
    for name, err in refused.items():
        assert REFUSED in err, f"{name} failed without nri-numa's reason: {err}"
    # Every BestEffort container fits on the shared pool: none may be lost to the burst.
    assert not {n for n in refused if n.startswith("sh")}, refused
    assert sum(r["exclusive"] for r in held.values()) == min(EXCLUSIVE, len(lab.topology.online_cpus) - 1)
    for name in refused:
        assert "exclusive CPUs" in refused[name], refused[name]
    assert len(hb.daemon_pids(lab.state)) == 1  # started by the first hook, once
    assert lab.ledger()["records"]["containers"] == []


def test_a_burst_without_the_daemon_ends_every_hook_within_its_deadline(lab, capsys):
    hooks = hb.documented_hooks(lab, drop=["--start-daemon"])
    created, deleted, _ = burst(lab, hooks)
    with capsys.disabled():
        print("\n" + report(lab, "burst, hooks in process", created))
    assert_none_killed(created, "createRuntime")
    assert_none_killed(deleted, "poststop")
    for name, outcome in created.items():
        if outcome.returncode != 0:
            assert REFUSED in outcome.stderr, f"{name}: {outcome.stderr}"
    assert hb.daemon_pids(lab.state) == []
    # Poststops that gave up are made good by the next transaction, which drops the dead.
    hb.poststop_sweep(lab)
    assert lab.ledger()["records"]["containers"] == []

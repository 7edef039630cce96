"""The demo's parts that need no runtime: the placement checks and the table on hand-made rows,
and the clean-up stack (the real run is tests/e2e/test_demo.py)."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from demo import cleanup as demo_cleanup
from demo.checks import check_placements
from demo.rows import BESTEFFORT, BURSTABLE, GUARANTEED, DemoResult, MachineFacts, Row
from demo.table import explain, render_table, short_cgroup

TWO_CPUS = MachineFacts(frozenset({0, 1}), {0: 0, 1: 0}, frozenset({0}))
FOUR_CPUS_TWO_NODES = MachineFacts(frozenset(range(4)), {0: 0, 1: 0, 2: 1, 3: 1}, frozenset({0}))
POD_UID = "0b8bfadf-5ca1-4e2b-9f0e-3a1d2c4b5e6f"
CONTAINER_ID = "d6b54106f7885a1c3e9b2f4d6a8c0e1f3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a"


def row(pod: str, qos: str, cpus: str, mems: str = "0", asked_cpus: int = 0) -> Row:
    parent = "/kubepods" if qos == GUARANTEED else f"/kubepods/{qos.lower()}"
    return Row(pod, qos, "asked", asked_cpus, f"{parent}/pod{POD_UID}/{CONTAINER_ID}", cpus, mems,
               cpus, mems)


def good_rows() -> tuple[Row, ...]:
    return (row("guaranteed", GUARANTEED, "1", asked_cpus=1), row("burstable", BURSTABLE, "0"),
            row("besteffort", BESTEFFORT, "0"))


def test_the_expected_placement_has_no_problem() -> None:
    assert check_placements(good_rows(), TWO_CPUS, "0-1") == []


def test_a_guaranteed_cpu_in_a_shared_cpuset_is_not_exclusive() -> None:
    g, bu, be = good_rows()
    problems = check_placements((g, replace(bu, cpus="0-1", inside_cpus="0-1"), be), TWO_CPUS, "0-1")
    assert "guaranteed's CPU(s) 1 are also in burstable's cpuset 0-1: not exclusive" in problems
    assert any(p.startswith("burstable (Burstable) runs on 0-1, not on the shared pool 0") for p in problems)


def test_the_kernel_view_from_inside_must_match_the_cgroup_file() -> None:
    g, bu, be = good_rows()
    problems = check_placements((g, bu, replace(be, inside_cpus="0-1", inside_mems="0-1")), TWO_CPUS, "0-1")
    assert problems == [
        "besteffort: cgroup cpuset.cpus is 0 but Cpus_allowed_list inside is 0-1",
        "besteffort: cgroup cpuset.mems is 0 but Mems_allowed_list inside is 0-1",
    ]


def test_the_guaranteed_pod_must_get_what_it_asked_and_never_the_reserved_cpu() -> None:
    g, bu, be = good_rows()
    problems = check_placements((replace(g, cpus="0-1", inside_cpus="0-1"), bu, be), TWO_CPUS, "0-1")
    assert "guaranteed asked for 1 CPU(s) but its cpuset.cpus is 0-1" in problems
    assert "guaranteed got reserved CPU(s) 0" in problems


def test_single_numa_node_means_one_node_for_cpus_and_memory_is_left_alone() -> None:
    rows = (row("guaranteed", GUARANTEED, "1-2", mems="0-1", asked_cpus=2),
            row("burstable", BURSTABLE, "0,3"), row("besteffort", BESTEFFORT, "0,3"))
    problems = check_placements(rows, FOUR_CPUS_TWO_NODES, "0-3")
    assert "guaranteed's CPUs 1-2 span NUMA nodes 0-1 under single-numa-node" in problems
    rows = (row("guaranteed", GUARANTEED, "2-3", mems="0-1", asked_cpus=2),
            row("burstable", BURSTABLE, "0-1", mems="0-1"), row("besteffort", BESTEFFORT, "0-1", mems="0-1"))
    assert check_placements(rows, FOUR_CPUS_TWO_NODES, "0-3") == []
    pinned = (row("guaranteed", GUARANTEED, "2-3", mems="1", asked_cpus=2),
              row("burstable", BURSTABLE, "0-1", mems="0-1"), row("besteffort", BESTEFFORT, "0-1", mems="0-1"))
    assert check_placements(pinned, FOUR_CPUS_TWO_NODES, "0-3") == [
        "guaranteed's memory nodes 1 differ from burstable's 0-1: pinned without the Memory Manager",
        "guaranteed's memory nodes 1 differ from besteffort's 0-1: pinned without the Memory Manager"]


def test_a_missing_container_or_a_besteffort_start_off_the_whole_machine_is_reported() -> None:
    g, bu, _ = good_rows()
    assert check_placements((g, bu), TWO_CPUS, "0-1") == [
        "expected one container of each QoS class, got 2 rows (Guaranteed, Burstable)"]
    assert check_placements(good_rows(), TWO_CPUS, "0") == [
        "before the Guaranteed pod the BestEffort container ran on 0, not on every online CPU (0-1)"]


def test_the_table_aligns_its_columns_and_shows_what_was_read() -> None:
    lines = render_table(good_rows()).splitlines()
    assert lines[0].split() == ["POD", "QOS", "ASKED", "cpuset.cpus", "cpuset.mems",
                                "Cpus_allowed_list", "Mems_allowed_list"]
    assert set(lines[1]) == {"-", " "}
    assert lines[2].split() == ["guaranteed", "Guaranteed", "asked", "1", "0", "1", "0"]
    column = lines[0].index("cpuset.cpus")
    assert [line[column] for line in lines[2:]] == ["1", "0", "0"]


def test_cgroup_paths_are_shortened_but_recognisable() -> None:
    assert short_cgroup(f"/kubepods/burstable/pod{POD_UID}/{CONTAINER_ID}") == \
        "/kubepods/burstable/pod0b8bfadf…/d6b54106…"
    assert short_cgroup("/kubepods/besteffort") == "/kubepods/besteffort"


def test_the_explanation_takes_its_figures_from_the_rows() -> None:
    result = DemoResult("2.1.9", TWO_CPUS, {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                                            "topologyManagerPolicy": "single-numa-node"},
                        Path("/sys/fs/cgroup/cpuset"), good_rows(), "0-1", (), Path("/tmp/x"), 1.0)
    lines = explain(result)
    prose = "\n".join(lines[:-3]).splitlines()  # wrapped sentences, then one line per cgroup
    assert len(prose) > len(lines) - 3 and all(len(line) <= 100 for line in prose)
    text = " ".join(" ".join(lines).split())
    assert "CPU manager static, reservedSystemCPUs 0, topology manager single-numa-node" in text
    assert "2 CPUs 0-1 on 1 NUMA node" in text
    assert "Pod guaranteed asked for whole CPUs" in text and "got CPU 1 to itself" in text
    assert "Shared pool: CPU 0 =" in text
    assert "started first, on CPU 0-1; the plugin moved it to 0" in text
    assert "/sys/fs/cgroup/cpuset/kubepods/pod0b8bfadf…/d6b54106…/cpuset.{cpus,mems}" in text


def test_cleanup_runs_every_step_last_first_even_after_one_fails() -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise OSError("disk on fire")

    stack = demo_cleanup.Cleanup()
    stack.push("first", lambda: ran.append("first"))
    stack.push("boom", boom)
    stack.push("last", lambda: ran.append("last") or ["left a file"])
    assert stack.run() == ["last: left a file", "boom: OSError: disk on fire"]
    assert ran == ["last", "boom", "first"]
    assert stack.run() == []  # each step runs once


def test_cleanup_ignores_ctrl_c_while_it_runs() -> None:
    # A handler of the test's own, so the check holds however pytest was started (a background
    # job or nohup starts it with SIGINT ignored): the cleanup restores what it found.
    def found(signum, frame):
        raise KeyboardInterrupt

    seen: list[object] = []
    stack = demo_cleanup.Cleanup()
    stack.push("interrupt", lambda: os.kill(os.getpid(), signal.SIGINT))
    stack.push("look", lambda: seen.append(signal.getsignal(signal.SIGINT)))
    before = signal.signal(signal.SIGINT, found)
    try:
        assert stack.run() == []
        assert seen == [signal.SIG_IGN]
        assert signal.getsignal(signal.SIGINT) is found
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_signal_whose_exception_was_swallowed_is_raised_at_the_next_step() -> None:
    previous = {s: signal.getsignal(s) for s in demo_cleanup.CLEANUP_SIGNALS}
    demo_cleanup.install_signal_handlers()
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except demo_cleanup.Interrupted:
            pass  # what gRPC would swallow
        with pytest.raises(demo_cleanup.Interrupted, match="stopped by SIGTERM"):
            demo_cleanup.raise_if_interrupted()
        demo_cleanup.raise_if_interrupted()  # only once
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

"""`nri-numa state --kubelet-state-dir`: where the kubelet's CPU and Memory Manager checkpoints
(in their exact format, checksum included) and nri-numa's ledger disagree, one line each, counted
as drift."""

from __future__ import annotations

import json

from nri_numa.state.kubelet_checkpoints import (cpu_checkpoint_text, fnv1a_32,
                                                memory_checkpoint_text)
from tests.unit.state.test_state_view import Placed, base, run_state, v1_tree  # noqa: F401


def kubelet_file(folder, entries: dict, default: str = "0-7") -> None:
    """cpu_manager_state as kubelet 1.20's static policy writes it (v2, its checksum)."""
    text = cpu_checkpoint_text("static", default, entries)
    document = {"policyName": "static", "defaultCpuSet": default, "entries": entries,
                "checksum": fnv1a_32(text.encode())}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu_manager_state").write_text(json.dumps(document))


def kubelet_memory_file(folder, entries: dict) -> None:
    """memory_manager_state as the kubelet's Static policy writes it (its checksum); the machine
    state is not compared, so one node's table is enough."""
    machine = {"0": {"numberOfAssignments": 1, "memoryMap": {"memory": {
        "total": 64 << 30, "systemReserved": 1 << 30, "allocatable": 63 << 30,
        "reserved": 1 << 30, "free": 62 << 30}}, "cells": [0]}}
    text = memory_checkpoint_text("Static", machine, entries)
    document = {"policyName": "Static", "machineState": machine, "entries": entries,
                "checksum": fnv1a_32(text.encode())}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory_manager_state").write_text(json.dumps(document))


def blocks(*nodes: int) -> list[dict]:
    return [{"numaAffinity": list(nodes), "type": "memory", "size": 1 << 30}]


def test_the_same_memory_nodes_agree_and_others_are_named(base, capsys):  # noqa: F811
    placed = Placed(base)
    root = v1_tree(base, placed)
    node = int(placed.mems)
    kubelet_memory_file(base / "kubelet", {placed.g_pod.uid: {"app": blocks(node)}})
    args = ("--state-dir", str(placed.state_dir), "--cgroup-root", str(root),
            "--kubelet-state-dir", str(base / "kubelet"))
    code, out, _ = run_state(capsys, *args)
    assert code == 0 and "Against the kubelet's memory_manager_state: they agree" in out
    kubelet_memory_file(base / "kubelet", {placed.g_pod.uid: {"app": blocks(1 - node)},
                                           placed.be_pod.uid: {"app": blocks(0)},
                                           "old-pod": {"worker": blocks(0, 1)}})
    kubelet_file(base / "kubelet", {placed.g_pod.uid: {"app": placed.exclusive}})
    code, out, _ = run_state(capsys, *args, "--json")
    assert code == 3
    assert json.loads(out)["kubelet_disagreements"] == [
        "pod default/be container app: the kubelet's memory on NUMA nodes 0, nri-numa's "
        "none (not placed by a Memory Manager)",
        f"pod default/g container app: the kubelet's memory on NUMA nodes {1 - node}, "
        f"nri-numa's {node}",
        "pod old-pod container worker: the kubelet's memory on NUMA nodes 0-1, unknown to "
        "nri-numa"]


def test_a_folder_without_either_file_is_one_line(base, capsys):  # noqa: F811
    placed = Placed(base)
    root = v1_tree(base, placed)
    (base / "kubelet").mkdir()
    code, _, err = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                             str(root), "--kubelet-state-dir", str(base / "kubelet"))
    assert code == 1 and err.strip().count("\n") == 0
    assert "neither cpu_manager_state nor memory_manager_state" in err


def test_the_same_placement_agrees(base, capsys):  # noqa: F811
    placed = Placed(base)
    root = v1_tree(base, placed)
    kubelet_file(base / "kubelet", {placed.g_pod.uid: {"app": placed.exclusive}})
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                             str(root), "--kubelet-state-dir", str(base / "kubelet"))
    assert code == 0 and "Against the kubelet's cpu_manager_state: they agree" in out


def test_other_cpus_and_containers_only_the_kubelet_knows_are_named(base, capsys):  # noqa: F811
    placed = Placed(base)
    root = v1_tree(base, placed)
    other = "0"  # reserved: never nri-numa's exclusive choice
    assert other not in placed.exclusive.split(",")
    kubelet_file(base / "kubelet", {placed.g_pod.uid: {"app": other},
                                    "old-pod": {"worker": "7"}})
    code, out, _ = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                             str(root), "--kubelet-state-dir", str(base / "kubelet"), "--json")
    assert code == 3
    assert json.loads(out)["kubelet_disagreements"] == [
        f"pod default/g container app: the kubelet's CPUs {other}, nri-numa's {placed.exclusive}",
        "pod old-pod container worker: the kubelet's CPUs 7, unknown to nri-numa"]


def test_a_damaged_kubelet_file_is_one_line(base, capsys):  # noqa: F811
    placed = Placed(base)
    root = v1_tree(base, placed)
    (base / "kubelet").mkdir()
    (base / "kubelet" / "cpu_manager_state").write_text('{"policyName": "static", "checksum": 1}')
    code, out, err = run_state(capsys, "--state-dir", str(placed.state_dir), "--cgroup-root",
                               str(root), "--kubelet-state-dir", str(base / "kubelet"))
    assert code == 1 and len(err.strip().splitlines()) == 1 and "cpu_manager_state" in err

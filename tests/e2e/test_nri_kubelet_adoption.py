"""Moving a node from the kubelet's static managers without draining, on real containerd 1.7.24
and 2.1.9 with runc: containers that run before nri-numa starts, and the kubelet's
cpu_manager_state and memory_manager_state (its exact format, checksums included) for them.
At the first Synchronize the Guaranteed container keeps the kubelet's CPU and memory, the
BestEffort one is moved off that CPU, the cgroups follow, and `nri-numa state
--kubelet-state-dir` finds nothing to disagree about."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nri_numa.state.kubelet_checkpoints import (cpu_checkpoint_text, fnv1a_32,
                                                memory_checkpoint_text)
from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (AGENT, BESTEFFORT, CONFIG, GUARANTEED_1, REPO, MiB, agent_on,
                                 cgroup_cpus, run, start_and_connect, wait_until)

pytestmark = pytest.mark.e2e

STATIC_MEMORY = {"memoryManagerPolicy": "Static",
                 "reservedMemory": [{"numaNode": 0, "limits": {"memory": "256Mi"}}]}


def write_kubelet_checkpoints(folder: Path, pod_uid: str) -> None:
    """What kubelet 1.20 leaves with cpuManagerPolicy static (reservedSystemCPUs 0) and
    memoryManagerPolicy Static, one Guaranteed container `work` on CPU 1 with 64Mi on node 0."""
    folder.mkdir()
    entries = {pod_uid: {"work": "1"}}
    text = cpu_checkpoint_text("static", "0", entries)
    (folder / "cpu_manager_state").write_text(json.dumps({
        "policyName": "static", "defaultCpuSet": "0", "entries": entries,
        "checksum": fnv1a_32(text.encode())}))
    machine = {"0": {"numberOfAssignments": 1, "memoryMap": {"memory": {
        "total": 1 << 34, "systemReserved": 256 * MiB, "allocatable": (1 << 34) - 256 * MiB,
        "reserved": 64 * MiB, "free": (1 << 34) - 320 * MiB}}, "cells": [0]}}
    memory = {pod_uid: {"work": [{"numaAffinity": [0], "type": "memory", "size": 64 * MiB}]}}
    text = memory_checkpoint_text("Static", machine, memory)
    (folder / "memory_manager_state").write_text(json.dumps({
        "policyName": "Static", "machineState": machine, "entries": memory,
        "checksum": fnv1a_32(text.encode())}))


def test_running_containers_keep_what_the_kubelets_checkpoints_gave_them(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, tmp_path: Path) -> None:
    kubelet = tmp_path / "kubelet"
    guaranteed = Pod("g", (GUARANTEED_1,))
    write_kubelet_checkpoints(kubelet, guaranteed.uid)
    with agent_on(containerd.paths.nri_socket, tmp_path,
                  extra_args=("--kubelet-state-dir", str(kubelet))) as agent:
        agent.config_file.write_text("".join(f"{k}: {json.dumps(v)}\n"
                                             for k, v in {**CONFIG, **STATIC_MEMORY}.items()))
        shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
        exclusive = run(cri_client, guaranteed, busybox_image)
        assert cgroup_cpus(cri_client, cgroup_layout, exclusive) == {0, 1}  # nobody placed it

        start_and_connect(containerd, agent)
        agent.wait_log("synchronized:")
        log = agent.log_text()
        assert "running pod default/g container work keeps the kubelet's memory 64Mi on NUMA " \
               "nodes 0" in log
        assert "adopted pod default/g container work on the kubelet's CPUs 1" in log
        assert "placed anew" not in log
        wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, exclusive) == {1}, 10,
                   "the Guaranteed container's cgroup on CPU 1")
        wait_until(lambda: cgroup_cpus(cri_client, cgroup_layout, shared) == {0}, 10,
                   "the BestEffort container's cgroup on CPU 0")

        done = subprocess.run([str(AGENT), "state", "--state-dir", str(agent.state_dir),
                               "--kubelet-state-dir", str(kubelet), "--json"],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stdout + done.stderr
        view = json.loads(done.stdout)
        assert view["kubelet_disagreements"] == []
        g = next(c for c in view["containers"] if c["id"] == exclusive)
        assert g["memory"] == [{"resource": "memory", "numa_nodes": [0], "bytes": 64 * MiB}]

"""`nri-numa state` against real containerd 1.7.24 and 2.1.9 with runc and the plugin running:
what it lists agrees with the cgroups runc made, and a cpuset written behind the plugin's back
shows up as drift for that one container, with exit status 3."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.harness.cgroups import CgroupLayout, container_cgroup_path
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage
from tests.e2e.nri_agent import (AGENT, BESTEFFORT, GUARANTEED_1, REPO, Agent, agent,
                                 cgroup_cpus, run, start_and_connect)

__all__ = ["agent"]  # the fixture, imported for pytest
pytestmark = pytest.mark.e2e


def nri_numa_state(agent: Agent, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(AGENT), "state", "--state-dir", str(agent.state_dir), *more],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_state_matches_the_cgroups_then_reports_a_cpuset_changed_behind_its_back(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, agent: Agent) -> None:
    start_and_connect(containerd, agent)
    shared = run(cri_client, Pod("be", (BESTEFFORT,)), busybox_image)
    exclusive = run(cri_client, Pod("g", (GUARANTEED_1,)), busybox_image)
    paths = {cid: container_cgroup_path(cri_client.container_info(cid))
             for cid in (shared, exclusive)}

    done = nri_numa_state(agent, "--json", "--config", str(agent.config_file))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    view = json.loads(done.stdout)
    assert (view["kind"], view["shared_pool"], view["reserved_cpus"]) == ("nri", "0", "0")
    assert view["cgroups"]["version"] == cgroup_layout.version
    by_id = {c["id"]: c for c in view["containers"]}
    assert set(by_id) == {shared, exclusive}
    for cid, path in paths.items():
        assert by_id[cid]["cgroup"]["path"] == path and by_id[cid]["drift"] == []
    assert (by_id[exclusive]["exclusive"], by_id[exclusive]["cpus"]) == (True, "1")
    assert by_id[exclusive]["cgroup"]["cpus"] == "1"
    assert (by_id[shared]["exclusive"], by_id[shared]["cgroup"]["cpus"]) == (False, "0")
    assert by_id[exclusive]["qos"] == "Guaranteed" and by_id[shared]["qos"] == "BestEffort"

    # Behind the plugin's back: the exclusive container onto every CPU.
    cpus_file = cgroup_layout.mount / paths[exclusive].lstrip("/") / "cpuset.cpus"
    Path(cpus_file).write_text("0-1")
    assert cgroup_cpus(cri_client, cgroup_layout, exclusive) == {0, 1}

    done = nri_numa_state(agent)
    assert done.returncode == 3, done.stdout + done.stderr
    drift_lines = [line for line in done.stdout.splitlines() if line.startswith("DRIFT ")]
    assert drift_lines == [f"DRIFT default/g work ({exclusive[:12]}) at {paths[exclusive]}: "
                           "cpuset.cpus is 0-1, ledger says 1"]
    assert done.stdout.splitlines()[-1] == "1 of 2 containers drifted"
    print(done.stdout)  # shown with -s: the table as it really prints

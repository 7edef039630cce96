"""The demo (`./scripts/demo`) run once through its library entry point on containerd 2.1.9: the
rows it read back pass its own checks and say what the static policy promises, its report prints
the table and "ok", and its clean-up left nothing behind (folder, shims, mounts, cgroups)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from demo.checks import check_placements
from demo.cli import report
from demo.rows import BESTEFFORT, BURSTABLE, GUARANTEED
from demo.run import run_demo
from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.runtimes import Runtimes

pytestmark = pytest.mark.e2e


def shims_of(workdir: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and str(workdir).encode() in cmdline:
            found.append(proc.name)
    return found


def test_the_demo_places_and_reads_back_three_pods_and_cleans_up(
        runtimes: Runtimes, cgroup_layout: CgroupLayout, capsys: pytest.CaptureFixture[str]) -> None:
    progress = io.StringIO()
    result = run_demo("2.1", progress)

    assert result.containerd_version == "2.1.9"
    assert [r.qos for r in result.rows] == [GUARANTEED, BURSTABLE, BESTEFFORT]
    assert check_placements(result.rows, result.machine, result.besteffort_before) == []
    guaranteed, burstable, besteffort = result.rows
    assert len(guaranteed.cpu_ids) == 1 and not guaranteed.cpu_ids & result.machine.reserved
    assert burstable.cpu_ids == besteffort.cpu_ids == result.machine.online - guaranteed.cpu_ids
    assert result.besteffort_before and len(result.machine.online) >= 2
    assert result.config["topologyManagerPolicy"] == "single-numa-node"
    assert [line.split(" container ")[0] for line in result.plugin_lines] == [
        "placed pod default/besteffort", "placed pod default/guaranteed", "placed pod default/burstable"]
    assert f"cpus {guaranteed.cpus} (exclusive)" in result.plugin_lines[1]

    steps = progress.getvalue()
    for step in ("starting a private containerd 2.1.9", "importing the busybox image",
                 "starting nri-numa run", "running pod guaranteed", "cleaning up"):
        assert f"demo: {step}" in steps, steps
    assert "stopped" not in steps

    # Clean-up: nothing it reported, and nothing left that it might have missed.
    assert result.cleanup_problems == ()
    assert not result.workdir.exists()
    assert shims_of(result.workdir) == []
    assert str(result.workdir) not in Path("/proc/self/mountinfo").read_text()
    for row in result.rows:
        pod_cgroup = cgroup_layout.mount / os.path.dirname(row.cgroup).lstrip("/")
        assert not pod_cgroup.exists(), pod_cgroup

    capsys.readouterr()
    assert report(result, smoke=False) == []
    printed = capsys.readouterr().out
    assert "Cpus_allowed_list" in printed and "guaranteed  Guaranteed" in printed
    assert printed.rstrip().splitlines()[-1].startswith("demo: ok on containerd 2.1.9")

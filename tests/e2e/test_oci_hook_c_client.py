"""The C client (nri-numa-hook-client) as real runc runs it, from the hooks of
hooks/c-client/runc-hooks.example.json: the first createRuntime finds no daemon and starts one
(--start-daemon, through the full hook it execs), later runs are forwarded to that daemon, and
each container sees only the CPU placed for it. Root, runc and busybox, as
tests/e2e/test_oci_hooks.py (whose lab this uses); skipped too where no C compiler exists."""

from __future__ import annotations

import json
import sys

import pytest

from nri_numa.hook import c_client
from nri_numa.topology.cpulist import parse_list
from tests.e2e.harness.cgroups import parse_status_allowed
from tests.e2e.test_oci_hooks import (HOOK_OWN_TIMEOUT_S, HOOK_TIMEOUT_S, REPO, STATUS, Lab,
                                      lab, runc)
from tests.integration.hook.test_hook_daemon_start import daemon_pids, stop_daemons

__all__ = ["lab"]  # the module-scoped fixture, used here


def c_client_bundle(lab: Lab, client: str, name: str, cpus: int) -> None:
    """A bundle from the runc example with the hooks of hooks/c-client, pointed at this lab."""
    spec = json.loads((REPO / "hooks" / "runc-config.example.json").read_text())
    hooks = json.loads((REPO / "hooks" / "c-client" / "runc-hooks.example.json").read_text())
    spec["hooks"] = hooks["hooks"]
    spec["root"] = {"path": str(lab.rootfs), "readonly": True}
    spec["process"]["args"] = STATUS
    spec["linux"]["cgroupsPath"] = f"{lab.parent}/{name}"
    spec["linux"]["resources"]["cpu"] = {"quota": cpus * 100_000, "period": 100_000}
    for stage, [hook] in spec["hooks"].items():
        assert "--start-daemon" in hook["args"]
        hook.update(path=client, timeout=HOOK_TIMEOUT_S,
                    args=[client, stage, "--config", str(lab.config), "--state-dir",
                          str(lab.state), "--topology", str(lab.topology_file), "--timeout",
                          str(HOOK_OWN_TIMEOUT_S), "--start-daemon"])
    folder = lab.base / "bundles" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(spec))


@pytest.fixture
def client(lab: Lab) -> str:
    if c_client.find_compiler() is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build nri-numa-hook-client")
    built = c_client.build(lab.base / c_client.BINARY_NAME, sys.executable)
    yield str(built)
    stop_daemons(lab.state)


def test_runc_runs_the_c_client_which_starts_the_daemon_then_forwards_to_it(lab, client):
    numa = {c.id: c.numa for c in lab.topology.cpus}
    for name in ("c-first", "c-second"):
        c_client_bundle(lab, client, name, cpus=1)
        done = runc(lab, "run", "--bundle", str(lab.base / "bundles" / name), name)
        assert done.returncode == 0, done.stderr
        seen = parse_status_allowed(done.stdout)
        assert len(seen.cpu_ids) == 1 and seen.cpu_ids <= lab.allocatable
        assert parse_list(seen.mems) == {numa[c] for c in seen.cpu_ids}
    [daemon] = daemon_pids(lab.state)  # started by the first hook, used by every later one
    log = (lab.state / "hook.log").read_text()
    for name in ("c-first", "c-second"):
        assert f"hook[{daemon}] createRuntime: placed container {name}" in log
        assert f"hook[{daemon}] poststop: released container {name}" in log
    assert lab.ledger()["records"]["containers"] == []  # every poststop released its own

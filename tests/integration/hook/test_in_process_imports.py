"""A hook run in process (no hook daemon) pays for every module it imports, at every container
start (issue 16 item 2: ≤ 100 ms p50). createRuntime and poststop of a container without
devices or memory pinning must not load what only precreate, a container with devices or the
Static memory policy needs, nor the other commands' parsers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle

REPO = Path(__file__).resolve().parents[3]
DGX = preset_topology("dgx-h100")  # GPUs and NICs: the device machinery is relevant
# Device grants, CDI specs and names, the driver's /proc files, podman's spec editing.
DEVICE_AND_PRECREATE = {"nri_numa.runtime.device_grant", "nri_numa.runtime.cdi",
                        "nri_numa.runtime.cdi_names", "nri_numa.topology.nvidia_proc",
                        "nri_numa.topology.sysfs_read", "nri_numa.hook.precreate"}
# The other commands' parsers and modules: a hook run is parsed with the hook's parser alone.
OTHER_COMMANDS = {"nri_numa.cli.main", "nri_numa.cli.run", "nri_numa.cli.explain",
                  "nri_numa.cli.simulate", "nri_numa.cli.scheduler_extender"}


# What the engine loads only on first use, none of which this container under single-numa-node
# with the container scope needs: the other policies, the pod scope, resize, the device
# choosers, the distributed CPU take; the kubelet's keys nri-numa ignores (the configuration
# has only keys nri-numa reads).
ENGINE_ON_USE = {"nri_numa.engine.policy.none", "nri_numa.engine.policy.best_effort",
                 "nri_numa.engine.policy.restricted", "nri_numa.engine.scope.pod",
                 "nri_numa.engine.resize", "nri_numa.engine.devices.gpu_select",
                 "nri_numa.engine.devices.nic_select", "nri_numa.engine.cpu.distributed",
                 "nri_numa.engine.kubelet_keys"}
# What only memory pinning (the Static memory policy) or devices need, none of which a container
# asking for CPUs alone under a configuration without a Memory Manager does: the Memory Manager,
# the Device Manager's hints and allocation, the hints past 8 NUMA nodes, quantities (hugepage
# names, reserved amounts).
MEMORY_AND_DEVICE_ENGINE = {
    "nri_numa.engine.memory", "nri_numa.engine.memory.allocate", "nri_numa.engine.memory.hints",
    "nri_numa.engine.memory.nodes", "nri_numa.engine.memory.resources",
    "nri_numa.engine.memory.state", "nri_numa.engine.devices.allocate",
    "nri_numa.engine.devices.hints", "nri_numa.engine.bounded_hints", "nri_numa.engine.quantity"}
CPUS_ONLY = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
             "topologyManagerPolicy": "single-numa-node"}


def run_traced(stage: str, args: list[str], stdin: bytes) -> set[str]:
    """The modules a hook process imported, from the interpreter's -X importtime trace, run as
    ``nri-numa hook`` (what the thin clients exec when no daemon takes the run)."""
    command = [sys.executable, "-X", "importtime", "-m", "nri_numa", "hook"]
    done = subprocess.run([*command, stage, *args], input=stdin, capture_output=True,
                          text=False, cwd=REPO, timeout=120)
    trace = done.stderr.decode(errors="replace")
    assert done.returncode == 0, trace[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in trace.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def fake_node(tmp_path: Path, config: dict) -> tuple[FakeHost, list[str]]:
    """A fake host on ``DGX`` and the hook's arguments for it under ``config``."""
    host = FakeHost(tmp_path / "host", 1, DGX.online_cpus)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    return host, ["--state-dir", str(tmp_path / "state"), "--config", str(config_file),
                  "--topology", str(topology_file(tmp_path, DGX)),
                  "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc)]


def test_create_and_stop_in_process_load_no_device_or_precreate_modules(tmp_path):
    host, args = fake_node(tmp_path, CPUS_ONLY)
    bundle = write_bundle(host.base, "c1", 1)
    host.start(4242, "/pods/c1")

    created = run_traced("createRuntime", args, oci_state("c1", 4242, bundle))
    assert "nri_numa.engine.admit" in created  # it did place the container
    assert host.cpus("/pods/c1") != DGX.online_cpus
    assert not created & DEVICE_AND_PRECREATE
    assert not created & ENGINE_ON_USE, created & ENGINE_ON_USE
    assert not created & MEMORY_AND_DEVICE_ENGINE, created & MEMORY_AND_DEVICE_ENGINE
    assert "nri_numa.cli.hook" in created and not created & OTHER_COMMANDS
    assert not created & {"fractions", "decimal"}  # no quantity is read: they load on first use

    host.stop(4242)
    stopped = run_traced("poststop", args, oci_state("c1", None, host.base))
    assert "nri_numa.hook.stages" in stopped
    assert not stopped & (DEVICE_AND_PRECREATE | OTHER_COMMANDS | MEMORY_AND_DEVICE_ENGINE)


def test_memory_pinning_in_process_loads_the_memory_manager_on_first_use(tmp_path):
    """The Memory Manager's modules, no longer imported with the engine, load in a fresh hook
    process as soon as the Static memory policy asks for them, and pin the memory."""
    host, args = fake_node(tmp_path, {
        **CPUS_ONLY, "memoryManagerPolicy": "Static",
        "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]})
    bundle = write_bundle(host.base, "m1", 2)
    host.start(4343, "/pods/m1")
    created = run_traced("createRuntime", args, oci_state("m1", 4343, bundle))
    assert {"nri_numa.engine.memory.allocate", "nri_numa.engine.quantity"} <= created
    assert not created & {"nri_numa.engine.devices.allocate", "nri_numa.engine.devices.hints"}
    blocks = memory_entries(tmp_path)["m1"]["m1"]
    assert [(b["type"], b["size"]) for b in blocks] == [("memory", 64 << 20)]  # the spec's limit
    assert host.mems("/pods/m1") == set(blocks[0]["numaAffinity"])
    host.stop(4343)
    run_traced("poststop", args, oci_state("m1", None, host.base))
    assert memory_entries(tmp_path) == {}


def memory_entries(tmp_path: Path) -> dict:
    """The memory blocks in the hook's saved ledger, by pod and container."""
    payload = json.loads((tmp_path / "state" / "checkpoint.json").read_text())["payload"]
    return payload["ledger"]["allocations"]["memory"]["entries"]


def test_bad_hook_arguments_still_get_the_whole_parser(tmp_path):
    """The hook's parser alone words a usage error as every command's parser does."""
    done = subprocess.run([sys.executable, "-m", "nri_numa", "hook", "createRuntime",
                           "--no-such-option"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert done.returncode == 2
    assert "nri-numa: error: unrecognized arguments: --no-such-option" in done.stderr

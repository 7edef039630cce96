"""A hook run in process (no hook daemon) pays for every module it imports, at every container
start (issue 16 item 2: ≤ 100 ms p50). createRuntime and poststop of a container without
devices must not load what only precreate or a container with devices needs, nor the other
commands' parsers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nri_numa.topology.synthetic import preset_topology
from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle

REPO = Path(__file__).resolve().parents[3]
# Device grants, CDI specs and names, the driver's /proc files, podman's spec editing.
DEVICE_AND_PRECREATE = {"nri_numa.runtime.device_grant", "nri_numa.runtime.cdi",
                        "nri_numa.runtime.cdi_names", "nri_numa.topology.nvidia_proc",
                        "nri_numa.topology.sysfs_read", "nri_numa.hook.precreate"}
# The other commands' parsers and modules: a hook run is parsed with the hook's parser alone,
# or, with plain arguments, without argparse.
OTHER_COMMANDS = {"nri_numa.cli.main", "nri_numa.cli.run", "nri_numa.cli.explain",
                  "nri_numa.cli.simulate", "nri_numa.cli.scheduler_extender"}


FAST_CLIENT = REPO / "nri_numa" / "hook" / "fast_client.py"
# What the values and the checksum no longer need: dataclasses (and inspect with it), OpenSSL
# through hashlib; once the fast client found no daemon, the socket module; typing, for
# annotations alone; logging and what it loads, the hook log being written without it.
LEFT_BEHIND = {"dataclasses", "inspect", "hashlib", "_hashlib", "socket", "typing", "logging",
               "traceback", "tokenize", "textwrap", "string"}
# What the engine loads only on first use, none of which this container under single-numa-node
# with the container scope needs: the other policies, the pod scope, resize, the device
# choosers, the distributed CPU take.
ENGINE_ON_USE = {"nri_numa.engine.policy.none", "nri_numa.engine.policy.best_effort",
                 "nri_numa.engine.policy.restricted", "nri_numa.engine.scope.pod",
                 "nri_numa.engine.resize", "nri_numa.engine.devices.gpu_select",
                 "nri_numa.engine.devices.nic_select", "nri_numa.engine.cpu.distributed"}


def run_traced(stage: str, args: list[str], stdin: bytes, fast_client: bool = False) -> set[str]:
    """The modules a hook process imported, from the interpreter's -X importtime trace: run as
    ``nri-numa hook``, or as the shipped hooks run the fast client (``-I -S``, no daemon)."""
    command = ([sys.executable, "-X", "importtime", "-I", "-S", str(FAST_CLIENT)] if fast_client
               else [sys.executable, "-X", "importtime", "-m", "nri_numa", "hook"])
    done = subprocess.run([*command, stage, *args], input=stdin, capture_output=True,
                          text=False, cwd=REPO, timeout=120)
    trace = done.stderr.decode(errors="replace")
    assert done.returncode == 0, trace[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in trace.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


@pytest.mark.parametrize("fast_client", [False, True], ids=["nri-numa hook", "fast client"])
def test_create_and_stop_in_process_load_no_device_or_precreate_modules(tmp_path, fast_client):
    topology = preset_topology("dgx-h100")  # GPUs and NICs: the device machinery is relevant
    host = FakeHost(tmp_path / "host", 1, topology.online_cpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                                  "topologyManagerPolicy": "single-numa-node"}))
    args = ["--state-dir", str(tmp_path / "state"), "--config", str(config),
            "--topology", str(topology_file(tmp_path, topology)),
            "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc)]
    bundle = write_bundle(host.base, "c1", 1)
    host.start(4242, "/pods/c1")

    created = run_traced("createRuntime", args, oci_state("c1", 4242, bundle), fast_client)
    assert "nri_numa.engine.admit" in created  # it did place the container
    assert host.cpus("/pods/c1") != topology.online_cpus
    assert not created & DEVICE_AND_PRECREATE
    assert not created & ENGINE_ON_USE, created & ENGINE_ON_USE
    assert "nri_numa.cli.hook" in created and not created & OTHER_COMMANDS
    assert "argparse" not in created  # plain arguments: read as argparse would, without it
    assert not created & {"fractions", "decimal"}  # no quantity is read: they load on first use
    if fast_client:
        assert not created & LEFT_BEHIND, created & LEFT_BEHIND

    host.stop(4242)
    stopped = run_traced("poststop", args, oci_state("c1", None, host.base), fast_client)
    assert "nri_numa.hook.stages" in stopped
    assert not stopped & (DEVICE_AND_PRECREATE | OTHER_COMMANDS)
    if fast_client:
        assert not stopped & LEFT_BEHIND, stopped & LEFT_BEHIND


def test_bad_hook_arguments_still_get_the_whole_parser(tmp_path):
    """Arguments the hook client cannot judge go to every command's parser, as before."""
    done = subprocess.run([sys.executable, "-m", "nri_numa", "hook", "createRuntime",
                           "--no-such-option"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert done.returncode == 2
    assert "nri-numa: error: unrecognized arguments: --no-such-option" in done.stderr

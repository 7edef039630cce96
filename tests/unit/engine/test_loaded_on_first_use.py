"""The engine's Memory Manager, device hints and allocation, bounded hints and quantities load
on first use: a hook process placing CPUs alone never imports them (issue 16). In a fresh
interpreter, where no test has imported them before, an admission that needs them must still
find them, and its allocations must encode, decode and release."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ON_FIRST_USE = ["nri_numa.engine.bounded_hints", "nri_numa.engine.devices.allocate",
                "nri_numa.engine.devices.hints", "nri_numa.engine.memory",
                "nri_numa.engine.quantity"]

# Run in a fresh interpreter: prints which of ON_FIRST_USE the engine's import loaded, then the
# placement of a Guaranteed container with a GPU and pinned memory, the ledger encoded and
# restored, and the release.
SCRIPT = """
import json, sys
from nri_numa.engine import EngineContext, admit, release
lazy = set(json.loads(sys.argv[1]))
loaded_with_engine = sorted(lazy & set(sys.modules))
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.state.encoding import LedgerEncoder
from nri_numa.state.ledger import Ledger
from nri_numa.topology.synthetic import preset_topology

config = config_from_mapping({
    "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,112",
    "topologyManagerPolicy": "single-numa-node", "memoryManagerPolicy": "Static",
    "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]})
ctx = EngineContext.build(preset_topology("dgx-h100"), config)
main = ContainerRequest("main", cpu_request=2000, cpu_limit=2000, memory_request=2 << 30,
                        memory_limit=2 << 30, devices={"nvidia.com/gpu": 1})
result = admit(ctx, ctx.empty_allocations(), PodRequest("p", "default", "p", app_containers=(main,)))
placement, = result.decision.placements
gpu_nodes = {g.numa_node for g in ctx.topology.gpus if g.uuid in placement.devices["nvidia.com/gpu"]}
cpu_nodes = {c.numa for c in ctx.topology.cpus if c.id in placement.cpus}
encoded = json.loads(LedgerEncoder().encode(Ledger(ctx, result.allocations)))
restored = Ledger.restore(ctx, encoded)
print(json.dumps({
    "loaded_with_engine": loaded_with_engine, "gpu_nodes": sorted(gpu_nodes),
    "cpu_nodes": sorted(cpu_nodes), "mems": sorted(placement.mems),
    "restored_equal": restored.allocations == result.allocations,
    "encoded_blocks": encoded["allocations"]["memory"]["entries"]["p"]["main"],
    "released_empty": release(ctx, result.allocations, "p") == ctx.empty_allocations()}))
"""


def test_memory_and_devices_load_when_an_admission_first_needs_them():
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(ON_FIRST_USE)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["loaded_with_engine"] == []
    assert len(seen["gpu_nodes"]) == 1
    assert seen["gpu_nodes"] == seen["cpu_nodes"] == seen["mems"]
    assert seen["restored_equal"] and seen["released_empty"]
    assert seen["encoded_blocks"] == [{"numaAffinity": seen["mems"], "size": 2 << 30,
                                       "type": "memory"}]

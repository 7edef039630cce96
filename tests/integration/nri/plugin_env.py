"""What the plugin tests share: a small two-node machine, the plugin on it, and readers for
its replies."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri import daemon as d
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint, read_envelope
from nri_numa.state.plugin_checkpoint import read_state
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Cpu, Gpu, NumaNode, PciDevice
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FakeRuntime

GIB = 1 << 30
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
          "topologyManagerPolicy": "single-numa-node"}
ALL = "0-7"


GPU_ON_NODE_1 = "GPU-6c1e0d1f-node1"


def machine() -> Topology:
    """Two sockets, one NUMA node each, four single-thread cores per node: CPUs 0-3 and 4-7;
    one GPU (/dev/nvidia0) on node 1."""
    cpus = tuple(Cpu(id=i, numa=i // 4, core=i, socket=i // 4, l3=i // 4 * 4) for i in range(8))
    nodes = tuple(NumaNode(id=n, cpus=frozenset(range(4 * n, 4 * n + 4)), memory_bytes=64 * GIB,
                           distances={0: 10 if n == 0 else 21, 1: 21 if n == 0 else 10})
                  for n in range(2))
    gpu_pci = PciDevice(address="0000:81:00.0", numa_node=1, class_code=0x030200,
                        vendor=0x10DE, device=0x2330)
    gpu = Gpu(index=0, uuid=GPU_ON_NODE_1, pci_address=gpu_pci.address, numa_node=1, minor=0)
    return Topology(cpus=cpus, numa_nodes=nodes, pci_devices=(gpu_pci,), gpus=(gpu,))


class Sent:
    """Collects what the plugin hands the daemon to send after a handler."""

    def __init__(self) -> None:
        self.batches: list[list[api.ContainerUpdate]] = []

    def __call__(self, updates: list[api.ContainerUpdate]) -> None:
        self.batches.append(updates)


def new_plugin(state_dir: Path | None = None, sent: Sent | None = None, **config) -> NumaPlugin:
    topology = machine()
    store = None if state_dir is None else CheckpointStore(state_dir, machine_fingerprint(topology))
    return NumaPlugin(topology, config_from_mapping({**CONFIG, **config}), store,
                      send_updates=sent)


def saved_payload(state_dir: Path) -> dict:
    """The plugin's state as a restart reads it: the snapshot's payload (checked) with its
    journal replayed; nothing is changed or set aside."""
    raw = (state_dir / "checkpoint.json").read_bytes()
    payload, _ = read_state(state_dir, read_envelope(raw)["payload"])
    return payload


def cpusets(updates) -> dict[str, str]:
    return {u.container_id: u.linux.resources.cpu.cpus for u in updates}


def create(plugin: NumaPlugin, sandbox: api.PodSandbox, c: api.Container):
    return plugin.create_container(msg.create(sandbox, c))


def agent_files(folder: Path) -> tuple[Path, Path]:
    """``machine()`` and ``CONFIG`` written to ``folder`` as the agent reads them: the topology
    file (node.json) and the configuration file (config.yaml)."""
    topology, config = folder / "node.json", folder / "config.yaml"
    topology.write_text(machine().to_json())
    config.write_text("".join(f"{k}: {v!r}\n" for k, v in CONFIG.items()))
    return topology, config


def serve_agent(scratch: Path, calls: Callable[[FakeRuntime], list[api.CreateContainerResponse]],
                version: str = "1.7.24", **options) -> list[api.CreateContainerResponse]:
    """Run the whole agent (``daemon.run``) pre-launched on a socket pair, on ``machine()`` under
    ``CONFIG``, its files in ``scratch`` and more ``DaemonOptions`` in ``options``; the runtime
    side configures it as containerd ``version``, makes ``calls`` and closes the socket."""
    topology, config = agent_files(scratch)
    plugin_end, runtime_end = socket.socketpair()
    runtime = FakeRuntime(runtime_end).start()
    replies: list[api.CreateContainerResponse] = []

    def runtime_side() -> None:
        try:
            runtime.registered.wait(5)
            runtime.call("Configure", api.ConfigureRequest(runtime_name="containerd",
                                                           runtime_version=version),
                         api.ConfigureResponse)
            replies.extend(calls(runtime))
        finally:
            runtime.close()

    side = threading.Thread(target=runtime_side, daemon=True)
    side.start()
    options = d.DaemonOptions(state_dir=scratch / "state", topology_file=topology,
                              config_file=config, dev_root=scratch / "dev", **options)
    d.run(options, environ={"NRI_PLUGIN_SOCKET": str(plugin_end.detach())})
    side.join(5)
    return replies

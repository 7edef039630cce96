"""Synchronize after the checkpoint is lost: a running container keeps the GPUs nri-numa gave
it for its ``numa.nri.io/devices`` request, read back from the devices the runtime reports, so
they are not handed to the next container that asks. Two GPUs on node 1 (minors 0 and 1): the
engine's first choice is GPU A, so a container that holds B shows whether B was re-claimed."""

from __future__ import annotations

import logging
from dataclasses import replace

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import GPU_RESOURCE
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.state.checkpoint import CheckpointStore, machine_fingerprint
from nri_numa.topology.model import Topology
from nri_numa.topology.parts import Gpu, PciDevice
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, create, machine

GPU_A, GPU_B = "GPU-aaaa-node1", "GPU-bbbb-node1"
ASK_ONE = {"numa.nri.io/devices": "nvidia.com/gpu=1"}


def two_gpus() -> Topology:
    base = machine()
    pcis = tuple(PciDevice(address=a, numa_node=1, class_code=0x030200, vendor=0x10DE,
                           device=0x2330) for a in ("0000:81:00.0", "0000:82:00.0"))
    gpus = (Gpu(index=0, uuid=GPU_A, pci_address=pcis[0].address, numa_node=1, minor=0),
            Gpu(index=1, uuid=GPU_B, pci_address=pcis[1].address, numa_node=1, minor=1))
    return replace(base, pci_devices=pcis, gpus=gpus)


def plugin(state_dir) -> NumaPlugin:
    topology = two_gpus()
    return NumaPlugin(topology, config_from_mapping(CONFIG),
                      CheckpointStore(state_dir, machine_fingerprint(topology)))


def asking(name: str, cpus: int = 1, annotations: dict[str, str] = ASK_ONE
           ) -> tuple[api.PodSandbox, api.Container]:
    sandbox = msg.pod(name)
    container = msg.guaranteed(sandbox, "app", cpus=cpus)
    container.annotations.update(annotations)
    return sandbox, container


def as_run(c: api.Container, reply: api.CreateContainerResponse, pid: int) -> api.Container:
    """The container as the runtime reports it once the plugin's adjustment is applied."""
    adjust = reply.adjust
    c.linux.devices.extend(api.LinuxDevice(path=d.path, type=d.type, major=d.major,
                                           minor=d.minor) for d in adjust.linux.devices)
    c.env.extend(f"{e.key}={e.value}" for e in adjust.env)
    c.linux.resources.cpu.cpus = adjust.linux.resources.cpu.cpus
    c.state, c.pid = api.CONTAINER_RUNNING, pid
    return c


def gpus_of(p: NumaPlugin, sandbox: api.PodSandbox) -> tuple[str, ...]:
    entry = p.ledger.allocations.container(sandbox.uid, "app")
    return () if entry is None else tuple(entry.devices.get(GPU_RESOURCE, ()))


def lose_checkpoint(state_dir) -> None:
    (state_dir / "checkpoint.json").unlink()


def sync(p: NumaPlugin, pods, containers) -> None:
    p.synchronize(api.SynchronizeRequest(pods=pods, containers=containers))


def test_a_running_container_keeps_its_gpu_when_the_checkpoint_is_lost(state_dir):
    first = plugin(state_dir)
    a_pod, a = asking("a")
    b_pod, b = asking("b")
    create(first, a_pod, a)
    b_reply = create(first, b_pod, b)
    assert gpus_of(first, a_pod) == (GPU_A,) and gpus_of(first, b_pod) == (GPU_B,)
    first.stop_container(api.StopContainerRequest(pod=a_pod, container=a))
    lose_checkpoint(state_dir)

    second = plugin(state_dir)
    sync(second, [b_pod], [as_run(b, b_reply, pid=10)])
    assert gpus_of(second, b_pod) == (GPU_B,)  # not GPU A, the engine's first pick
    c_pod, c = asking("c")
    c_reply = create(second, c_pod, c)
    assert gpus_of(second, c_pod) == (GPU_A,)
    assert [(d.path, d.minor) for d in c_reply.adjust.linux.devices][:1] == [("/dev/nvidia0", 0)]
    # And what was re-claimed is saved: a third start reads it back.
    third = plugin(state_dir)
    assert gpus_of(third, b_pod) == (GPU_B,) and gpus_of(third, c_pod) == (GPU_A,)


def test_the_gpu_is_read_back_from_nvidia_visible_devices_alone(state_dir):
    first = plugin(state_dir)
    create(first, *asking("a"))
    b_pod, b = asking("b")
    create(first, b_pod, b)
    lose_checkpoint(state_dir)
    second = plugin(state_dir)
    b.env.append(f"NVIDIA_VISIBLE_DEVICES={GPU_B}")  # the NVIDIA runtime hook's way
    b.state, b.pid = api.CONTAINER_RUNNING, 11
    sync(second, [b_pod], [b])
    assert gpus_of(second, b_pod) == (GPU_B,)


def test_a_gpu_from_a_device_plugin_is_not_held_by_nri_numa(state_dir):
    p = plugin(state_dir)
    sandbox, c = asking("dp", annotations={})
    c.linux.devices.append(api.LinuxDevice(path="/dev/nvidia1", type="c", major=195, minor=1))
    c.state, c.pid = api.CONTAINER_RUNNING, 12
    sync(p, [sandbox], [c])
    assert p.containers[c.id].mems is None  # no Memory Manager: memory left alone
    assert p.ledger.ctx.nodes_of_cpus(p.ledger.allocations.exclusive_cpus()) == {1}  # its GPU's
    assert gpus_of(p, sandbox) == ()


def test_a_container_that_does_not_fit_keeps_its_gpu_in_the_shared_pool(state_dir, caplog):
    # Five CPUs fit no single node: adopted into the shared pool, its GPU B still held.
    sandbox, big = asking("big", cpus=5)
    big.linux.devices.append(api.LinuxDevice(path="/dev/nvidia1", type="c", major=195, minor=1))
    big.linux.resources.cpu.cpus = "0-7"
    big.state, big.pid = api.CONTAINER_RUNNING, 13
    p = plugin(state_dir)
    with caplog.at_level(logging.WARNING):
        sync(p, [sandbox], [big])
    assert "does not fit" in caplog.text
    record = p.containers[big.id]
    assert not record.exclusive and not record.in_ledger  # not placed...
    assert gpus_of(p, sandbox) == (GPU_B,)  # ...but its GPU held
    c_pod, c = asking("c")
    c_reply = create(p, c_pod, c)
    assert gpus_of(p, c_pod) == (GPU_A,)
    # Both survive a restart from the checkpoint, and a Synchronize that finds them running.
    again = plugin(state_dir)
    assert gpus_of(again, sandbox) == (GPU_B,) and not again.containers[big.id].in_ledger
    sync(again, [sandbox, c_pod], [big, as_run(c, c_reply, pid=15)])
    assert gpus_of(again, sandbox) == (GPU_B,) and gpus_of(again, c_pod) == (GPU_A,)
    p = again
    # When it goes, so does its GPU.
    p.stop_container(api.StopContainerRequest(pod=sandbox, container=big))
    assert gpus_of(p, sandbox) == () and GPU_B not in p.ledger.allocations.devices_in_use(
        GPU_RESOURCE)


def test_more_gpus_than_asked_for_are_not_taken_as_its_own(state_dir, caplog):
    sandbox, c = asking("greedy")
    for minor in (0, 1):
        c.linux.devices.append(api.LinuxDevice(path=f"/dev/nvidia{minor}", type="c", major=195,
                                               minor=minor))
    c.state, c.pid = api.CONTAINER_RUNNING, 14
    p = plugin(state_dir)
    with caplog.at_level(logging.WARNING):
        sync(p, [sandbox], [c])
    assert f"has nvidia.com/gpu {GPU_A}, {GPU_B} and asks for 1" in caplog.text
    assert gpus_of(p, sandbox) == (GPU_A,)  # chosen anew


def test_containers_showing_gpus_are_adopted_before_those_that_show_none(state_dir):
    # "early" was created first (lower pid) but shows no GPU (created while the agent was away,
    # say); "late" shows GPU A. Adopted in pid order, early would be given A and late moved to B.
    early_pod, early = asking("early")
    early.state, early.pid = api.CONTAINER_RUNNING, 20
    late_pod, late = asking("late")
    late.linux.devices.append(api.LinuxDevice(path="/dev/nvidia0", type="c", major=195, minor=0))
    late.state, late.pid = api.CONTAINER_RUNNING, 21
    p = plugin(state_dir)
    sync(p, [early_pod, late_pod], [early, late])
    assert gpus_of(p, late_pod) == (GPU_A,) and gpus_of(p, early_pod) == (GPU_B,)

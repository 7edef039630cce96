"""CDI through the whole agent (``nri_numa.nri.daemon.run``, pre-launched on a socket pair, real
protobuf on the wire, a real CDI spec folder): a container that got its GPU through CDI, named
in a ``cdi.k8s.io`` annotation, gets CPUs on that GPU's node; a GPU asked for by annotation is
given by CDI name when the runtime that configured the plugin applies them (containerd 2.1),
as device nodes when it does not (1.7), and as device nodes when no spec names it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nri_numa.nri.pb import api_pb2 as api
from nri_numa.topology.cpulist import parse_list
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FakeRuntime
from tests.integration.nri.plugin_env import GPU_ON_NODE_1, serve_agent

NODE_1_CPUS = {4, 5, 6, 7}


def _nvidia_spec(folder: Path) -> None:
    """What ``nvidia-ctk cdi generate`` writes for the machine's one GPU (minor 0)."""
    folder.mkdir(parents=True)
    (folder / "nvidia.yaml").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": name, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
                    for name in ("0", GPU_ON_NODE_1, "all")],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                           "deviceNodes": [{"path": "/dev/nvidiactl"}]}}))


def _serve(scratch: Path, version: str,
           calls: Callable[[FakeRuntime], list[api.CreateContainerResponse]],
           injection: str = "auto") -> list[api.CreateContainerResponse]:
    return serve_agent(scratch, calls, version, device_injection=injection,
                       cdi_spec_dirs=(scratch / "etc-cdi", scratch / "run-cdi"))


def _create(runtime: FakeRuntime, pod: str, annotations: dict[str, str],
            cpus: int = 1) -> api.CreateContainerResponse:
    sandbox = msg.pod(pod)
    container = msg.guaranteed(sandbox, "work", cpus=cpus)
    container.annotations.update(annotations)
    return runtime.call("CreateContainer", msg.create(sandbox, container),
                        api.CreateContainerResponse)


def test_a_gpu_named_in_a_cdi_annotation_pulls_the_cpus_to_its_node(scratch):
    # Alone, a 1-CPU container goes to node 0 (the first that fits); its CDI GPU sits on node 1.
    [plain, by_uuid, by_index, everything] = _serve(scratch, "2.1.9+unknown", lambda rt: [
        _create(rt, "plain", {}),
        _create(rt, "uuid", {"cdi.k8s.io/nvidia-device-plugin_GPU-1":
                             f"nvidia.com/gpu={GPU_ON_NODE_1}"}),
        _create(rt, "index", {"cdi.k8s.io/x": "nvidia.com/gpu=0"}),
        _create(rt, "all", {"cdi.k8s.io/x": "nvidia.com/gpu=all"})])
    assert not parse_list(plain.adjust.linux.resources.cpu.cpus) & NODE_1_CPUS
    for reply in (by_uuid, by_index):
        cpu = reply.adjust.linux.resources.cpu
        assert parse_list(cpu.cpus) <= NODE_1_CPUS and cpu.mems == ""  # memory left alone
        assert not reply.adjust.CDI_devices and not reply.adjust.linux.devices  # hints only
    assert not parse_list(everything.adjust.linux.resources.cpu.cpus) & NODE_1_CPUS  # "all": no hint


@pytest.mark.parametrize("version, by_cdi", [("2.1.9+unknown", True), ("1.7.24~ds1", False)])
def test_a_gpu_asked_for_goes_by_cdi_name_where_the_runtime_applies_it(scratch, version, by_cdi):
    _nvidia_spec(scratch / "run-cdi")
    [reply] = _serve(scratch, version, lambda rt: [
        _create(rt, "asks", {"numa.nri.io/devices": "nvidia.com/gpu=1"})])
    adjust = reply.adjust
    assert parse_list(adjust.linux.resources.cpu.cpus) <= NODE_1_CPUS  # the GPU's node either way
    if by_cdi:
        assert [c.name for c in adjust.CDI_devices] == [f"nvidia.com/gpu={GPU_ON_NODE_1}"]
        assert not adjust.linux.devices and not adjust.env
    else:
        assert not adjust.CDI_devices
        assert [(n.path, n.major, n.minor) for n in adjust.linux.devices] == [
            ("/dev/nvidia0", 195, 0)]
        assert [(e.key, e.value) for e in adjust.env] == [("NVIDIA_VISIBLE_DEVICES",
                                                         GPU_ON_NODE_1)]


def test_without_a_spec_auto_gives_nodes_and_cdi_refuses(scratch):
    [auto] = _serve(scratch, "2.1.9", lambda rt: [
        _create(rt, "asks", {"numa.nri.io/devices": "nvidia.com/gpu=1"})])
    assert not auto.adjust.CDI_devices and auto.adjust.linux.devices
    failures: list[str] = []

    def refused(rt: FakeRuntime) -> list[api.CreateContainerResponse]:
        try:
            _create(rt, "asks", {"numa.nri.io/devices": "nvidia.com/gpu=1"})
        except Exception as e:  # CallFailed: the runtime sees the plugin's error
            failures.append(str(e))
        return []

    (scratch / "state" / "checkpoint.json").unlink()
    _serve(scratch, "2.1.9", refused, injection="cdi")
    [failure] = failures
    assert f"GPU {GPU_ON_NODE_1}" in failure and "no CDI device in" in failure
    assert "device injection is cdi" in failure

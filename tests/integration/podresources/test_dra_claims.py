"""DRA claims from the kubelet's PodResources (``dynamic_resources``), served by the fake kubelet
on a real unix socket: a claim's device is found through the CDI spec its driver wrote (the
DeviceLocator's CDI names, the same resolution as for ``cdi.k8s.io`` annotations), and the
plugin puts the container's CPUs on that device's NUMA node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.nri.plugin import NumaPlugin
from nri_numa.podresources.fake_server import FakeKubelet
from nri_numa.podresources.fake_state import state_from_mapping
from nri_numa.podresources.source import KubeletDeviceHints
from nri_numa.runtime import DeviceLocator
from nri_numa.runtime.cdi import CdiRegistry
from tests import nri_messages as msg
from tests.integration.nri.plugin_env import CONFIG, create, machine
from tests.tmpfs import fast_tmp

DRIVER = "gpu.example.com"


def claims_state(device: str) -> dict:
    return {"pods": [{"namespace": "ml", "name": "trainer", "containers": [
        {"name": "main", "claims": [{"name": "gpu", "devices": [
            {"driver": DRIVER, "pool": "node-a", "device": device,
             "cdi": [f"{DRIVER}/gpu={device}"]}]}]}]}]}


def spec_dir(folder: Path) -> Path:
    """The driver's CDI spec: gpu-a is /dev/nvidia0, the machine's GPU (minor 0, NUMA node 1);
    gpu-b a node the machine has no GPU for."""
    folder.mkdir()
    (folder / "dra-gpus.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": f"{DRIVER}/gpu", "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [
                {"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor}]}}
            for name, minor in (("gpu-a", 0), ("gpu-b", 9))]}))
    return folder


@contextmanager
def kubelet_with_claim(folder: Path, device: str
                       ) -> Iterator[tuple[KubeletDeviceHints, DeviceLocator]]:
    """The fake kubelet reporting the claim of ``device``, and a hint source asking it that
    resolves CDI names through the driver's spec."""
    topology = machine()
    locator = DeviceLocator(topology, cdi=CdiRegistry([spec_dir(folder / "cdi")]))
    with fast_tmp(folder) as base, FakeKubelet(base / "kubelet.sock",
                                               state_from_mapping(claims_state(device))) as k:
        yield KubeletDeviceHints(str(k.socket_path), topology, budget_s=10.0,
                                 cdi_nodes=locator.cdi_numa_nodes), locator


def test_a_claims_cdi_names_lead_to_its_devices_numa_node(tmp_path: Path) -> None:
    with kubelet_with_claim(tmp_path, "gpu-a") as (hints, locator):
        assert hints("ml", "trainer", "main") == {DRIVER: frozenset({1})}
        plugin = NumaPlugin(machine(), config_from_mapping(CONFIG), kubelet_hints=hints,
                            locator=locator)
        sandbox = msg.pod("trainer", namespace="ml")
        reply = create(plugin, sandbox, msg.guaranteed(sandbox, "main", cpus=2))
        assert reply.adjust.linux.resources.cpu.cpus == "4-5"  # node 1, beside the GPU


def test_a_claim_the_machine_cannot_place_gives_no_hint(tmp_path: Path) -> None:
    with kubelet_with_claim(tmp_path, "gpu-b") as (hints, _):
        assert hints("ml", "trainer", "main") == {}

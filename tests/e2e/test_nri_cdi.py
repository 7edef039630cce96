"""CDI on real containerd 1.7.24 and 2.1.9 with runc: GPUs given by CDI name, and CDI names as
NUMA hints.

The private containerd runs with CDI on (``enable_cdi``) and one spec dir of its own, holding a
spec for the fake GPU of tests/e2e/test_nri_devices.py (UUID ``GPU_UUID``, minor 7, on the
exclusive CPU's node of the same synthetic topology). Its one device node, ``/dev/nvidia7`` in
the container, has ``hostPath`` a node mknod'ed with /dev/null's numbers (1:3), so runc can
create it and the container can write to it; its edits also set ``NRI_NUMA_E2E_CDI=applied``.

* **Given by CDI name** (``--device-injection auto``): the plugin reads Configure's runtime
  version. On 2.1.9 it sends ``nvidia.com/gpu=<uuid>`` in ``ContainerAdjustment.CDI_devices``
  and no node: what proves containerd applied the CDI name is the container's spec holding the
  spec file's own edits (the 1:3 node from ``hostPath``, the env), while the plugin's dev root
  is empty (raw nodes would be 195:7) and ``NVIDIA_VISIBLE_DEVICES`` is absent. On 1.7.24
  ``auto`` picks device nodes: 195:7 and ``NVIDIA_VISIBLE_DEVICES``, no CDI edits.
* **A hint**: a container whose CRI annotations name the GPU (``cdi.k8s.io/...``, as a device
  plugin writes them) gets it from containerd's own CDI injection; the node it arrives with
  (1:3, not NVIDIA's major) says nothing about the GPU, so only the annotation can pull the
  container's CPUs: admitted on the GPU's node, refused (TopologyAffinityError) when the
  topology puts the GPU on the other node.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from tests.e2e.harness.cgroups import CgroupLayout
from tests.e2e.harness.containerd import ContainerdDaemon
from tests.e2e.harness.cri import CriClient, Pod
from tests.e2e.harness.image import BuiltImage, import_image
from tests.e2e.harness.runtimes import RUNTIME_VERSIONS, Runtimes
from tests.e2e.harness.timing import StepTimes
from tests.e2e.nri_agent import (GUARANTEED_1, Agent, agent_on, cgroup_cpus, spec_cpus,
                                 start_and_connect)
from tests.e2e.test_nri_devices import (EXCLUSIVE_CPU_NODE, GPU_MINOR, GPU_UUID, OTHER_NODE,
                                        AnnotatedPod, spec_of, vm_on_two_nodes)

pytestmark = pytest.mark.e2e
GPU_NODE = f"/dev/nvidia{GPU_MINOR}"
CDI_NAME = f"nvidia.com/gpu={GPU_UUID}"
CDI_ENV = "NRI_NUMA_E2E_CDI=applied"


def write_spec(folder: Path, host_node: Path) -> None:
    folder.mkdir(parents=True)
    os.mknod(host_node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (folder / "fake-gpu.json").write_text(json.dumps({
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": GPU_UUID, "containerEdits": {
            "deviceNodes": [{"path": GPU_NODE, "hostPath": str(host_node)}],
            "env": [CDI_ENV]}}]}))


@contextmanager
def containerd_with_cdi(version: str, runtimes: Runtimes, busybox_image: BuiltImage,
                        step_times: StepTimes, tmp_path_factory: pytest.TempPathFactory,
                        write_specs: Callable[[Path], None]) -> Iterator[ContainerdDaemon]:
    """As conftest's containerd, with CDI on and a spec dir of its own, filled by
    ``write_specs(folder)`` (the spec dir is ``folder / "cdi"``) before containerd starts, so
    that its CDI cache watches it from the start."""
    base = Path(tempfile.mkdtemp(prefix=f"nri-numa-e2e-cdi-{version}-",
                                 dir=os.environ.get("NRI_NUMA_E2E_TMP", "/tmp")))
    log = tmp_path_factory.mktemp("containerd-logs") / f"containerd-cdi-{version}.log"
    write_specs(base)
    daemon = ContainerdDaemon(runtimes.containerd[version], base, busybox_image.ref, log=log,
                              cdi_spec_dirs=(str(base / "cdi"),))
    try:
        step_times.add(version, "containerd start (CDI on)", daemon.start())
        import_image(daemon.binaries.ctr, daemon.address, busybox_image)
        yield daemon
    finally:
        problems = daemon.cleanup()
        assert not problems, f"containerd {version} clean-up left: {problems}"


@pytest.fixture(scope="module", params=RUNTIME_VERSIONS)
def containerd(request: pytest.FixtureRequest, runtimes: Runtimes, busybox_image: BuiltImage,
               step_times: StepTimes,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdDaemon]:
    with containerd_with_cdi(request.param, runtimes, busybox_image, step_times,
                             tmp_path_factory,
                             lambda base: write_spec(base / "cdi", base / "fake-nvidia7")) as made:
        yield made


@contextmanager
def cdi_agent(containerd: ContainerdDaemon, tmp_path: Path, gpu_node: int) -> Iterator[Agent]:
    """An agent on this VM's CPUs with the fake GPU on ``gpu_node``, started and connected."""
    dev = Path(tempfile.mkdtemp(prefix="dev-", dir=tmp_path))  # empty: raw nodes would be 195:7
    assert containerd.cdi_spec_dirs is not None
    with agent_on(containerd.paths.nri_socket, tmp_path, vm_on_two_nodes(gpu_node), (
            "--dev-root", str(dev), "--device-injection", "auto",
            "--cdi-spec-dirs", ",".join(containerd.cdi_spec_dirs))) as agent:
        start_and_connect(containerd, agent)
        yield agent


def test_a_gpu_goes_by_cdi_name_where_containerd_applies_it(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        cgroup_layout: CgroupLayout, tmp_path: Path) -> None:
    by_cdi = containerd.binaries.major >= 2
    with cdi_agent(containerd, tmp_path, EXCLUSIVE_CPU_NODE) as agent:
        pod = AnnotatedPod("cdi-gpu", (GUARANTEED_1,),
                           annotations={"numa.nri.io/devices.work": "nvidia.com/gpu=1"})
        sandbox = cri_client.run_pod(pod)
        container = cri_client.create_container(
            sandbox, pod.container_config("work", busybox_image.ref))
        spec = spec_of(cri_client, container)
        [given] = [d for d in spec["linux"]["devices"] if d["path"] == GPU_NODE]
        env = spec["process"]["env"]
        log = agent.log_text()
        if by_cdi:
            assert "device injection auto: containerd 2.1.9" in log and "applies CDI" in log
            assert f"devices by CDI name: {CDI_NAME}" in log
            assert (given["type"], given["major"], given["minor"]) == ("c", 1, 3)  # hostPath's
            assert CDI_ENV in env
            assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in env)
        else:
            assert "is not known to apply CDI devices" in log and "devices by CDI name" not in log
            assert (given["type"], given["major"], given["minor"]) == ("c", 195, GPU_MINOR)
            assert f"NVIDIA_VISIBLE_DEVICES={GPU_UUID}" in env and CDI_ENV not in env
        assert spec_cpus(cri_client, container) == {1}
        cri_client.start_container(container)
        assert cgroup_cpus(cri_client, cgroup_layout, container) == {1}
        seen = cri_client.exec_sync(container, ["sh", "-c", f"ls -l {GPU_NODE}; env"])
        assert seen.exit_code == 0, seen.stderr
        numbers = "1, +3" if by_cdi else f"195, +{GPU_MINOR}"
        assert re.search(rf"^c.* {numbers} .*{GPU_NODE}$", seen.stdout, re.M), seen.stdout
        assert (CDI_ENV in seen.stdout.splitlines()) is by_cdi
        if by_cdi:  # the CDI node is /dev/null's: usable in the container
            wrote = cri_client.exec_sync(container, ["sh", "-c", f"echo x > {GPU_NODE}"])
            assert wrote.exit_code == 0, wrote.stderr


@pytest.mark.parametrize("gpu_node", [EXCLUSIVE_CPU_NODE, OTHER_NODE])
def test_a_gpu_named_in_a_cdi_annotation_steers_the_cpus(
        containerd: ContainerdDaemon, cri_client: CriClient, busybox_image: BuiltImage,
        tmp_path: Path, gpu_node: int) -> None:
    with cdi_agent(containerd, tmp_path, gpu_node):
        pod = Pod("cdi-hint", (GUARANTEED_1,))
        sandbox = cri_client.run_pod(pod)
        config = pod.container_config("work", busybox_image.ref)
        config.annotations["cdi.k8s.io/nvidia-device-plugin_GPU-0"] = CDI_NAME
        if gpu_node != EXCLUSIVE_CPU_NODE:
            with pytest.raises(grpc.RpcError) as refused:
                cri_client.create_container(sandbox, config)
            assert "TopologyAffinityError" in refused.value.details()
            return
        container = cri_client.create_container(sandbox, config)
        spec = spec_of(cri_client, container)
        # containerd itself injected it (its CRI CDI support), with the hostPath's numbers.
        assert {(d["path"], d["major"], d["minor"]) for d in spec["linux"]["devices"]} >= {
            (GPU_NODE, 1, 3)}
        assert CDI_ENV in spec["process"]["env"]
        assert spec_cpus(cri_client, container) == {1}
        assert not spec["linux"]["resources"]["cpu"].get("mems")  # no Memory Manager: left alone

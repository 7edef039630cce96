"""A test-only CRI client (runtime.v1 over gRPC) and the pod/container configs a kubelet with the
cgroupfs driver would send. Only what the e2e tests need; never shipped in the package."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from enum import Enum

import grpc

from tests.e2e.cri import api_pb2 as cri
from tests.e2e.cri import api_pb2_grpc as cri_grpc

CALL_TIMEOUT_S = 30.0
CFS_PERIOD_US = 100_000  # the kubelet's quotaPeriod
MIN_SHARES = 2
MIN_QUOTA_US = 1_000
# kubelet pkg/kubelet/qos/policy.go
GUARANTEED_OOM_SCORE_ADJ = -997
BESTEFFORT_OOM_SCORE_ADJ = 1000


class QoS(Enum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


@dataclass(frozen=True)
class Resources:
    """A container's requests and limits in the kubelet's units: millicores and bytes."""

    cpu_request_m: int = 0
    cpu_limit_m: int = 0
    memory_request: int = 0
    memory_limit: int = 0

    @property
    def is_empty(self) -> bool:
        return not (self.cpu_request_m or self.cpu_limit_m or self.memory_request or self.memory_limit)

    @property
    def is_guaranteed(self) -> bool:
        return (
            self.cpu_limit_m > 0 and self.memory_limit > 0
            and self.cpu_request_m in (0, self.cpu_limit_m) and self.memory_request in (0, self.memory_limit)
        )


def qos_class(containers: list[Resources]) -> QoS:
    """The pod's QoS class from its containers' resources (requests default to limits)."""
    if all(r.is_empty for r in containers):
        return QoS.BESTEFFORT
    if all(r.is_guaranteed for r in containers):
        return QoS.GUARANTEED
    return QoS.BURSTABLE


def cgroup_parent(qos: QoS, pod_uid: str, driver: str = "cgroupfs") -> str:
    """The pod cgroup the kubelet makes; its path is how NRI plugins tell the QoS. cgroupfs:
    ``/kubepods[/burstable|/besteffort]/pod<uid>``; systemd: the slice's unit name,
    ``kubepods[-burstable|-besteffort]-pod<uid>.slice`` with the uid's dashes as underscores
    (a dash nests slices), which the kubelet hands CRI as it is."""
    if driver == "systemd":
        qos_part = "" if qos is QoS.GUARANTEED else f"-{qos.value}"
        return f"kubepods{qos_part}-pod{pod_uid.replace('-', '_')}.slice"
    if driver != "cgroupfs":
        raise ValueError(f"cgroup driver {driver!r}: cgroupfs or systemd")
    if qos is QoS.GUARANTEED:
        return f"/kubepods/pod{pod_uid}"
    return f"/kubepods/{qos.value}/pod{pod_uid}"


def cpu_shares(resources: Resources) -> int:
    """MilliCPUToShares of the request, or of the limit when only a limit is set."""
    millis = resources.cpu_request_m or resources.cpu_limit_m
    return max(MIN_SHARES, millis * 1024 // 1000)


def cpu_quota(resources: Resources) -> int:
    """milliCPUToQuota: 0 (no quota) without a limit, never under 1 ms per period."""
    if resources.cpu_limit_m == 0:
        return 0
    return max(MIN_QUOTA_US, resources.cpu_limit_m * CFS_PERIOD_US // 1000)


def oom_score_adj(qos: QoS, resources: Resources, memory_capacity: int) -> int:
    if qos is QoS.GUARANTEED:
        return GUARANTEED_OOM_SCORE_ADJ
    if qos is QoS.BESTEFFORT:
        return BESTEFFORT_OOM_SCORE_ADJ
    memory_request = resources.memory_request or resources.memory_limit
    adj = 1000 - (1000 * memory_request) // memory_capacity
    return min(max(adj, 1000 + GUARANTEED_OOM_SCORE_ADJ), BESTEFFORT_OOM_SCORE_ADJ - 1)


def memory_capacity() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemTotal")


def linux_resources(resources: Resources, qos: QoS) -> cri.LinuxContainerResources:
    return cri.LinuxContainerResources(
        cpu_period=CFS_PERIOD_US,
        cpu_quota=cpu_quota(resources),
        cpu_shares=cpu_shares(resources),
        memory_limit_in_bytes=resources.memory_limit,
        oom_score_adj=oom_score_adj(qos, resources, memory_capacity()),
    )


def pod_resources(containers: list[Resources]) -> Resources:
    """The pod-level sum the kubelet puts in LinuxPodSandboxConfig.resources."""
    return Resources(
        cpu_request_m=sum(r.cpu_request_m or r.cpu_limit_m for r in containers),
        cpu_limit_m=sum(r.cpu_limit_m for r in containers) if all(r.cpu_limit_m for r in containers) else 0,
        memory_request=sum(r.memory_request or r.memory_limit for r in containers),
        memory_limit=sum(r.memory_limit for r in containers) if all(r.memory_limit for r in containers) else 0,
    )


# hostNetwork (no CNI here), a PID namespace per container and a shared IPC namespace: the
# kubelet's defaults apart from the network.
def namespace_options() -> cri.NamespaceOption:
    return cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)


@dataclass(frozen=True)
class Pod:
    """A pod as the kubelet would describe it; `containers` are the resources of each container."""

    name: str
    containers: tuple[Resources, ...] = (Resources(),)
    namespace: str = "default"
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    cgroup_driver: str = "cgroupfs"  # the kubelet's: cgroupfs or systemd
    annotations: tuple[tuple[str, str], ...] = ()  # the pod's, besides the kubelet's own

    @property
    def qos(self) -> QoS:
        return qos_class(list(self.containers))

    @property
    def cgroup_parent(self) -> str:
        return cgroup_parent(self.qos, self.uid, self.cgroup_driver)

    @property
    def labels(self) -> dict[str, str]:
        return {
            "io.kubernetes.pod.name": self.name,
            "io.kubernetes.pod.namespace": self.namespace,
            "io.kubernetes.pod.uid": self.uid,
        }

    def sandbox_config(self) -> cri.PodSandboxConfig:
        # A host-network sandbox must not set a hostname: runc refuses one without a private UTS namespace.
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=self.name, uid=self.uid, namespace=self.namespace, attempt=0),
            labels=self.labels,
            annotations={"kubernetes.io/config.source": "api", **dict(self.annotations)},
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=cri.LinuxSandboxSecurityContext(namespace_options=namespace_options()),
                resources=linux_resources(pod_resources(list(self.containers)), self.qos),
            ),
        )

    def container_config(self, name: str, image: str, index: int = 0,
                         command: list[str] | None = None) -> cri.ContainerConfig:
        return cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name, attempt=0),
            image=cri.ImageSpec(image=image),
            command=command or [],
            labels={**self.labels, "io.kubernetes.container.name": name},
            linux=cri.LinuxContainerConfig(
                resources=linux_resources(self.containers[index], self.qos),
                security_context=cri.LinuxContainerSecurityContext(namespace_options=namespace_options()),
            ),
        )


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str


class CriClient:
    """The RuntimeService and ImageService calls the tests use, each with a deadline. Pods run
    through `run_pod` are remembered so that `remove_all` can clean up after a test."""

    def __init__(self, socket_path: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket_path}")
        self.runtime = cri_grpc.RuntimeServiceStub(self.channel)
        self.images = cri_grpc.ImageServiceStub(self.channel)
        self.timeout_s = timeout_s
        self.pods: dict[str, Pod] = {}  # sandbox id -> pod
        self.cgroup_parents: set[str] = set()  # of every pod run, for the cgroup clean-up after a test

    def close(self) -> None:
        self.channel.close()

    def _kw(self) -> dict[str, object]:
        return {"timeout": self.timeout_s, "wait_for_ready": True}

    def version(self) -> cri.VersionResponse:
        return self.runtime.Version(cri.VersionRequest(version="v1"), **self._kw())

    def status(self) -> cri.StatusResponse:
        return self.runtime.Status(cri.StatusRequest(), **self._kw())

    def image_status(self, ref: str) -> cri.ImageStatusResponse:
        return self.images.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image=ref)), **self._kw())

    def run_pod(self, pod: Pod) -> str:
        sandbox_id = self.runtime.RunPodSandbox(
            cri.RunPodSandboxRequest(config=pod.sandbox_config()), **self._kw()).pod_sandbox_id
        self.pods[sandbox_id] = pod
        self.cgroup_parents.add(pod.cgroup_parent)
        return sandbox_id

    def stop_pod(self, sandbox_id: str) -> None:
        self.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), **self._kw())

    def remove_pod(self, sandbox_id: str) -> None:
        self.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), **self._kw())
        self.pods.pop(sandbox_id, None)

    def list_pods(self) -> list[cri.PodSandbox]:
        return list(self.runtime.ListPodSandbox(cri.ListPodSandboxRequest(), **self._kw()).items)

    def create_container(self, sandbox_id: str, config: cri.ContainerConfig) -> str:
        request = cri.CreateContainerRequest(
            pod_sandbox_id=sandbox_id, config=config, sandbox_config=self.pods[sandbox_id].sandbox_config())
        return self.runtime.CreateContainer(request, **self._kw()).container_id

    def start_container(self, container_id: str) -> None:
        self.runtime.StartContainer(cri.StartContainerRequest(container_id=container_id), **self._kw())

    def stop_container(self, container_id: str, timeout_s: int = 0) -> None:
        self.runtime.StopContainer(
            cri.StopContainerRequest(container_id=container_id, timeout=timeout_s), **self._kw())

    def remove_container(self, container_id: str) -> None:
        self.runtime.RemoveContainer(cri.RemoveContainerRequest(container_id=container_id), **self._kw())

    def list_containers(self, sandbox_id: str = "") -> list[cri.Container]:
        request = cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=sandbox_id))
        return list(self.runtime.ListContainers(request, **self._kw()).containers)

    def container_status(self, container_id: str, verbose: bool = False) -> cri.ContainerStatusResponse:
        return self.runtime.ContainerStatus(
            cri.ContainerStatusRequest(container_id=container_id, verbose=verbose), **self._kw())

    def container_info(self, container_id: str) -> dict[str, object]:
        """The runtime's verbose info ("pid", "runtimeSpec", ...), parsed from its JSON."""
        info = self.container_status(container_id, verbose=True).info
        if "info" not in info:
            raise RuntimeError(f"ContainerStatus of {container_id} has no verbose info: {sorted(info)}")
        return json.loads(info["info"])

    def exec_sync(self, container_id: str, cmd: list[str], timeout_s: int = 10) -> ExecResult:
        response = self.runtime.ExecSync(
            cri.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout_s), **self._kw())
        return ExecResult(response.exit_code, response.stdout.decode(), response.stderr.decode())

    def update_container_resources(self, container_id: str, linux: cri.LinuxContainerResources) -> None:
        self.runtime.UpdateContainerResources(
            cri.UpdateContainerResourcesRequest(container_id=container_id, linux=linux), **self._kw())

    def run_container(self, sandbox_id: str, config: cri.ContainerConfig) -> str:
        container_id = self.create_container(sandbox_id, config)
        self.start_container(container_id)
        return container_id

    def remove_all(self) -> list[str]:
        """Stops and removes every pod this client ran (containers go with their pod); returns errors."""
        errors = []
        for sandbox_id in list(self.pods):
            try:
                self.stop_pod(sandbox_id)
                self.remove_pod(sandbox_id)
            except grpc.RpcError as exc:
                errors.append(f"{sandbox_id}: {exc.code().name} {exc.details()}")
        return errors

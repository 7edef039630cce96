"""NRI messages built as containerd 1.7 builds them from what the kubelet sends (cgroupfs driver
unless told otherwise): docs/nri-plugin.md, "What the kubelet sends"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nri_numa.nri.pb import api_pb2 as api

PERIOD = 100_000


def cgroup_parent(uid: str, qos: str, driver: str = "cgroupfs") -> str:
    """The kubelet's pod cgroup for ``qos`` in guaranteed | burstable | besteffort."""
    if driver == "systemd":
        infix = "" if qos == "guaranteed" else f"-{qos}"
        return f"kubepods{infix}-pod{uid.replace('-', '_')}.slice"
    middle = "" if qos == "guaranteed" else f"/{qos}"
    return f"/kubepods{middle}/pod{uid}"


def pod(name: str, qos: str = "guaranteed", *, namespace: str = "default",
        uid: str | None = None, annotations: Mapping[str, str] | None = None,
        driver: str = "cgroupfs", parent: str | None = None) -> api.PodSandbox:
    uid = uid or f"uid-{name}"
    sandbox = api.PodSandbox(
        id=f"sb-{name}", name=name, uid=uid, namespace=namespace,
        labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                "io.kubernetes.pod.uid": uid},
        annotations=dict(annotations or {}))
    sandbox.linux.cgroup_parent = cgroup_parent(uid, qos, driver) if parent is None else parent
    return sandbox


def container(sandbox: api.PodSandbox, name: str, *, cpu: int = 0, cpu_limit: int = 0,
              memory: int = 0, hugepages: Mapping[str, int] | None = None,
              devices: Sequence[tuple[str, str, int, int]] = (), env: Sequence[str] = (),
              cpus: str = "", mems: str = "", state: int = api.CONTAINER_UNKNOWN,
              pid: int = 0, cid: str | None = None) -> api.Container:
    """``cpu``/``cpu_limit`` in millicores, ``memory`` (the limit) in bytes, as the kubelet
    turns them into shares, quota and period."""
    c = api.Container(id=cid or f"ctr-{sandbox.name}-{name}", pod_sandbox_id=sandbox.id,
                      name=name, state=state, pid=pid, env=list(env),
                      labels={"io.kubernetes.container.name": name,
                              "io.kubernetes.pod.name": sandbox.name,
                              "io.kubernetes.pod.namespace": sandbox.namespace,
                              "io.kubernetes.pod.uid": sandbox.uid})
    resources = c.linux.resources
    resources.cpu.shares.value = max(2, cpu * 1024 // 1000)
    resources.cpu.period.value = PERIOD
    if cpu_limit:
        resources.cpu.quota.value = cpu_limit * PERIOD // 1000
    if memory:
        resources.memory.limit.value = memory
    for size, limit in (hugepages or {}).items():
        resources.hugepage_limits.add(page_size=size, limit=limit)
    resources.cpu.cpus = cpus
    resources.cpu.mems = mems
    for path, kind, major, minor in devices:
        c.linux.devices.add(path=path, type=kind, major=major, minor=minor)
    return c


def guaranteed(sandbox: api.PodSandbox, name: str, cpus: int, memory: int = 1 << 30,
               **more) -> api.Container:
    """A container of a Guaranteed pod asking for ``cpus`` whole CPUs."""
    return container(sandbox, name, cpu=cpus * 1000, cpu_limit=cpus * 1000, memory=memory,
                     **more)


def create(sandbox: api.PodSandbox, c: api.Container) -> api.CreateContainerRequest:
    return api.CreateContainerRequest(pod=sandbox, container=c)


def event(kind: int, sandbox: api.PodSandbox,
          c: api.Container | None = None) -> api.StateChangeEvent:
    e = api.StateChangeEvent(event=kind, pod=sandbox)
    if c is not None:
        e.container.CopyFrom(c)
    return e

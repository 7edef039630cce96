"""NRI messages ⇄ the runtime layer, the engine's requests and its placements.

Inbound: ``PodSandbox`` and ``Container`` (NRI v0.6.1, docs/nri-protocol.md §8) become the
runtime-neutral ``RuntimePod``/``RuntimeContainer``, and a container its pod's record and the
engine's request (``RequestReader``). The request carries the NUMA nodes of the devices the
container already has (its device nodes, ``NVIDIA_VISIBLE_DEVICES``, CDI names: DeviceLocator)
and of those the kubelet gave it (PodResources); the kubelet's word wins, as it chose them. The
pod's request is the pod as far as the plugin knows it: its managed containers in creation
order, then this one; with the NUMA nodes the scheduler extender chose for it, when its
annotation names some of this machine's. Outbound: a ``Placement`` (with the
``Grant`` of its devices) becomes the ``ContainerAdjustment`` of the container being created,
and a cpuset for any other container becomes a ``ContainerUpdate``. cpus and mems travel in
cpuset list syntax; an empty string would mean "leave alone", so an unknown value is simply not
set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from nri_numa.engine.annotations import AnnotationError
from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.devices import Resource
from nri_numa.engine.request import ContainerRequest, PodRequest
from nri_numa.nri import decision_log
from nri_numa.nri.decision_log import describe
from nri_numa.nri.pb import api_pb2 as api
from nri_numa.nri.session import PluginError
from nri_numa.nri.whole_pod import PodSpec, SandboxTotals, pod_for_admission
from nri_numa.runtime import (DeviceLocator, container_request, pod_identity, pod_qos,
                              pod_request, requested_devices, with_scheduled_numa)
from nri_numa.runtime.container import (RuntimeContainer, RuntimeInputError, RuntimePod,
                                        read_container)
from nri_numa.runtime.device_grant import DEVICE_ACCESS, Grant
from nri_numa.safeio.bounds import clip
from nri_numa.state.plugin_records import PodRecord, Records
from nri_numa.topology.cpulist import format_cached

# Containers in these states hold (or are about to hold) CPUs. UNKNOWN is kept: freeing CPUs
# a container may still run on is worse than keeping them a little longer.
LIVE_STATES = frozenset({api.CONTAINER_UNKNOWN, api.CONTAINER_CREATED, api.CONTAINER_PAUSED,
                         api.CONTAINER_RUNNING})

# The events the plugin handles; CreateContainer, UpdateContainer and StopContainer have their
# own methods, the others arrive as StateChange.
HANDLED_EVENTS = (api.RUN_POD_SANDBOX, api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX,
                  api.CREATE_CONTAINER, api.POST_START_CONTAINER, api.UPDATE_CONTAINER,
                  api.STOP_CONTAINER, api.REMOVE_CONTAINER)


def event_mask(events: Iterable[int]) -> int:
    """The ConfigureResponse subscription: bit (event − 1) per event."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


EVENT_MASK = event_mask(HANDLED_EVENTS)


def runtime_pod(pod: api.PodSandbox) -> RuntimePod:
    """Raises RuntimeInputError naming the bad field."""
    return RuntimePod(id=pod.id, uid=pod.uid, name=pod.name, namespace=pod.namespace,
                      cgroup_parent=pod.linux.cgroup_parent,
                      annotations=dict(pod.annotations), labels=dict(pod.labels))


def runtime_container(container: api.Container, pod: RuntimePod) -> RuntimeContainer:
    """Raises RuntimeInputError naming the container and the bad field."""
    linux = container.linux
    cpu, memory = linux.resources.cpu, linux.resources.memory
    return read_container(
        container.id, container.name, pod,
        cpu_shares=cpu.shares.value if cpu.HasField("shares") else None,
        cpu_quota=cpu.quota.value if cpu.HasField("quota") else None,
        cpu_period=cpu.period.value if cpu.HasField("period") else None,
        memory_limit=memory.limit.value if memory.HasField("limit") else None,
        hugepage_limits=[(h.page_size, h.limit) for h in linux.resources.hugepage_limits],
        devices=[(d.path, d.type, d.major, d.minor) for d in linux.devices],
        env=container.env, annotations=dict(container.annotations),
        labels=dict(container.labels), cpus=cpu.cpus, mems=cpu.mems)


def container_of(pod: api.PodSandbox, container: api.Container) -> RuntimeContainer:
    """``runtime_container`` for a handler: PluginError naming the container when it cannot
    be read."""
    try:
        return runtime_container(container, runtime_pod(pod))
    except RuntimeInputError as e:
        raise PluginError(f"nri-numa: cannot read container {clip(container.id)}: "
                          f"{e}") from None


def is_live(container: api.Container) -> bool:
    return container.state in LIVE_STATES


def creation_order_key(container: api.Container) -> tuple[bool, int]:
    """NRI v0.6.1 gives no creation time. Process ids grow with time (until they wrap), and a
    container not started yet (pid 0) came last: the best order the message allows."""
    return (container.pid == 0, container.pid)


def live_containers(req: api.SynchronizeRequest,
                    ) -> tuple[list[RuntimeContainer], set[str], list[str]]:
    """The live containers of a Synchronize in creation order; the ids of every live one
    (readable or not: an unreadable container still holds its CPUs); one line per problem."""
    pods: dict[str, RuntimePod] = {}
    problems = []
    for p in req.pods:
        try:
            pods[p.id] = runtime_pod(p)
        except RuntimeInputError as e:
            problems.append(f"pod {clip(p.id)} skipped: {e}")
    live = sorted((c for c in req.containers if is_live(c)), key=creation_order_key)
    readable = []
    for c in live:
        if c.pod_sandbox_id not in pods:
            problems.append(f"container {clip(c.id)} skipped: its pod {clip(c.pod_sandbox_id)} "
                            "is unknown")
            continue
        try:
            readable.append(runtime_container(c, pods[c.pod_sandbox_id]))
        except RuntimeInputError as e:
            problems.append(f"container {clip(c.id)} skipped: {e}")
    return readable, {c.id for c in live}, problems


# (namespace, pod, container) → the kubelet's devices' NUMA nodes (PodResources API).
KubeletHints = Callable[[str, str, str], dict[str, frozenset[int]]]


@dataclass(frozen=True, slots=True)
class ToAdmit:
    """A container being created, as the ledger is asked to admit it."""

    pod: PodRecord
    request: ContainerRequest
    pod_request: PodRequest  # its pod as far as known, ``request`` among its containers
    known_from: str  # where the whole pod was known from (nri_numa.nri.whole_pod)


class RequestReader:
    """A container → its pod's record and the engine's request, with the NUMA nodes of the
    devices it has (``DeviceLocator``) and of those the kubelet gave it (``KubeletHints``)."""

    def __init__(self, locator: DeviceLocator, kubelet_hints: KubeletHints) -> None:
        self._locator = locator
        self._kubelet_hints = kubelet_hints

    def read(self, container: RuntimeContainer, records: Records
             ) -> tuple[PodRecord, ContainerRequest]:
        """The container's pod (now recorded) and request; an older container of the same
        name in that pod is forgotten, as it has exited."""
        uid, namespace, name = pod_identity(container.pod)
        hints = {**self._locator.numa_hints(container),
                 **self._kubelet_hints(namespace, name, container.name)}
        request = container_request(container, pod_qos(container.pod), hints)
        pod = records.pod(PodRecord(container.pod.id, uid, namespace, name,
                                    container.pod.cgroup_parent, container.pod.annotations))
        records.forget_stale(pod, request.name, container.id)
        return pod, request

    def admission(self, container: RuntimeContainer, records: Records,
                  sandbox: SandboxTotals | None, spec: PodSpec | None) -> ToAdmit:
        """What the ledger is asked to admit for a container being created: ``read``'s pod
        and request, with the devices it asks for by annotation, in its pod as whole as the
        sandbox (``sandbox``) and the API server (``spec``) tell, with the NUMA nodes the
        scheduler chose. PluginError (logged as refused) when its devices annotation cannot
        be read."""
        pod, request = self.read(container, records)
        ctx = records.ledger.ctx
        request = _with_requested_devices(ctx, container, pod, request)
        whole, known_from = pod_for_admission(
            container.pod, records.known_requests(container.pod.id, request.name), request,
            sandbox, spec)
        return ToAdmit(pod, request, _with_scheduled_numa(ctx, pod, request.name, whole),
                       known_from)

    def held_devices(self, container: RuntimeContainer,
                     resources: Mapping[str, Resource]) -> dict[str, frozenset[str]]:
        """The container's devices that are devices of ``resources``, by resource."""
        return self._locator.held_devices(container, resources)


def pod_as_known(records: Records, container: RuntimeContainer,
                 request: ContainerRequest) -> PodRequest:
    """The container's pod as far as it is known: its managed containers, then ``request``."""
    known = records.known_requests(container.pod.id, request.name)
    return pod_request(container.pod, [*known, request])


def _with_requested_devices(ctx: EngineContext, container: RuntimeContainer, pod: PodRecord,
                           request: ContainerRequest) -> ContainerRequest:
    """The request plus the devices of the container's own ``numa.nri.io/devices`` (the pod's
    ``numa.nri.io/devices.<container>`` is the engine's, docs/devices.md)."""
    try:
        devices = requested_devices(container, ctx.devices, ctx.device_classes)
    except AnnotationError as e:
        decision_log.refused(pod, request.name, container.id, None, "InvalidAnnotation", None,
                             f"InvalidAnnotation: {e}")
        raise PluginError(f"nri-numa: InvalidAnnotation: {describe(pod, request.name)}: "
                          f"{e}") from None
    return replace(request, devices=devices) if devices else request


def _with_scheduled_numa(ctx: EngineContext, pod: PodRecord, container: str,
                        request: PodRequest) -> PodRequest:
    """The pod with the NUMA nodes the scheduler chose as ``preferred_numa``; a value that
    cannot be read is one warning line and no preference."""
    request, problem = with_scheduled_numa(request, (n.id for n in ctx.topology.numa_nodes))
    if problem is not None:
        decision_log.log.warning("%s: %s", describe(pod, container), problem)
    return request


def cpuset_resources(cpus: frozenset[int], mems: frozenset[int] | None) -> api.LinuxResources:
    resources = api.LinuxResources()
    if cpus:
        resources.cpu.cpus = format_cached(cpus)
    if mems:
        resources.cpu.mems = format_cached(mems)
    return resources


def adjustment(placement: Placement, grant: Grant | None = None) -> api.ContainerAdjustment:
    """The changes to the container being created: its cpuset (exclusive CPUs or the shared
    pool), when the engine chose them its memory nodes, and the devices it was given
    (``grant``): their nodes in ``linux.devices``, an allow rule for each in
    ``linux.resources.devices``, their environment (``NVIDIA_VISIBLE_DEVICES``), and the CDI
    names the runtime is to inject in ``CDI_devices`` (NRI v0.7+)."""
    adjust = api.ContainerAdjustment()
    adjust.linux.resources.CopyFrom(cpuset_resources(placement.cpus, placement.mems))
    if grant:
        add_devices(adjust, grant)
    return adjust


def add_devices(adjust: api.ContainerAdjustment, grant: Grant) -> None:
    for node in grant.nodes:
        device = adjust.linux.devices.add(path=node.path, type=node.type, major=node.major,
                                          minor=node.minor)
        device.file_mode.value = node.file_mode
        device.uid.value = node.uid
        device.gid.value = node.gid
        adjust.linux.resources.devices.add(allow=True, type=node.type, access=DEVICE_ACCESS)
        rule = adjust.linux.resources.devices[-1]
        rule.major.value = node.major
        rule.minor.value = node.minor
    for key, value in sorted(grant.env.items()):
        adjust.env.add(key=key, value=value)
    for name in grant.cdi_devices:
        adjust.CDI_devices.add(name=name)


def shared_updates(records: Records, skip: str | None = None) -> list[api.ContainerUpdate]:
    """When the pool moved since the shared containers were last sent it: the new pool for
    every shared container the plugin manages (but ``skip``, whose own answer carries it)."""
    wire = shared_updates_wire(records, 1, skip)
    return list(api.UpdateContainersRequest.FromString(wire).update) if wire else []


def shared_updates_wire(records: Records, field: int, skip: str | None = None) -> bytes:
    """``shared_updates`` as the protobuf encoding of a repeated ``ContainerUpdate`` field
    number ``field``, for a reply to parse in one call: a thousand shared containers are a
    thousand updates, not to be built one message at a time."""
    pool = records.pool_moved()
    if pool is None:
        return b""
    return updates_wire(field, records.containers.shared_ids, pool, skip)


def updates_wire(field: int, container_ids: Iterable[str], cpus: frozenset[int],
                 skip: str | None = None) -> bytes:
    """The protobuf encoding of field ``field`` of a message, a repeated ``ContainerUpdate``
    moving each of ``container_ids`` but ``skip`` onto ``cpus`` (as ``cpuset_update`` would),
    for the message to parse in one call instead of a thousand built one at a time. Each element
    is its length-delimited ``ContainerUpdate``: field 1 (``container_id``), then the rest, the
    same for all, as ``cpuset_update`` serializes it without an id."""
    rest = cpuset_update("", cpus).SerializeToString()  # an empty id is not written
    tag = bytes([field << 3 | 2])

    def head(n: int) -> bytes:  # the element's tag and length, and the id's, for an n-byte id
        id_field = b"\x0a" + _varint(n)
        return tag + _varint(len(id_field) + n + len(rest)) + id_field

    raws = [container_id.encode() for container_id in container_ids if container_id != skip]
    if not raws:
        return b""
    n = len(raws[0])
    if all(len(raw) == n for raw in raws):  # as runtimes make them: one join, in C
        first = head(n)
        return first + (rest + first).join(raws) + rest
    heads: dict[int, bytes] = {}
    parts: list[bytes] = []
    for raw in raws:
        known = heads.get(len(raw))
        if known is None:
            known = heads[len(raw)] = head(len(raw))
        parts += (known, raw, rest)
    return b"".join(parts)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def cpuset_update(container_id: str, cpus: frozenset[int], mems: frozenset[int] | None = None,
                  *, ignore_failure: bool = True) -> api.ContainerUpdate:
    """A new cpuset for an existing container. ``ignore_failure`` by default: the container
    may be exiting while the runtime applies it, which must not fail the event that asked."""
    update = api.ContainerUpdate(container_id=container_id, ignore_failure=ignore_failure)
    update.linux.resources.CopyFrom(cpuset_resources(cpus, mems))
    return update

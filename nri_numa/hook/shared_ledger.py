"""The ledger every hook process shares, and one transaction on it.

Each runtime event is a separate, short-lived process, and two containers may be created at the
same moment. A transaction therefore runs entirely under the state folder's lock file (a
separate file that is never replaced: locking the checkpoint itself would lock an inode that the
atomic rename swaps away; docs/oci-hook.md, "The shared ledger, and locking"): load the checkpoint, drop what dead containers
held, decide, write cgroups, save atomically, unlock.

The checkpoint is the plugin's format (``nri_numa.state.checkpoint``): the ledger, the pod and
container records, and, for the hook, a process table. It says which process each container is
(pid + start time, so a reused pid is not mistaken for the container) and which cgroup it was
placed in. A container placed by podman's precreate stage has no process yet: its entry waits
for the createRuntime hook to claim it, and is dropped after ``PENDING_GRACE_S`` otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from nri_numa.engine.context import EngineContext
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import ContainerRequest, RequestError
from nri_numa.hook.annotations import engine_annotations
from nri_numa.runtime.container import RuntimeContainer, RuntimePod
from nri_numa.runtime.to_request import (container_request, pod_identity, pod_qos, pod_request,
                                         stale_choice, with_scheduled_numa)
from nri_numa.state.ledger import Ledger, LedgerError
from nri_numa.state.plugin_records import (ContainerRecord, PodRecord, RecordError,
                                           records_from_dict, records_to_dict)

log = logging.getLogger("nri_numa.hook")

if TYPE_CHECKING:
    from nri_numa.runtime.device_locator import DeviceLocator
    from nri_numa.state.encoding import LedgerEncoder, RecordsEncoder

PENDING_GRACE_S = 120.0  # precreate → createRuntime is well under a second; this is generous
PROCESSES_KEY = "processes"


class StateError(Exception):
    """The shared state cannot be used as it is; the message says what to do."""


class Refused(Exception):
    """The engine (or the hook) will not place this container; the message is the reason."""


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """Which process a placed container is, and where its cgroup is."""

    pid: int | None  # None: placed by precreate, the container does not exist yet
    start: int | None  # the process's start time (clock ticks after boot)
    cgroup: str | None  # the cpuset cgroup path, as /proc/PID/cgroup gave it
    since: float  # when the entry was made (seconds since the epoch)

    @property
    def pending(self) -> bool:
        return self.pid is None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "cgroup": self.cgroup, "since": self.since}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> ProcessRecord:
        if not isinstance(raw, dict):
            raise RecordError(f"{where} must be an object")
        pid, start, cgroup, since = (raw.get(k) for k in ("pid", "start", "cgroup", "since"))
        for name, value in (("pid", pid), ("start", start)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RecordError(f"{where}.{name} must be an integer or null, not {value!r}")
        if (pid is None) != (start is None):
            raise RecordError(f"{where}: pid and start go together")
        if cgroup is not None and not isinstance(cgroup, str):
            raise RecordError(f"{where}.cgroup must be a string or null")
        if isinstance(since, bool) or not isinstance(since, (int, float)):
            raise RecordError(f"{where}.since must be a number, not {since!r}")
        return cls(pid, start, cgroup, float(since))


@dataclass(frozen=True, slots=True)
class Move:
    """A shared container whose cpuset must follow the shared pool."""

    id: str
    old: frozenset[int]
    new: frozenset[int]

    @property
    def must_leave(self) -> frozenset[int]:
        """CPUs it runs on that are no longer shared: leaving it there breaks exclusivity."""
        return self.old - self.new


class SharedLedger:
    """The loaded state of one transaction. Only ``load``/``to_payload`` touch its form."""

    def __init__(self, ctx: EngineContext, locator: DeviceLocator, ledger: Ledger | None = None,
                 pods: Mapping[str, PodRecord] | None = None,
                 containers: Mapping[str, ContainerRecord] | None = None,
                 processes: Mapping[str, ProcessRecord] | None = None) -> None:
        self.ctx = ctx
        self._locator = locator
        self._ledger = ledger or Ledger(ctx)
        self._pods = dict(pods or {})
        self._containers = dict(containers or {})  # by container id, in placement order
        self._processes = dict(processes or {})

    @classmethod
    def load(cls, ctx: EngineContext, locator: DeviceLocator,
             payload: Mapping[str, Any] | None) -> SharedLedger:
        """From a checkpoint payload (None: a fresh start); StateError when it does not fit."""
        if payload is None:
            return cls(ctx, locator)
        if PROCESSES_KEY not in payload:
            raise StateError("the state folder holds the NRI plugin's checkpoint (nri-numa run): "
                             "give the hook a --state-dir of its own")
        try:
            ledger = Ledger.restore(ctx, payload.get("ledger"))
            pods, containers = records_from_dict(payload.get("records"))
            raw = payload[PROCESSES_KEY]
            if not isinstance(raw, dict):
                raise RecordError(f"{PROCESSES_KEY} must be an object")
            processes = {cid: ProcessRecord.from_dict(p, f"{PROCESSES_KEY}[{cid!r}]")
                         for cid, p in raw.items()}
            if set(containers) != set(processes):
                odd = sorted(set(containers) ^ set(processes))
                raise RecordError(f"containers and process entries differ: {', '.join(odd)}")
        except (LedgerError, RecordError) as e:
            raise StateError(f"the hook's state does not fit this machine and configuration "
                             f"({e}); restore the configuration it was written with, or remove "
                             "the checkpoint once no container placed by the hook runs") from None
        return cls(ctx, locator, ledger, pods, containers, processes)

    def to_payload(self, ledger_json: LedgerEncoder | None = None,
                   records_json: RecordsEncoder | None = None) -> dict[str, Any]:
        """The checkpoint's payload. The encoders (the hook daemon's, kept between runs) give
        the ledger and the records as canonical JSON already, each member encoded again only
        when it changed: the same bytes. The records' encoder writes the pool for every shared
        container, so it is used only while every shared record holds the pool, as after
        ``shared_moves`` (a claimed container skipped there may hold an older pool)."""
        processes = {cid: p.to_dict() for cid, p in self._processes.items()}
        shared = self.shared
        if ledger_json is None or records_json is None or any(
                not r.exclusive and r.cpus != shared for r in self._containers.values()):
            return {"ledger": self._ledger.to_dict(),
                    "records": records_to_dict(self._pods, self._containers),
                    PROCESSES_KEY: processes}
        return {"ledger": ledger_json.encode(self._ledger),
                "records": records_json.encode(self._pods, self._containers, shared),
                PROCESSES_KEY: processes}

    # --- views ------------------------------------------------------------------------------

    @property
    def shared(self) -> frozenset[int]:
        return self._ledger.allocations.shared

    @property
    def containers(self) -> dict[str, ContainerRecord]:
        return dict(self._containers)

    def record(self, cid: str) -> ContainerRecord | None:
        return self._containers.get(cid)

    def process(self, cid: str) -> ProcessRecord | None:
        return self._processes.get(cid)

    def cpuset_of(self, record: ContainerRecord) -> frozenset[int]:
        """Where a placed container belongs now: its own CPUs, or the shared pool."""
        return record.cpus if record.exclusive else self.shared

    # --- changes ----------------------------------------------------------------------------

    def collect_garbage(self, running: Callable[[ProcessRecord], bool], now: float,
                        keep: Iterable[str] = ()) -> list[str]:
        """Release every container whose process is gone (or, placed by precreate, that was
        never created in time), except those in ``keep``. Returns their ids."""
        def gone(p: ProcessRecord) -> bool:
            return now - p.since > PENDING_GRACE_S if p.pending else not running(p)

        kept = set(keep)
        dead = [cid for cid, p in self._processes.items() if cid not in kept and gone(p)]
        for cid in dead:
            self.release(cid)
        return dead

    def admit(self, container: RuntimeContainer,
              devices: Mapping[str, int] | None = None) -> Placement:
        """Place a new container; Refused with the engine's one-line reason."""
        uid, namespace, name = pod_identity(container.pod)
        pod = PodRecord(container.pod.id, uid, namespace, name, container.pod.cgroup_parent,
                        engine_annotations(container.pod.annotations))
        request = container_request(container, pod_qos(container.pod),
                                    self._locator.numa_hints(container))
        where = describe(pod, request.name)
        if devices:
            request = self._with_devices(request, devices, where)
        self._forget_stale(pod, request.name, container.id)
        known = [c.request for c in self._containers.values()
                 if c.sandbox_id == pod.sandbox_id and c.name != request.name]
        runtime_pod = RuntimePod(id=pod.sandbox_id, uid=pod.uid, name=pod.name,
                                 namespace=pod.namespace, cgroup_parent=pod.cgroup_parent,
                                 annotations=pod.annotations)
        asked, problem = with_scheduled_numa(pod_request(runtime_pod, [*known, request]),
                                             (n.id for n in self._ledger.ctx.topology.numa_nodes))
        if problem is not None:
            log.warning("%s: %s", where, problem)
        try:
            result = self._ledger.admit(asked, [request.name])
        except (RequestError, ValueError) as e:
            raise Refused(f"{where}: {e}") from None
        if (chosen := result.decision.preferred_numa) is not None and not chosen.honoured:
            log.warning("%s: %s", where, stale_choice(chosen))
        rejection = result.decision.rejection
        if rejection is not None:
            text = rejection.message
            raise Refused(text if text.startswith(rejection.reason)
                          else f"{rejection.reason}: {text}")
        placement = result.decision.placements[0]
        self._pods[pod.sandbox_id] = pod
        self._containers[container.id] = ContainerRecord(
            container.id, pod.sandbox_id, pod.uid, request, placement.cpus, placement.exclusive,
            placement.mems)
        return placement

    def attach(self, cid: str, process: ProcessRecord) -> None:
        if cid not in self._containers:
            raise KeyError(f"container {cid} is not placed")
        self._processes[cid] = process

    def release(self, cid: str) -> bool:
        """Give back what a container holds; False when it held nothing."""
        self._processes.pop(cid, None)
        record = self._containers.pop(cid, None)
        if record is None:
            return False
        if record.in_ledger:
            self._ledger.release(record.pod_uid, record.name)
        in_use = {c.sandbox_id for c in self._containers.values()}
        self._pods = {k: p for k, p in self._pods.items() if k in in_use}
        return True

    def shared_moves(self, skip: Iterable[str] = ()) -> list[Move]:
        """Every shared container not on the shared pool as it is now; their records are
        updated, the caller writes their cgroups."""
        shared, skipped = self.shared, set(skip)
        moves = []
        for record in list(self._containers.values()):
            if record.exclusive or record.id in skipped or record.cpus == shared:
                continue
            moves.append(Move(record.id, record.cpus, shared))
            self._containers[record.id] = replace(record, cpus=shared)
        return moves

    def _with_devices(self, request: ContainerRequest, devices: Mapping[str, int],
                      where: str) -> ContainerRequest:
        unknown = sorted(set(devices) - set(self.ctx.devices))
        if unknown:
            offered = ", ".join(sorted(self.ctx.devices)) or "none"
            raise Refused(f"{where}: {', '.join(unknown)} is not a device resource of this node "
                          f"(it has: {offered})")
        return replace(request, devices=dict(devices))

    def _forget_stale(self, pod: PodRecord, name: str, cid: str) -> None:
        # A pod runs one container per name: an older one of that name has exited.
        for stale in [c.id for c in self._containers.values()
                      if c.sandbox_id == pod.sandbox_id and c.name == name and c.id != cid]:
            self.release(stale)


def describe(pod: PodRecord, container: str) -> str:
    if pod.sandbox_id == pod.uid == pod.name:
        return f"container {container}"  # outside Kubernetes: a pod of its own
    return f"pod {pod.namespace}/{pod.name} container {container}"

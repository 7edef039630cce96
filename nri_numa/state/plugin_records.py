"""The NRI plugin's records: what it knows between events besides the ledger, and how they
change, roll back and are written.

``PodRecord`` and ``ContainerRecord`` are the second half of a checkpoint's payload
(nri_numa.state.checkpoint; the OCI hook's shared ledger writes them too). A container record
keeps what the engine's request for it needs and its exclusive CPUs; a shared container runs on
the shared pool, which moves whenever an exclusive container comes or goes, and its record
holds no CPUs (``ON_THE_POOL``): ``Records.cpus_of`` gives the CPUs either kind runs on.

``Records`` holds the ledger and the record tables, changed together. The tables
(``TrackedDict``, ``ContainerTable``) note what an event changed, so that the journal writes
only that and a refused event is undone at the cost of its own changes, never at the cost of
the whole table: ``changed`` is what the journal has not written yet (cleared after each
write); an ``Undo`` holds what one event overwrote. A deletion inside an event (a container
restarted under a new id, a rare event) copies the table once, since only a copy keeps the
order the containers were created in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.decision import Placement
from nri_numa.engine.request import ContainerRequest, RequestError
from nri_numa.state.ledger import Ledger
from nri_numa.topology.cpulist import ListFormatError, format_cached, parse_list

# --- what the plugin remembers besides the ledger ----------------------------------------


class RecordError(ValueError):
    """A record in a checkpoint payload that cannot be read; the message names it."""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod the plugin placed containers of: what the engine's request needs of it."""

    sandbox_id: str
    uid: str
    namespace: str
    name: str
    cgroup_parent: str = ""  # tells the QoS class under the kubelet
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotations", MappingProxyType(dict(self.annotations)))

    def to_dict(self) -> dict[str, Any]:
        return {"sandbox_id": self.sandbox_id, "uid": self.uid, "namespace": self.namespace,
                "name": self.name, "cgroup_parent": self.cgroup_parent,
                "annotations": dict(self.annotations)}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> PodRecord:
        d = _obj(raw, where)
        return cls(_str(d, "sandbox_id", where), _str(d, "uid", where),
                   _str(d, "namespace", where), _str(d, "name", where),
                   _str(d, "cgroup_parent", where),
                   _str_map(d.get("annotations", {}), f"{where}.annotations"))


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """A container the plugin manages: the engine's request for it, and its exclusive CPUs.
    A shared container runs on the shared pool: the NRI plugin's record of it holds no CPUs
    (``ON_THE_POOL``) and its checkpoint writes the pool as its cpus; the
    hook's ledger keeps the pool it last wrote there. ``in_ledger`` is False for a running
    container that did not fit when adopted: it only follows the shared pool (the ledger may
    still hold the devices it had)."""

    id: str
    sandbox_id: str
    pod_uid: str
    request: ContainerRequest
    cpus: frozenset[int]
    exclusive: bool
    mems: frozenset[int] | None = None
    in_ledger: bool = True

    @property
    def name(self) -> str:
        return self.request.name

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {"id": self.id, "sandbox_id": self.sandbox_id, "pod_uid": self.pod_uid,
                "cpus": format_cached(self.cpus), "exclusive": self.exclusive,
                "mems": None if self.mems is None else format_cached(self.mems),
                "in_ledger": self.in_ledger,
                "request": {"name": r.name, "cpu_request": r.cpu_request,
                            "cpu_limit": r.cpu_limit, "memory_request": r.memory_request,
                            "memory_limit": r.memory_limit,
                            "hugepages": {str(k): v for k, v in r.hugepages_limits.items()},
                            "device_numa_hints": {k: sorted(v) for k, v in
                                                  r.device_numa_hints.items()},
                            **({} if r.isolated_cpus is None
                               else {"isolated_cpus": r.isolated_cpus})}}

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> ContainerRecord:
        d = _obj(raw, where)
        r = _obj(d.get("request"), f"{where}.request")
        try:
            pages = {int(k): v for k, v in _obj(r.get("hugepages", {}),
                                                f"{where}.request.hugepages").items()}
            request = ContainerRequest(
                name=r.get("name"), cpu_request=r.get("cpu_request"), cpu_limit=r.get("cpu_limit"),
                memory_request=r.get("memory_request"), memory_limit=r.get("memory_limit"),
                hugepages_requests=pages, hugepages_limits=pages,
                device_numa_hints=_obj(r.get("device_numa_hints", {}),
                                       f"{where}.request.device_numa_hints"),
                isolated_cpus=r.get("isolated_cpus"))
            mems = d.get("mems")
            return cls(_str(d, "id", where), _str(d, "sandbox_id", where),
                       _str(d, "pod_uid", where), request, parse_list(_str(d, "cpus", where)),
                       _bool(d, "exclusive", where),
                       None if mems is None else parse_list(_str(d, "mems", where)),
                       _bool(d, "in_ledger", where))
        except RecordError:
            raise
        except (RequestError, ListFormatError, ValueError, TypeError) as e:
            raise RecordError(f"{where}: {e}") from None


def records_to_dict(pods: Mapping[str, PodRecord],
                    containers: Mapping[str, ContainerRecord]) -> dict[str, Any]:
    """Pods by sandbox id, containers by id; lists keep the containers' creation order."""
    return {"pods": [p.to_dict() for p in pods.values()],
            "containers": [c.to_dict() for c in containers.values()]}


def records_from_dict(raw: Any) -> tuple[dict[str, PodRecord], dict[str, ContainerRecord]]:
    """The records of ``records_to_dict``, each read field by field: an error names it."""
    d = _obj(raw, "records")
    pods = [PodRecord.from_dict(p, f"pods[{i}]") for i, p in enumerate(_list(d, "pods"))]
    containers = [ContainerRecord.from_dict(c, f"containers[{i}]")
                  for i, c in enumerate(_list(d, "containers"))]
    return {p.sandbox_id: p for p in pods}, {c.id: c for c in containers}


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecordError(f"{where} must be an object, not {type(value).__name__}")
    return value


def _list(d: dict, key: str) -> list:
    if not isinstance(d.get(key), list):
        raise RecordError(f"{key} must be a list")
    return d[key]


def _str(d: dict, key: str, where: str) -> str:
    if not isinstance(d.get(key), str):
        raise RecordError(f"{where}.{key} must be a string, not {d.get(key)!r}")
    return d[key]


def _bool(d: dict, key: str, where: str) -> bool:
    if not isinstance(d.get(key), bool):
        raise RecordError(f"{where}.{key} must be true or false, not {d.get(key)!r}")
    return d[key]


def _str_map(value: Any, where: str) -> dict[str, str]:
    m = _obj(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise RecordError(f"{where} must map strings to strings")
    return m


# --- the tables -------------------------------------------------------------------------


_ABSENT = object()


@dataclass
class Undo:
    """What an event overwrote in one table: each key's value before it (``_ABSENT`` for a
    key it added), the journal's pending changes as they were, and the whole table when the
    event deleted a key."""

    old: dict[str, Any] = field(default_factory=dict)
    changed: dict[str, bool] = field(default_factory=dict)
    whole: dict[str, Any] | None = None


class TrackedDict(dict):
    """A dict that notes the keys changed since the journal last wrote it (``changed``, in the
    order the changes leave the dict in): an event's record holds those keys only. A key maps
    to True when it was deleted at some point (replay then deletes before setting it, so that
    it lands at the end, as here). Between ``begin`` and the next ``begin`` it also keeps what
    ``roll_back`` needs."""

    __slots__ = ("changed", "_undo")

    def __init__(self, items: Mapping | None = None) -> None:
        super().__init__(items or {})
        self.changed: dict[str, bool] = {}
        self._undo: Undo | None = None

    def begin(self) -> Undo:
        """Start keeping what changes, for ``roll_back``."""
        self._undo = Undo(changed=dict(self.changed))
        return self._undo

    def roll_back(self, undo: Undo) -> None:
        """Back to the table as it was at ``begin``."""
        self._undo = None
        if undo.whole is not None:
            self._restore_whole(undo.whole)
        else:  # no key was deleted: every key is where it was, only values to put back
            for key, old in undo.old.items():
                if old is _ABSENT:
                    self._remove(key)
                else:
                    self._put(key, old)
        self.changed = undo.changed

    def __setitem__(self, key: str, value: Any) -> None:
        undo = self._undo
        if undo is not None and key not in undo.old:
            undo.old[key] = dict.get(self, key, _ABSENT)
        if key in self:
            self.changed.setdefault(key, False)
        else:  # lands at the end: so does its change
            self.changed[key] = self.changed.pop(key, False)
        self._put(key, value)

    def __delitem__(self, key: str) -> None:
        self._keep_order()
        self._remove(key)
        self.changed.pop(key, None)
        self.changed[key] = True

    def _keep_order(self) -> None:
        """Before a change that putting values back would not undo in place (a deletion):
        the table as it was at ``begin``, whole, for ``roll_back``."""
        undo = self._undo
        if undo is None or undo.whole is not None:
            return
        whole = dict(self)
        for key, old in undo.old.items():  # no key was deleted yet: all are in their places
            if old is _ABSENT:
                del whole[key]
            else:
                whole[key] = old
        undo.whole = whole

    def pop(self, key: str, *default: Any) -> Any:  # type: ignore[override]
        if key in self:
            value = dict.__getitem__(self, key)
            del self[key]
            return value
        return dict.pop(self, key, *default)

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def _refused(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("change a TrackedDict key by key: the journal must see every change")

    update = setdefault = popitem = _refused  # type: ignore[assignment]

    # The table's own changes, which subclasses extend with their indexes.

    def _put(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)

    def _remove(self, key: str) -> None:
        dict.__delitem__(self, key)

    def _restore_whole(self, whole: dict[str, Any]) -> None:
        dict.clear(self)
        for key, value in whole.items():
            dict.__setitem__(self, key, value)


class ContainerTable(TrackedDict):
    """The container records by id, indexed by sandbox and by pod uid (creation order within
    each), the shared ones by id, and those not in the ledger by id (``unplaced_ids``: adopted
    when they did not fit), so that an event looks at its own pod's containers only, a move of
    the pool at the shared containers only, and a promotion pass (nri_numa.nri.promotion) at
    the unplaced ones only — nothing at all when there are none."""

    __slots__ = ("by_sandbox", "by_uid", "shared_ids", "unplaced_ids")

    def __init__(self, items: Mapping[str, ContainerRecord] | None = None) -> None:
        super().__init__(items)
        self._reindex()

    def of_sandbox(self, sandbox_id: str) -> list[ContainerRecord]:
        return [self[i] for i in self.by_sandbox.get(sandbox_id, ())]

    def _put(self, key: str, value: ContainerRecord) -> None:
        old = self.get(key)
        if old is not None:
            if (old.sandbox_id, old.pod_uid) == (value.sandbox_id, value.pod_uid):
                # Its place in its pod's order stays (a resize, a promotion); only the kind
                # indexes follow a change of kind.
                dict.__setitem__(self, key, value)
                if (old.exclusive, old.in_ledger) != (value.exclusive, value.in_ledger):
                    self._keep_order()  # the kind indexes change order: a roll back rebuilds
                    self._unindex_kind(old)
                    self._index_kind(value)
                return
            self._keep_order()  # its indexes change order: a roll back rebuilds them
            self._unindex(old)
        dict.__setitem__(self, key, value)
        self._index(value)

    def _remove(self, key: str) -> None:
        record = self[key]
        dict.__delitem__(self, key)
        self._unindex(record)

    def _restore_whole(self, whole: dict[str, Any]) -> None:
        super()._restore_whole(whole)
        self._reindex()

    def _reindex(self) -> None:
        self.by_sandbox: dict[str, dict[str, None]] = {}
        self.by_uid: dict[str, dict[str, None]] = {}
        self.shared_ids: dict[str, None] = {}
        self.unplaced_ids: dict[str, None] = {}
        for record in self.values():
            self._index(record)

    def _index(self, record: ContainerRecord) -> None:
        self.by_sandbox.setdefault(record.sandbox_id, {})[record.id] = None
        self.by_uid.setdefault(record.pod_uid, {})[record.id] = None
        self._index_kind(record)

    def _index_kind(self, record: ContainerRecord) -> None:
        if not record.exclusive:
            self.shared_ids[record.id] = None
        if not record.in_ledger:
            self.unplaced_ids[record.id] = None

    def _unindex_kind(self, record: ContainerRecord) -> None:
        self.shared_ids.pop(record.id, None)
        self.unplaced_ids.pop(record.id, None)

    def _unindex(self, record: ContainerRecord) -> None:
        self._unindex_kind(record)
        for index, key in ((self.by_sandbox, record.sandbox_id), (self.by_uid, record.pod_uid)):
            ids = index.get(key)
            if ids is not None:
                ids.pop(record.id, None)
                if not ids:
                    del index[key]


# --- the records and the ledger, changed together -----------------------------------------


# The CPUs a shared container's record holds: none of its own, it runs on the pool. The pool
# is not copied into every shared record (each would then change whenever it moves); the
# checkpoint writes the pool for them (nri_numa.state.encoding.RecordsEncoder).
ON_THE_POOL: frozenset[int] = frozenset()


def on_the_pool(containers: Mapping[str, ContainerRecord]) -> dict[str, ContainerRecord]:
    """Records read from a checkpoint, the shared ones holding no CPUs (``ON_THE_POOL``)."""
    return {key: replace(c, cpus=ON_THE_POOL) if not c.exclusive and c.cpus else c
            for key, c in containers.items()}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The records as they were, to go back to when an event does not commit: the tables
    keep what the event changes (``Undo``), so taking one costs nothing per
    container."""

    ledger: Ledger
    allocations: Allocations
    touched: frozenset[str]
    pods: Undo
    containers: Undo
    pool_sent: frozenset[int]


class Records:
    """The ledger and the records, changed in step: a record ``in_ledger`` has its allocation
    in the ledger; one that is not (adopted, it did not fit) may still hold there the devices it
    had (sync.adopt). Ledger entries no record explains are dropped when containers go.

    A shared container's record does not follow the pool: its CPUs are the pool, whatever
    ``cpus`` says (``cpus_of``). ``pool_sent`` is the pool the shared containers were last
    sent; when the pool moves, all of them are sent the new one (``pool_moved``)."""

    def __init__(self, ledger: Ledger, pods: Mapping[str, PodRecord] | None = None,
                 containers: Mapping[str, ContainerRecord] | None = None) -> None:
        self.ledger = ledger
        self.pods: TrackedDict = TrackedDict(pods)  # by sandbox id
        self.containers: ContainerTable = ContainerTable(containers)  # by id, creation order
        self.pool_sent = ledger.allocations.shared

    @property
    def shared(self) -> frozenset[int]:
        return self.ledger.allocations.shared

    def cpus_of(self, record: ContainerRecord) -> frozenset[int]:
        """The CPUs a managed container should run on now: its own, or the shared pool."""
        return record.cpus if record.exclusive else self.shared

    def snapshot(self) -> Snapshot:
        ledger = self.ledger
        return Snapshot(ledger, ledger.allocations, frozenset(ledger.touched), self.pods.begin(),
                        self.containers.begin(), self.pool_sent)

    def roll_back(self, snapshot: Snapshot) -> None:
        self.ledger = snapshot.ledger
        self.ledger.reset(snapshot.allocations, set(snapshot.touched))
        self.pods.roll_back(snapshot.pods)
        self.containers.roll_back(snapshot.containers)
        self.pool_sent = snapshot.pool_sent

    def saved(self) -> None:
        """The journal holds every change so far."""
        self.pods.changed.clear()
        self.containers.changed.clear()
        self.ledger.touched.clear()

    # --- what comes in ------------------------------------------------------------------------

    def pod(self, pod: PodRecord) -> PodRecord:
        """``pod`` recorded; the record already there when it is the same (its identity keeps
        its encoding in the checkpoint, state/encoding.py)."""
        known = self.pods.get(pod.sandbox_id)
        if known != pod:
            self.pods[pod.sandbox_id] = known = pod
        return known

    def known_requests(self, sandbox_id: str, but: str) -> list[ContainerRequest]:
        """The requests of the pod's containers but ``but``, in creation order."""
        return [c.request for c in self.containers.of_sandbox(sandbox_id) if c.name != but]

    def forget_stale(self, pod: PodRecord, name: str, container_id: str) -> None:
        # A pod runs one container per name: an older one of that name has exited (its stop
        # may have been missed while we were away), so what it held is free again.
        for stale in [c for c in self.containers.of_sandbox(pod.sandbox_id)
                      if c.name == name and c.id != container_id]:
            del self.containers[stale.id]
            self.ledger.release(stale.pod_uid, stale.name)  # a no-op where it holds nothing

    def remember(self, container_id: str, pod: PodRecord, request: ContainerRequest,
                 placement: Placement) -> None:
        self._replace(ContainerRecord(
            container_id, pod.sandbox_id, pod.uid, request,
            placement.cpus if placement.exclusive else ON_THE_POOL, placement.exclusive,
            placement.mems))

    def remember_unplaced(self, container_id: str, pod: PodRecord,
                          request: ContainerRequest) -> None:
        """A running container that did not fit: not placed, it follows the shared pool."""
        self._replace(ContainerRecord(
            container_id, pod.sandbox_id, pod.uid, request, ON_THE_POOL, exclusive=False,
            in_ledger=False))

    def _replace(self, record: ContainerRecord) -> None:
        """``record`` in; what an older record under its id (another pod's or name's, as only
        a confused runtime sends) held is released with it."""
        old = self.containers.get(record.id)
        self.containers[record.id] = record
        if old is not None and (old.pod_uid, old.name) != (record.pod_uid, record.name):
            self.drop_orphans((old.sandbox_id,), (old.pod_uid,))

    # --- what goes ----------------------------------------------------------------------------

    def in_sandbox(self, sandbox_id: str) -> list[str]:
        return list(self.containers.by_sandbox.get(sandbox_id, ()))

    def release(self, ids: Iterable[str]) -> list[ContainerRecord]:
        """The records of ``ids`` we had, gone with what they held, and their pods when empty."""
        released = [self.containers.pop(i) for i in ids if i in self.containers]
        for record in released:
            self.ledger.release(record.pod_uid, record.name)  # a no-op where it holds nothing
        if released:
            self.drop_orphans({r.sandbox_id for r in released}, {r.pod_uid for r in released})
        return released

    def drop_orphans(self, sandboxes: Iterable[str] | None = None,
                     uids: Iterable[str] | None = None) -> None:
        """Pods with no container left, and ledger entries no record explains; only among
        ``sandboxes`` and ``uids`` when given (those of the containers just released)."""
        index = self.containers
        for sandbox in list(self.pods) if sandboxes is None else sandboxes:
            if sandbox in self.pods and sandbox not in index.by_sandbox:
                del self.pods[sandbox]
        pods = self.ledger.allocations.pods
        for uid in list(pods) if uids is None else uids:
            held = pods.get(uid)
            if held is None:
                continue
            placed = {index[i].request.name for i in index.by_uid.get(uid, ())}
            for name in [n for n in held.containers if n not in placed]:
                self.ledger.release(uid, name)

    # --- cpusets ------------------------------------------------------------------------------

    def pool_moved(self) -> frozenset[int] | None:
        """The pool, when it moved since the shared containers were last sent it (they are
        to be sent it now: it counts as sent); None when it did not."""
        shared, sent = self.shared, self.pool_sent
        # ``is`` first: two equal frozensets compare member by member.
        if shared is sent or shared == sent:
            return None
        self.pool_sent = shared
        return shared

    def move(self, record: ContainerRecord, cpus: frozenset[int]) -> None:
        """An exclusive container's record, now on ``cpus``; a shared one follows the pool
        and keeps its record."""
        if record.exclusive and record.cpus != cpus:
            self.containers[record.id] = replace(record, cpus=cpus)

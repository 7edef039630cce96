"""The tables behind the plugin's records (nri_numa.nri.records): dicts that note what an event
changed, so that the journal writes only that and a refused event is undone at the cost of its
own changes, never at the cost of the whole table.

``changed`` is what the journal has not written yet (cleared after each write); an ``Undo``
holds what one event overwrote. A deletion inside an event (a container restarted under a new
id, a rare event) copies the table once, since only a copy keeps the order the containers were
created in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nri_numa.state.plugin_records import ContainerRecord

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

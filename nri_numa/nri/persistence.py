"""The plugin's checkpoint: each event's changes written before its answer, read back at
start-up.

An event's changes commit as one transaction: they are in memory and on disk when the runtime
hears the answer, or (the write failed, or the handler raised) they never happened. On disk
they are a snapshot and a journal (nri_numa.state.plugin_checkpoint): an event appends one
record holding only what it changed — the pods the ledger touched, the records that changed,
the pool's change — so its cost does not grow with the number of containers. When the journal
outgrows the snapshot, or when something cannot be written as a record (the ledger replaced by
a Synchronize or a new configuration, a failed write), the whole state is written as a new
snapshot instead; its parts are kept encoded until they change (state/encoding.py).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from nri_numa.engine.allocations import Allocations
from nri_numa.engine.context import EngineContext
from nri_numa.nri.decision_log import log
from nri_numa.nri.session import PluginError
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore
from nri_numa.state.encoding import (Encoded, LedgerEncoder, RecordsEncoder, canonical,
                                     journal_change)
from nri_numa.state.ledger import Ledger, LedgerError
from nri_numa.state.plugin_checkpoint import PluginCheckpoint
from nri_numa.state.plugin_records import RecordError, Records, on_the_pool, records_from_dict
from nri_numa.state.recorded_config import (PAYLOAD_KEY, RecordedConfig,
                                            checkpoint_config_matches)


def recorded(ctx: EngineContext) -> RecordedConfig:
    """The settings a checkpoint's placements depend on."""
    return RecordedConfig.of(ctx.config, ctx.reserved_cpus)


class StateFile:
    """The checkpoint of one plugin; with no store, nothing is written or read."""

    def __init__(self, store: CheckpointStore | None, ctx: EngineContext) -> None:
        self._store = store
        self._checkpoint = None if store is None else PluginCheckpoint(store)
        self._ledger_json, self._records_json = LedgerEncoder(), RecordsEncoder()
        # The ledger and its allocations as the journal holds them; None: write a snapshot.
        self._saved: tuple[Ledger, Allocations] | None = None
        self.configured(ctx)

    @property
    def where(self) -> str:
        """The checkpoint's path, for messages."""
        return str(self._store.path) if self._store is not None else "the plugin's state"

    def configured(self, ctx: EngineContext) -> None:
        """The settings to record from now on (written with the next snapshot, which the next
        change writes)."""
        self._config_json = Encoded(canonical(recorded(ctx).to_dict()))  # encoded once
        self._saved = None

    def save(self, records: Records) -> None:
        """CheckpointError when the state cannot be written; what was on disk is then whole,
        and the next save writes a snapshot."""
        checkpoint = self._checkpoint
        if checkpoint is None:
            return
        saved = self._saved
        change = (journal_change(records, saved[1])
                  if checkpoint.appendable and saved is not None and records.ledger is saved[0]
                  else None)
        if change is None:
            self._compact(records)
            return
        ops, shared = change
        if ops or shared is not None:
            try:
                checkpoint.append(ops, shared)
            except CheckpointError:
                self._saved = None
                raise
        self._mark_saved(records)
        if checkpoint.wants_compaction():
            try:
                self._compact(records)
            except CheckpointError as e:  # the event is in the journal: it stands
                log.warning("journal not compacted (tried again at the next change): %s", e)

    def _compact(self, records: Records) -> None:
        assert self._checkpoint is not None
        ledger = records.ledger
        try:
            self._checkpoint.compact({
                "ledger": self._ledger_json.encode(ledger),
                "records": self._records_json.encode(records.pods, records.containers,
                                                     ledger.allocations.shared),
                PAYLOAD_KEY: self._config_json})
        except CheckpointError:
            self._saved = None
            raise
        self._mark_saved(records)
        # The agent froze its start-up (nri_numa.nri.daemon): the state just written is
        # long-lived too. Elsewhere (tests, tools) nothing was frozen and nothing is.
        if gc.get_freeze_count():
            gc.freeze()

    def _mark_saved(self, records: Records) -> None:
        records.saved()
        self._saved = (records.ledger, records.ledger.allocations)

    @contextmanager
    def transaction(self, records: Records) -> Iterator[None]:
        """Everything inside commits and is written to disk, or none of it happened."""
        saved = records.snapshot()
        try:
            yield
            self.save(records)
        except BaseException as e:
            records.roll_back(saved)
            if isinstance(e, CheckpointError):
                raise PluginError(f"nri-numa: cannot save state, nothing changed: {e}") from None
            raise

    def restore(self, ctx: EngineContext) -> Records | None:
        """The records of a good checkpoint made under these settings; None when there is
        none, or it was set aside (with a warning naming why). A restored state is written
        again at once as a new snapshot: the journal starts empty, and a checkpoint in the
        single-file format of earlier versions is migrated."""
        checkpoint = self._checkpoint
        if checkpoint is None or (loaded := checkpoint.load()) is None:
            return None
        payload = loaded.payload
        assert self._store is not None
        try:
            pods, containers = records_from_dict(payload.get("records"))
            if not checkpoint_config_matches(self._store, payload, recorded(ctx),
                                             len(containers)):
                return None
            ledger = Ledger.restore(ctx, payload.get("ledger"))
            for c in containers.values():
                if c.in_ledger and ledger.allocations.container(c.pod_uid, c.name) is None:
                    raise RecordError(f"container {c.id} is not in the ledger")
        except (LedgerError, RecordError) as e:
            checkpoint.set_aside(str(e))
            return None
        log.info("restored %d containers from %s (%d journal records)", len(containers),
                 self._store.path, loaded.records)
        records = Records(ledger, pods, on_the_pool(containers))
        # Ledger entries no record explains, as an older agent's checkpoint may hold: swept
        # here once, since an event looks only at its own pods.
        records.drop_orphans()
        try:
            self._compact(records)
        except CheckpointError as e:
            log.warning("restored state not written again (the next change does): %s", e)
        return records

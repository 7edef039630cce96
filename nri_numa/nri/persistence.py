"""The plugin's checkpoint: its records written before every answer, read back at start-up.

An event's changes commit as one transaction: they are in memory and on disk when the runtime
hears the answer, or (the write failed, or the handler raised) they never happened. The
payload holds the ledger, the records and the configuration the placements were made under;
each part is kept encoded until it changes (state/encoding.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from nri_numa.engine.context import EngineContext
from nri_numa.nri.decision_log import log
from nri_numa.nri.records import Records
from nri_numa.nri.session import PluginError
from nri_numa.state.checkpoint import CheckpointError, CheckpointStore
from nri_numa.state.encoding import Encoded, LedgerEncoder, RecordsEncoder, canonical
from nri_numa.state.ledger import Ledger, LedgerError
from nri_numa.state.plugin_records import RecordError, records_from_dict
from nri_numa.state.recorded_config import (PAYLOAD_KEY, RecordedConfig,
                                            checkpoint_config_matches)


def recorded(ctx: EngineContext) -> RecordedConfig:
    """The settings a checkpoint's placements depend on."""
    return RecordedConfig.of(ctx.config, ctx.reserved_cpus)


class StateFile:
    """The checkpoint of one plugin; with no store, nothing is written or read."""

    def __init__(self, store: CheckpointStore | None, ctx: EngineContext) -> None:
        self._store = store
        self._ledger_json, self._records_json = LedgerEncoder(), RecordsEncoder()
        self.configured(ctx)

    @property
    def where(self) -> str:
        """The checkpoint's path, for messages."""
        return str(self._store.path) if self._store is not None else "the plugin's state"

    def configured(self, ctx: EngineContext) -> None:
        """The settings to record from now on."""
        self._config_json = Encoded(canonical(recorded(ctx).to_dict()))  # encoded once

    def save(self, records: Records) -> None:
        """CheckpointError when the file cannot be written; the old one is then whole."""
        if self._store is not None:
            self._store.save({"ledger": self._ledger_json.encode(records.ledger),
                              "records": self._records_json.encode(records.pods,
                                                                   records.containers),
                              PAYLOAD_KEY: self._config_json})

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
        none, or it was set aside (with a warning naming why)."""
        if self._store is None or (payload := self._store.load()) is None:
            return None
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
            self._store.set_aside(str(e))
            return None
        log.info("restored %d containers from %s", len(containers), self._store.path)
        return Records(ledger, pods, containers)

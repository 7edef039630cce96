"""Reading the configuration again while ``nri-numa run`` serves: on SIGHUP, and with
``--watch-config`` whenever the file is replaced or rewritten (its inode, size or mtime change).

What is safe to change live changes at once: the log's level, format and file, the metrics
address, and the engine settings that only shape later placements (policy options, pod
overrides, the reconcile period). A change to what placed containers hold (a policy, the
reserved CPUs) is refused while any are placed, with the drain message start-up gives, and the
agent keeps its whole old configuration; so is a file that does not read. Settings the running
agent cannot change (the NRI socket, the state dir...) are named as waiting for a restart.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from nri_numa.agent.settings import KEYS, AgentSettings, MetricsAddress
from nri_numa.engine.config import EngineConfig
from nri_numa.nri.session import PluginError

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # --watch-config: how often the file's identity is looked at
# AgentSettings fields applied without a restart.
LIVE_SETTINGS = frozenset({"log_level", "log_format", "log_file", "metrics_address"})
_KEY_NAMES = {key.field: key.name for key in KEYS}  # as the file names them


@dataclass(frozen=True, slots=True)
class Reread:
    """What a fresh read of the file (the command line's flags still winning) gives."""
    engine: EngineConfig
    settings: AgentSettings
    ignored_kubelet_keys: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LiveTargets:
    """Where the live settings go."""
    reload_engine: Callable[[EngineConfig, str], None]  # NumaPlugin.reload
    configure_logs: Callable[[str, str, Path | None], None]
    restart_metrics: Callable[[MetricsAddress | None], None]


class ConfigReloader:
    """Re-reads ``path`` on request (``requested``, set by the SIGHUP handler) or, with
    ``watch``, when the file changes; on its own thread."""

    def __init__(self, path: Path, reread: Callable[[], Reread], settings: AgentSettings,
                 targets: LiveTargets, requested: threading.Event, *, watch: bool = False,
                 poll: float = POLL_SECONDS) -> None:
        self._path = path
        self._reread = reread
        self._settings = settings
        self._targets = targets
        self._requested = requested
        self._watch = watch
        self._poll = poll
        self._stopping = threading.Event()
        # Taken now, not when the thread first runs: a change made between the start's read
        # and a late-scheduled thread would otherwise become the baseline and be missed.
        self._seen = _identity(path)
        self._thread = threading.Thread(target=self._serve, name="config-reload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        seen = self._seen
        while not self._stopping.is_set():
            if self._requested.wait(min(self._poll, 0.5)):
                self._requested.clear()
                seen = _identity(self._path)
                self.reload("SIGHUP")
            elif self._watch and (now := _identity(self._path)) != seen:
                seen = now
                self.reload("the file changed")

    def reload(self, reason: str) -> bool:
        """Read the file and apply it; False, with one error line, when it is refused."""
        try:
            fresh = self._reread()
        except ValueError as e:  # InputFileError, SettingsError: one line naming the problem
            return self._refused(reason, str(e))
        try:
            self._targets.reload_engine(fresh.engine, str(self._path))
        except PluginError as e:
            return self._refused(reason, str(e))
        old, new = self._settings, fresh.settings
        changed = {f.name for f in fields(AgentSettings)
                   if f.name != "given" and getattr(old, f.name) != getattr(new, f.name)}
        if changed & {"log_level", "log_format", "log_file"}:
            try:
                self._targets.configure_logs(new.log_level, new.log_format, new.log_file)
            except ValueError as e:  # LogSetupError: the old log goes on
                log.error("log settings not changed: %s", e)
                changed -= {"log_level", "log_format", "log_file"}
        if "metrics_address" in changed:
            try:
                self._targets.restart_metrics(new.metrics_address)
            except Exception as e:  # the agent goes on without metrics rather than stop
                log.error("metrics not moved to %s: %s", new.metrics_address or "off", e)
        waiting = sorted(changed - LIVE_SETTINGS)
        self._settings = AgentSettings(**{
            f.name: getattr(old if f.name in waiting else new, f.name)
            for f in fields(AgentSettings)})
        names = sorted(_KEY_NAMES[field] for field in waiting)
        log.info("configuration reloaded from %s (%s)%s", self._path, reason,
                 f"; {', '.join(names)} will change at the next start" if names else "")
        return True

    def _refused(self, reason: str, why: str) -> bool:
        log.error("configuration not reloaded from %s (%s), the agent keeps the one in use: %s",
                  self._path, reason, why)
        return False


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

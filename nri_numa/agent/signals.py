"""SIGTERM and SIGINT for ``nri-numa run``, from its first moment to its last.

Start-up reads the configuration, opens the log, discovers the machine, takes the state lock and
reads the checkpoint; any of these can take a while, and a damaged file could once block it
outright. A stop asked for meanwhile must end the process at once and cleanly, so until the
agent serves, the handler raises ``Stopped``: it unwinds whatever runs, a blocking call
included, through the ``finally`` blocks that release the lock. Once the agent serves, the
handler calls the stop it was given instead (close the session, let the handler under way
finish), since an exception raised there could land anywhere in the serving threads' set-up.

SIGHUP asks for the configuration to be read again (nri_numa.nri.config_reload). Its handler only
sets ``reload_requested``: the reading happens on the reloader's thread, never inside a handler,
and a SIGHUP during start-up (whose default action would end the process) is kept for then.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNAL = signal.SIGHUP


class Stopped(BaseException):
    """SIGTERM or SIGINT arrived before the agent served. A BaseException, so that no
    ``except Exception`` on the way swallows it; the message is the signal's name."""


class StopSignals:
    """The handlers, installed when made; ``restore`` puts the earlier ones back. Only the
    main thread may make one (Python runs signal handlers there)."""

    def __init__(self) -> None:
        self._stop: Callable[[], None] | None = None
        self.requested = False
        self._previous: dict[int, Any] = {}
        self.reload_requested = threading.Event()
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._previous[RELOAD_SIGNAL] = signal.signal(RELOAD_SIGNAL, self._on_reload)

    def serving(self, stop: Callable[[], None]) -> None:
        """From now on a signal calls ``stop`` instead of raising."""
        self._stop = stop

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_reload(self, signum: int, frame: FrameType | None) -> None:
        self.reload_requested.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self._stop is None:
            raise Stopped(signal.Signals(signum).name)
        self._stop()

"""The drift repair: the kubelet's reconcile loop for cpusets.

Anything that pushes a container's whole resource set (``runc update``, a systemd
daemon-reload, another agent) can undo the cpuset the plugin gave it. Every
``cpuManagerReconcilePeriod`` this thread asks the plugin which containers' cgroups disagree
with the ledger (NumaPlugin.reconcile) and hands their cpusets to the update sender, which
sends them as one unsolicited UpdateContainers. It checks only while a runtime is connected and
has synchronized: before that the ledger may not know what runs, and a Synchronize restores
every cpuset anyway.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from nri_numa.nri.pb import api_pb2 as api

log = logging.getLogger(__name__)


class DriftRepair:
    def __init__(self, reconcile: Callable[[], list[api.ContainerUpdate]],
                 send: Callable[[list[api.ContainerUpdate]], None],
                 connected: Callable[[], bool], period: Callable[[], float]) -> None:
        """``period``: read before each wait, so a configuration from the runtime applies."""
        self._reconcile = reconcile
        self._send = send
        self._connected = connected
        self._period = period
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="drift-repair", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def check_once(self) -> int:
        """One check; the number of containers whose cpuset was sent again."""
        if not self._connected():
            return 0
        updates = self._reconcile()
        if updates:
            self._send(updates)
        return len(updates)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            period = self._period()
            # 0 turns the check off; looked at again now and then, for a new configuration.
            if self._stopping.wait(period if period > 0 else 10.0) or period <= 0:
                continue
            try:
                self.check_once()
            except Exception:  # the loop must outlive any one check
                log.exception("drift check failed")

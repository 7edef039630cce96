"""--watch-config's baseline is the file as it was when the watcher was made (right after the
start read it), not as it is when the watcher's thread first runs: a change written in between
(a busy node schedules the thread late) is read, not taken as the baseline and missed."""

from __future__ import annotations

import threading
from pathlib import Path

from nri_numa.agent.settings import AgentSettings
from nri_numa.engine.config import EngineConfig
from nri_numa.nri.config_reload import ConfigReloader, LiveTargets, Reread


def test_a_change_before_the_watchers_thread_runs_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("cpuManagerPolicy: none\n")
    reads = threading.Event()

    def reread() -> Reread:
        reads.set()
        return Reread(EngineConfig(), AgentSettings())

    targets = LiveTargets(lambda engine, where: None, lambda level, fmt, file: None,
                          lambda address: None)
    watcher = ConfigReloader(path, reread, AgentSettings(), targets, threading.Event(),
                             watch=True, poll=0.05)
    path.write_text("cpuManagerPolicy: none\nnriNuma:\n  logFormat: json\n")  # before start()
    watcher.start()
    try:
        assert reads.wait(5), "the change made before the thread ran was never read"
    finally:
        watcher.stop()

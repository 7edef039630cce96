"""The hook daemon's own log lines follow the hook log when a hook run rotates it."""

from __future__ import annotations

import os

from nri_numa.hook import daemon, entry


def test_the_daemons_lines_leave_hook_log_1_once_a_hook_run_rotated_it(tmp_path):
    path = tmp_path / entry.LOG_NAME
    before = list(daemon.log.handlers)
    daemon._log_to(path)
    added = [h for h in daemon.log.handlers if h not in before]
    try:
        daemon.log.warning("first")
        # A hook run found the file past its size and moved it, under the daemon.
        os.rename(path, tmp_path / f"{entry.LOG_NAME}.1")
        with open(tmp_path / f"{entry.LOG_NAME}.1", "a") as f:
            f.write("x" * (entry.LOG_KEEP_BYTES + 1) + "\n")
        path.write_text("a hook run's line\n")
        daemon.log.warning("second")  # still in the moved file: then the daemon reopens
        daemon.log.warning("third")
        assert "third" in path.read_text()
        assert "third" not in (tmp_path / f"{entry.LOG_NAME}.1").read_text()
    finally:
        for handler in added:
            daemon.log.removeHandler(handler)
            handler.close()

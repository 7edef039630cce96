"""`nri-numa hook` started with its stdin closed (`<&-`): Python then has no sys.stdin. With a
hook daemon listening and without one, the run ends with one line and exit status 1, as the
fast clients' runs do (tests/integration/hook/test_c_client.py), never with a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.hook.test_c_client import RecordingDaemon

HOOK = [sys.executable, "-m", "nri_numa", "hook", "createRuntime"]


def closed_stdin_run(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *HOOK, "--state-dir", str(state),
                           "--timeout", "5"], capture_output=True, text=True, timeout=60)


def test_without_a_daemon_the_run_in_process_says_stdin_cannot_be_read(tmp_path):
    done = closed_stdin_run(tmp_path / "state")
    assert (done.returncode, done.stderr) == (
        1, "nri-numa hook createRuntime: cannot read stdin: [Errno 9] Bad file descriptor\n")


def test_with_a_daemon_the_forwarding_client_fails_as_the_fast_clients_do(tmp_path):
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    try:
        done = closed_stdin_run(state)
    finally:
        daemon.close()
    assert (done.returncode, done.stderr) == (
        1, f"nri-numa hook createRuntime: the hook daemon at {state}/hook.sock failed before "
           "answering: [Errno 9] Bad file descriptor\n")
    assert daemon.requests in ([], [b""])  # nothing was forwarded

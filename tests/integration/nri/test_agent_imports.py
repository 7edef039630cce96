"""`nri-numa run` stays clear of the HTTP and TLS stack (issue 16: idle RSS <= 40 MB).
prometheus_client's imports (ssl, http.server, wsgiref, urllib.request, email) were 4 MB of the
agent's 40 MB idle RSS; the agent serves /metrics with its own small server instead. Checked on import
of the agent's modules and on a running agent that served a scrape."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.integration.nri.plugin_env import machine
from tests.integration.nri.test_run_cli import wait_for_line

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("prometheus_client", "ssl", "_ssl", "http.server", "http.client", "email", "wsgiref",
         "urllib.request")
AGENT_MODULES = ("nri_numa.cli.run", "nri_numa.nri.daemon", "nri_numa.agent.metrics",
                 "nri_numa.agent.metrics_http", "nri_numa.cluster.feed")


def heavy_among(modules: set[str]) -> set[str]:
    return {m for m in modules if m in HEAVY or m.startswith(tuple(f"{h}." for h in HEAVY))}


def test_importing_the_agent_loads_no_http_or_tls_stack():
    code = (f"import sys\nfor name in {AGENT_MODULES!r}:\n    __import__(name)\n"
            "print('\\n'.join(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = set(done.stdout.split())
    assert set(AGENT_MODULES) <= modules
    assert not heavy_among(modules)


def test_a_running_agent_serving_a_scrape_loads_none_either(tmp_path: Path):
    (tmp_path / "node.json").write_text(machine().to_json())
    log_file = tmp_path / "agent.log"
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "nri_numa", "run",
         "--topology", str(tmp_path / "node.json"), "--nri-socket", str(tmp_path / "absent.sock"),
         "--state-dir", str(tmp_path / "state"), "--metrics-address", "127.0.0.1:0",
         "--log-file", str(log_file)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = wait_for_line(log_file, "metrics served on")
        url = line.split("metrics served on ")[1].split()[0]
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert b"nri_numa_topology_manager_admission_requests_total 0.0" in answer.read()
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        process.send_signal(signal.SIGTERM)
        _, trace = process.communicate(timeout=30)
    finally:
        process.kill()
    modules = {line.rsplit("|", 1)[1].strip() for line in trace.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    assert "nri_numa.agent.metrics_http" in modules  # the trace was read
    assert not heavy_among(modules)
    assert "/_ssl." not in maps  # nor loaded some other way than an import the trace shows

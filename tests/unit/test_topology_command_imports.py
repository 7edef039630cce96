"""`nri-numa topology` shows a machine; it must not pay for loading the placement engine
(issue 16: the command took 0.65-1.0 s on a 16-CPU VM, much of it imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nri_numa.topology.synthetic import preset_topology

REPO = Path(__file__).resolve().parents[2]


def imported_modules(*argv: str) -> set[str]:
    """The modules the command imports, from the interpreter's own -X importtime trace."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nri_numa", *argv],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


@pytest.mark.parametrize("source", ["preset", "file"])
def test_topology_command_imports_no_engine(source: str, tmp_path: Path) -> None:
    if source == "preset":
        argv = ["topology", "--preset", "intel-2s-ht"]
    else:
        captured = tmp_path / "topology.json"
        captured.write_text(preset_topology("intel-2s-ht").to_json())
        argv = ["topology", "--topology", str(captured)]
    modules = imported_modules(*argv)
    assert "nri_numa.topology.model" in modules  # the trace was read
    assert not {m for m in modules if m.startswith("nri_numa.engine")}

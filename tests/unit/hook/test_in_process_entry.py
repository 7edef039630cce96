"""The entry point's in-process hook path (no daemon answered): the hook's parser alone, and
the cyclic collector off for the run and on again after it (issue 16 item 2)."""

from __future__ import annotations

import gc

import pytest

import nri_numa.cli
from nri_numa.cli import dispatch


def test_an_in_process_hook_run_has_no_cyclic_gc_and_only_the_hook_parser(monkeypatch, tmp_path):
    seen = []

    def run(commands, argv):
        seen.append((gc.isenabled(), [c.__name__ for c in commands], argv))
        return 7

    monkeypatch.setattr(dispatch, "run", run)
    argv = ["hook", "createRuntime", "--state-dir", str(tmp_path), "--timeout", "5"]
    assert gc.isenabled()
    assert nri_numa.cli.main(argv) == 7  # no hook.sock there: the run is in process
    assert seen == [(False, ["nri_numa.cli.hook"], argv)]
    assert gc.isenabled()  # restored for the process that called main (this test runner)


def test_a_failing_in_process_run_restores_the_collector(monkeypatch, tmp_path):
    def run(commands, argv):
        raise RuntimeError("boom")

    monkeypatch.setattr(dispatch, "run", run)
    with pytest.raises(RuntimeError, match="boom"):
        nri_numa.cli.main(["hook", "poststop", "--state-dir", str(tmp_path)])
    assert gc.isenabled()

"""The entry point's in-process hook path: the hook's parser alone, and the cyclic collector
off for the run and on again after it (issue 16 item 2)."""

from __future__ import annotations

import gc

import pytest

import nri_numa.cli
from nri_numa.cli import dispatch


def test_an_in_process_hook_run_has_no_cyclic_gc_and_only_the_hook_parser(monkeypatch, tmp_path):
    seen = []
    build_parser = dispatch.build_parser

    def build(commands):
        seen.append([c.__name__ for c in commands])
        return build_parser(commands)

    def run_parsed(args):
        seen.append((gc.isenabled(), args.stage, args.state_dir, args.timeout, args.given))
        return 8

    monkeypatch.setattr(dispatch, "build_parser", build)
    monkeypatch.setattr(dispatch, "run_parsed", run_parsed)
    argv = ["hook", "createRuntime", "--state-dir", str(tmp_path), "--timeout", "5"]
    assert gc.isenabled()
    assert nri_numa.cli.main(argv) == 8
    assert seen == [["nri_numa.cli.hook"], (False, "createRuntime", str(tmp_path), 5.0, argv[1:])]
    assert gc.isenabled()  # restored for the process that called main (this test runner)


def test_a_failing_in_process_run_restores_the_collector(monkeypatch, tmp_path):
    def run(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(dispatch, "run_parsed", run)
    with pytest.raises(RuntimeError, match="boom"):
        nri_numa.cli.main(["hook", "poststop", "--state-dir", str(tmp_path)])
    assert gc.isenabled()

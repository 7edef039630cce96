"""The entry point's in-process hook path (no daemon answered): plain arguments read without
argparse exactly as argparse reads them, else the hook's parser alone, and the cyclic collector
off for the run and on again after it (issue 16 item 2)."""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nri_numa.cli
from nri_numa.cli import dispatch, hook


def test_an_in_process_hook_run_has_no_cyclic_gc_and_only_the_hook_parser(monkeypatch, tmp_path):
    seen = []

    def run(commands, argv):
        seen.append((gc.isenabled(), [c.__name__ for c in commands], argv))
        return 7

    def run_parsed(args):
        seen.append((gc.isenabled(), args.stage, args.state_dir, args.timeout))
        return 8

    monkeypatch.setattr(dispatch, "run", run)
    monkeypatch.setattr(dispatch, "run_parsed", run_parsed)
    argv = ["hook", "createRuntime", "--state-dir", str(tmp_path), "--timeout", "5"]
    assert gc.isenabled()
    assert nri_numa.cli.main(argv) == 8  # no hook.sock there: the run is in process
    assert seen == [(False, "createRuntime", str(tmp_path), 5.0)]
    # A value argparse may read otherwise: the hook's parser judges.
    odd = ["hook", "poststop", "--state-dir", str(tmp_path), "--config", "-c.json"]
    assert nri_numa.cli.main(odd) == 7
    assert seen[1] == (False, ["nri_numa.cli.hook"], odd)
    assert gc.isenabled()  # restored for the process that called main (this test runner)


def test_a_failing_in_process_run_restores_the_collector(monkeypatch, tmp_path):
    def run(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(dispatch, "run_parsed", run)
    with pytest.raises(RuntimeError, match="boom"):
        nri_numa.cli.main(["hook", "poststop", "--state-dir", str(tmp_path)])
    assert gc.isenabled()


# Words a hook's command line is made of, odd ones included: the stages, every option (with and
# without "=value"), values that look like options, numbers, nan, empty strings.
WORDS = ["createRuntime", "prestart", "poststop", "precreate", "--state-dir", "--config",
         "--topology", "--log-file", "--timeout", "--cgroup-root", "--proc-root",
         "--start-daemon", "--state-dir=/run/x", "--config=", "--timeout=2.5", "--timeout=-1",
         "--time", "--start-daemon=1", "-h", "--", "/run/x", "c.json", "3", "0.5", "-1", "nan",
         "1e400", "-x", "--x", "", "a=b"]


def parsed_by_argparse(args: list[str]) -> dict | None:
    from nri_numa.cli.main import build_parser

    try:
        namespace = build_parser().parse_args(["hook", *args])
    except SystemExit:
        return None
    return vars(namespace)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=7))
def test_plain_args_read_what_argparse_reads_or_leave_it_to_argparse(words):
    plain = hook.plain_args(words)
    if plain is None:
        return  # argparse judges these, as before
    assert vars(plain) == parsed_by_argparse(words)


def test_plain_args_cover_the_shipped_hooks_and_refuse_values_like_options():
    shipped = ["createRuntime", "--state-dir", "/run/nri-numa", "--timeout", "8"]
    assert vars(hook.plain_args(shipped)) == parsed_by_argparse(shipped)
    assert hook.plain_args(["poststop", "--config", "-x"]) is None  # argparse: expected a value
    # ... even when a later value for the same option replaces it
    assert hook.plain_args(["--state-dir", "-h", "precreate", "--state-dir=/run/x"]) is None
    assert hook.plain_args(["--config", "--start-daemon", "--config=a", "poststop"]) is None
    assert hook.plain_args(["poststop", "--timeout", "soon"]) is None
    assert hook.plain_args(["poststop", "--timeout", "soon", "--timeout=2.5"]) is None
    assert hook.plain_args(["poststop", "--timeout", "nan"]) is None
    assert hook.plain_args(["--help"]) is None

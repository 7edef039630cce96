"""`nri-numa hook`: its parser, the defaults its help names, and bad options."""

from __future__ import annotations

import pytest

from nri_numa.cli import build_parser, main
from nri_numa.hook.entry import DEFAULT_STATE_DIR, DEFAULT_TIMEOUT_S, STAGES, HookOptions


def hook_help() -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["hook"].format_help()


def test_help_names_the_real_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside a path
    text = " ".join(hook_help().split())
    assert f"default {DEFAULT_STATE_DIR}" in text
    assert f"default {DEFAULT_TIMEOUT_S:g}" in text
    assert "--cgroup-root" not in text  # for tests only


@pytest.mark.parametrize("stage", ["createRuntime", "prestart", "poststop", "precreate"])
def test_stages_and_the_prestart_alias(stage):
    args = build_parser().parse_args(["hook", stage, "--timeout", "2.5"])
    assert (args.stage, args.timeout) == (stage, 2.5)
    assert STAGES[HookOptions(stage).stage] == ("createRuntime" if stage == "prestart" else stage)


def test_unsupported_stages_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["hook", "startContainer"])
    assert exit_.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_a_non_positive_timeout_is_a_clear_error(capsys):
    assert main(["hook", "poststop", "--timeout", "0"]) == 1
    assert "timeout must be positive" in capsys.readouterr().err

"""The shipped hooks.d files and runc example: valid in form, gated on the documented annotation,
with a timeout above the hook's own, explicit env, and arguments the real CLI accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nri_numa.cli import build_parser
from nri_numa.hook.annotations import HOOK_ANNOTATION
from nri_numa.hook.client import SOCKET_ENV, SOCKET_NAME

HOOKS = Path(__file__).resolve().parents[3] / "hooks"
HOOKS_D = {"nri-numa-createruntime.json": "createRuntime", "nri-numa-poststop.json": "poststop",
           "nri-numa-precreate.json": "precreate"}


CLIENT = "nri_numa/hook/client.py"
VENV = "/opt/nri-numa/venv/"  # where packaging/README.md installs nri-numa


C_CLIENT_FILES = HOOKS / "c-client"


def c_client_command(hook: dict) -> list[str]:
    """The ``nri-numa`` arguments a hook of hooks/c-client runs: the C client, at the path
    ``python -m nri_numa.hook.c_client`` builds it to for the venv's interpreter."""
    from nri_numa.hook.c_client import default_output

    path, args = hook["path"], hook["args"]
    assert path == str(default_output(VENV + "bin/python3")) and args[0] == path
    return ["hook", *args[1:]]


def hook_command(hook: dict) -> list[str]:
    """The ``nri-numa`` arguments a shipped hook runs: every file runs the thin client, run by
    path from the interpreter nri-numa is installed in, with ``-I -S`` (docs/oci-hook.md).
    ``args[0]`` is the interpreter's whole path: Python finds its installation (the venv) from
    it, and a bare ``python3`` would be looked up on the hook's PATH: the system's."""
    path, args = hook["path"], hook["args"]
    assert Path(path).is_absolute() and path.startswith(VENV)
    assert args[0] == path and args[1:3] == ["-I", "-S"]
    assert args[3].startswith(VENV) and args[3].endswith("/site-packages/" + CLIENT)
    return ["hook", *args[4:]]


def check_hook(hook: dict, stage: str) -> None:
    args = build_parser().parse_args(hook_command(hook))
    assert (args.command, args.stage) == ("hook", stage)
    assert isinstance(hook["timeout"], int) and hook["timeout"] > (args.timeout or 4)
    assert any(e.startswith("PATH=/") for e in hook["env"])  # explicit: never the runtime's env
    # The thin client finds the daemon by its environment, not its arguments: the same folder.
    assert f"{SOCKET_ENV}={args.state_dir}/{SOCKET_NAME}" in hook["env"]


@pytest.mark.parametrize("name, stage", HOOKS_D.items())
def test_hooks_d_files(name, stage):
    data = json.loads((HOOKS / name).read_text())
    assert data["version"] == "1.0.0" and data["stages"] == [stage]
    check_hook(data["hook"], stage)
    [(key, value)] = data["when"]["annotations"].items()
    assert set(data["when"]) == {"annotations"}  # the annotation alone decides
    assert re.search(key, HOOK_ANNOTATION) and re.search(value, "true")
    for other in ("numa.nri.io/hooks", "xnuma.nri.io/hook", "numa-nri-io/hook"):
        assert not re.search(key, other)
    for other in ("false", "", "truely"):
        assert not re.search(value, other)


def test_every_hook_file_uses_the_same_binary_and_state():
    states = set()
    for name in HOOKS_D:
        hook = json.loads((HOOKS / name).read_text())["hook"]
        args = build_parser().parse_args(hook_command(hook))
        states.add((hook["path"], hook["args"][3], args.state_dir, args.config))
    assert len(states) == 1  # all stages must share one ledger


def test_the_runc_example_runs_the_hook_at_create_runtime_and_poststop():
    spec = json.loads((HOOKS / "runc-config.example.json").read_text())
    assert set(spec["hooks"]) == {"createRuntime", "poststop"}
    for stage, [hook] in spec["hooks"].items():
        check_hook(hook, stage)
    assert spec["linux"]["cgroupsPath"].startswith("/")
    assert spec["process"]["terminal"] is False


def test_the_client_the_files_name_is_the_packages_and_the_daemon_units_venv():
    assert (Path(__file__).resolve().parents[3] / CLIENT).is_file()
    unit = (HOOKS.parent / "packaging" / "nri-numa-hook-daemon.service").read_text()
    assert f"ExecStart={VENV}bin/nri-numa hook-daemon" in unit


def test_the_example_configuration_turns_the_static_cpu_manager_on():
    from nri_numa.hook.machine import load_config

    config = load_config(HOOKS / "config.example.json")
    assert str(config.cpu_manager_policy) == "static" and config.reserved_system_cpus == {0}
    for name in HOOKS_D:
        hook = json.loads((HOOKS / name).read_text())["hook"]
        assert build_parser().parse_args(hook_command(hook)).config.endswith(".json")


def as_python_client(hook: dict) -> dict:
    """A C client's hook as the same hook through the Python client."""
    python = VENV + "bin/python3"
    client = VENV + "lib/python3.11/site-packages/" + CLIENT
    return {**hook, "path": python, "args": [python, "-I", "-S", client, *hook["args"][1:]]}


@pytest.mark.parametrize("name, stage", HOOKS_D.items())
def test_the_c_client_files_are_the_python_ones_but_for_the_command(name, stage):
    ours = json.loads((C_CLIENT_FILES / name).read_text())
    args = build_parser().parse_args(c_client_command(ours["hook"]))
    assert (args.command, args.stage) == ("hook", stage)
    assert {**ours, "hook": as_python_client(ours["hook"])} == \
        json.loads((HOOKS / name).read_text())


def test_the_c_client_runc_hooks_are_the_runc_examples_but_for_the_command():
    ours = json.loads((C_CLIENT_FILES / "runc-hooks.example.json").read_text())["hooks"]
    theirs = json.loads((HOOKS / "runc-config.example.json").read_text())["hooks"]
    assert set(ours) == set(theirs) == {"createRuntime", "poststop"}
    for stage, [hook] in ours.items():
        assert build_parser().parse_args(c_client_command(hook)).stage == stage
        assert [as_python_client(hook)] == theirs[stage]

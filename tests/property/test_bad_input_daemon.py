"""Runs handed to the hook daemon (``nri_numa.hook.daemon.answer``): any arguments and any stdin
a peer on its socket may send are answered with an exit status and bounded lines, as
``nri-numa hook`` in its own process answers them, never an exception that would stop the
daemon. The arguments' paths stay inside the test's folder: a run writes its log and cgroups
where its options say."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.context import EngineContext
from nri_numa.hook.daemon import DaemonOptions, answer
from nri_numa.hook.machine import Machine
from nri_numa.state.checkpoint import machine_fingerprint
from nri_numa.topology.synthetic import preset_topology
from tests.property.bad_input import VALUE, check_lines, examples, files_under

TOPOLOGY = preset_topology("intel-2s-ht")
MACHINE = Machine(TOPOLOGY, EngineContext.build(TOPOLOGY, config_from_mapping({})),
                  machine_fingerprint(TOPOLOGY))
STAGES = ["createRuntime", "poststop", "precreate", "prestart"]
# Words of a command line; a hook's arguments come from its runtime's configuration, so no
# megabyte-long ones (argparse would quote one whole in its usage error).
WORD = st.one_of(st.text(max_size=30),
                 st.text(alphabet=st.characters(categories=["Cs", "Cc", "Zl", "Zp", "Ll", "Nd"]),
                         max_size=30),
                 st.sampled_from(["", "\n", "a\nb", "\udc80x", "1_0", "-1", "nan", "1e999", "4"]))
OPTIONS = ["--config", "--config", "--topology", "--timeout", "--timeout", "--start-daemon",
           "--help", "--", "--x", "WORD"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("daemon")
    for name in ("cgroup", "proc", "state"):
        (folder / name).mkdir()
    return folder


def check_answer(folder: Path, args: list[str], stdin: bytes) -> None:
    before = files_under(folder, skip=[folder / "state"])
    code, out, err = answer(args, io.BytesIO(stdin), time.monotonic(),
                            DaemonOptions(state_dir=folder / "state"), lambda hook: MACHINE)
    err = err.encode("utf-8", "backslashreplace").decode()  # as the daemon writes it
    assert code in (0, 1, 2), (code, err)
    if code == 2:  # argparse's usage and error, as `nri-numa hook` gives them
        assert err.startswith("usage: nri-numa ") and "error: " in err, err[:2000]
        assert "Traceback" not in err
    elif code == 1:
        check_lines(err, "nri-numa")
    elif "--help" not in args and "-h" not in args:
        assert err == "", err
    assert files_under(folder, skip=[folder / "state"]) == before


@st.composite
def arguments(draw, folder: Path) -> list[str]:
    # Paths from a run are used as they are: only paths inside the test's folder are given.
    args = [draw(st.one_of(st.sampled_from(STAGES), st.sampled_from(STAGES), WORD)),
            "--state-dir", str(folder / "state"),
            "--cgroup-root", str(folder / "cgroup"), "--proc-root", str(folder / "proc"),
            "--log-file", str(folder / "state" / "hook.log")]
    for option in draw(st.lists(st.sampled_from(OPTIONS), max_size=2)):
        if option in ("--config", "--topology"):
            args += [option, draw(st.one_of(WORD, st.just(str(folder / "state" / "x"))))]
        elif option == "--timeout":
            args += [option, draw(st.one_of(WORD, st.floats().map(str)))]
        elif option == "WORD":
            args.append(draw(WORD))
        else:
            args.append(option)
    return args


@settings(max_examples=examples(60))
@given(st.data())
def test_any_arguments_and_stdin_are_answered_in_bounded_lines(folder, data):
    args = data.draw(arguments(folder))
    stdin = data.draw(st.one_of(st.binary(max_size=300), VALUE.map(lambda v: repr(v).encode())))
    check_answer(folder, args, stdin)


def test_a_refusal_naming_a_path_with_a_newline_is_still_one_line(folder):
    check_answer(folder, ["poststop", "--state-dir", str(folder / "state"), "--config",
                          "a\nnri-numa hook poststop: forged\udc80"], b"{}")

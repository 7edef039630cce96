"""The agent's log formats: text lines, and JSON lines that carry a decision's fields."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from nri_numa.agent.logs import JsonFormatter, configure
from nri_numa.safeio.log_files import LogSetupError


def record(msg: str, *args, level=logging.INFO, **extra) -> logging.LogRecord:
    r = logging.LogRecord("nri_numa.nri.plugin", level, __file__, 1, msg, args, None)
    r.__dict__.update(extra)
    return r


def test_json_lines_carry_message_and_fields():
    line = JsonFormatter().format(record("placed %s", "x", event="placed", cpus="1-3",
                                         hint=[1], nodes=frozenset({2, 0}), exclusive=True))
    entry = json.loads(line)
    assert entry["msg"] == "placed x" and entry["level"] == "info"
    assert entry["logger"] == "nri_numa.nri.plugin"
    assert entry["time"].endswith("Z") and "T" in entry["time"]
    assert (entry["event"], entry["cpus"], entry["hint"], entry["exclusive"]) == (
        "placed", "1-3", [1], True)
    assert entry["nodes"] == [0, 2]  # a set, as JSON can write it
    assert "\n" not in line
    for internal in ("args", "levelno", "pathname", "threadName", "msecs"):
        assert internal not in entry


def test_json_lines_hold_exceptions():
    try:
        raise ValueError("broken")
    except ValueError:
        import sys

        r = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = json.loads(JsonFormatter().format(r))
    assert "ValueError: broken" in entry["exception"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_configure_writes_the_chosen_format_to_the_file(tmp_path: Path, fmt: str):
    log_file = tmp_path / "agent.log"
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("warning", fmt, log_file)
        # Outside the nri_numa hierarchy, whose level other tests (the hook's) may have set.
        logging.getLogger("logs_test").info("not shown")
        logging.getLogger("logs_test").warning("shown %d", 1, extra={"pod": "a/b"})
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    [line] = log_file.read_text().splitlines()
    if fmt == "json":
        assert json.loads(line)["pod"] == "a/b" and json.loads(line)["msg"] == "shown 1"
    else:
        assert line.endswith("WARNING logs_test: shown 1")


def test_a_log_file_that_cannot_be_opened_is_named(tmp_path: Path):
    with pytest.raises(LogSetupError, match=f"cannot open log file {tmp_path}/no/such/x.log"):
        configure("info", "text", tmp_path / "no" / "such" / "x.log")

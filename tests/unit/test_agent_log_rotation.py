"""The agent's log file is bounded while the agent runs: a line that takes it past the limit
moves it to ``<name>.1`` (replacing the one before) and the next line starts a new file."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from nri_numa.agent import logs
from nri_numa.agent.logs import configure, open_log_file

LINE = "x" * 39  # 40 bytes a line with its newline


def write(handler: logging.Handler, text: str) -> None:
    handler.handle(logging.LogRecord("t", logging.INFO, "", 0, text, (), None))


def plain_handler(path: Path, limit: int) -> logging.Handler:
    handler = open_log_file(path, rotate_past=limit)
    handler.setFormatter(logging.Formatter("%(message)s"))
    return handler


def test_the_line_past_the_limit_ends_the_file_and_the_next_starts_a_new_one(tmp_path: Path):
    log = tmp_path / "agent.log"
    handler = plain_handler(log, 100)
    try:
        for n in range(3):  # 120 bytes: the third line takes the file past 100
            write(handler, f"{n:02d}{LINE[2:]}")
        assert not log.exists() or log.read_text() == ""
        assert (tmp_path / "agent.log.1").read_text().splitlines() == [
            f"{n:02d}{LINE[2:]}" for n in range(3)]
        write(handler, "next")
        assert log.read_text() == "next\n"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    finally:
        handler.close()


def test_two_files_at_most_and_no_line_lost_until_the_old_one_is_replaced(tmp_path: Path):
    log = tmp_path / "agent.log"
    handler = plain_handler(log, 200)
    try:
        lines = [f"{n:04d}{LINE[4:]}" for n in range(100)]  # 4000 bytes: 19 rotations
        for line in lines:
            write(handler, line)
            files = sorted(p.name for p in tmp_path.iterdir())
            assert files in (["agent.log"], ["agent.log", "agent.log.1"], ["agent.log.1"])
            assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 2 * 200 + 2 * 40
        kept = (tmp_path / "agent.log.1").read_text() + (log.read_text() if log.exists() else "")
        assert kept.splitlines() == lines[-len(kept.splitlines()):]
        assert len(kept.splitlines()) >= 6  # the last file moved aside, whole, and after it
    finally:
        handler.close()


def test_when_the_move_fails_the_log_goes_on_in_the_same_file(tmp_path: Path):
    log = tmp_path / "agent.log"
    (tmp_path / "agent.log.1").mkdir()  # a folder where the old log would go: rename fails
    handler = plain_handler(log, 100)
    try:
        lines = [f"{n:02d}{LINE[2:]}" for n in range(10)]
        for line in lines:
            write(handler, line)
        assert log.read_text().splitlines() == lines
    finally:
        handler.close()


def test_the_agents_configured_log_rotates_at_log_keep_bytes(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(logs, "LOG_KEEP_BYTES", 1000)
    log = tmp_path / "agent.log"
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("info", "text", log)
        for n in range(100):  # about 80 bytes a line: 8000 bytes in all
            logging.getLogger("rotation_test").info("line %03d %s", n, LINE)
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    rotated = tmp_path / "agent.log.1"
    assert rotated.exists() and rotated.stat().st_size <= 1000 + 100
    assert log.stat().st_size <= 1000 + 100
    assert "line 099" in log.read_text() or "line 099" in rotated.read_text()
    assert logs.LOG_KEEP_BYTES == 1000 and logging.getLogger().handlers == saved[0]

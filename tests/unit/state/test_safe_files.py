"""Opening nri-numa's files: folders and files never followed through a symlink, a FIFO never
waited on, a device node never opened, reads bounded; and logs opened the same way."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from nri_numa.agent.logs import open_log_file
from nri_numa.safeio.log_files import LogFileRefused, LogSetupError
from nri_numa.safeio.safe_files import (APPEND, LOCK, NotAFile, open_file, open_folder,
                                       read_regular)
from tests.damaged_state import VICTIM_TEXT, damage


def test_a_folder_is_made_0700_and_a_symlinked_one_refused(state_dir):
    fd = open_folder(state_dir, create=True)
    os.close(fd)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert open_folder(state_dir.parent / "missing") is None
    link = state_dir.parent / "link"
    link.symlink_to(state_dir)
    with pytest.raises(NotAFile, match="it is a symlink: refusing to use it as a folder"):
        open_folder(link, create=True)
    (state_dir / "file").write_text("x")
    with pytest.raises(NotAFile, match="it is a regular file, not a folder"):
        open_folder(state_dir / "file")


@pytest.mark.parametrize("kind, flags", [("symlink", APPEND), ("symlink", LOCK),
                                         ("fifo", APPEND), ("fifo", LOCK),
                                         ("directory", APPEND), ("socket", LOCK)])
def test_only_regular_files_are_opened(state_dir, kind, flags):
    victim = damage(state_dir / "f", kind)
    folder = open_folder(state_dir)
    try:
        with pytest.raises(NotAFile):
            open_file("f", flags, folder=folder)
    finally:
        os.close(folder)
    if victim is not None:
        assert victim.read_text() == VICTIM_TEXT


def test_a_device_is_opened_only_when_asked_for(state_dir):
    with pytest.raises(NotAFile, match="it is a character device"):
        open_file("/dev/null", APPEND)
    os.close(open_file("/dev/null", APPEND, devices=True))


def test_a_file_is_blocking_once_opened(state_dir):
    state_dir.mkdir()
    fd = open_file(state_dir / "f", APPEND)
    try:
        assert os.get_blocking(fd)  # O_NONBLOCK only guarded the open
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
    finally:
        os.close(fd)


def test_reads_are_bounded(state_dir):
    state_dir.mkdir()
    (state_dir / "f").write_bytes(b"x" * 100)
    folder = open_folder(state_dir)
    try:
        assert read_regular("f", folder, 100, "f").data == b"x" * 100
        with pytest.raises(NotAFile, match="it is larger than 99 bytes"):
            read_regular("f", folder, 99, "f")
        assert read_regular("missing", folder, 99, "missing") is None
    finally:
        os.close(folder)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_log_file_that_is_not_a_file_is_refused(state_dir, kind):
    victim = damage(state_dir / "agent.log", kind)
    with pytest.raises(LogFileRefused) as caught:
        open_log_file(state_dir / "agent.log")
    assert not caught.value.folder
    if victim is not None:
        assert victim.read_text() == VICTIM_TEXT


def test_a_log_in_a_symlinked_folder_is_refused_as_such(state_dir):
    state_dir.mkdir()
    link = state_dir.parent / "link"
    link.symlink_to(state_dir)
    with pytest.raises(LogFileRefused) as caught:
        open_log_file(link / "hook.log", create_folder=True)
    assert caught.value.folder and list(state_dir.iterdir()) == []


def test_a_log_in_a_missing_folder_is_a_setup_error(state_dir):
    with pytest.raises(LogSetupError, match="cannot open log file .*: No such file or directory"):
        open_log_file(state_dir / "missing" / "x.log")


def test_a_log_is_appended_and_rotated(state_dir):
    state_dir.mkdir()
    log = state_dir / "hook.log"
    log.write_text("old\n" * 10)
    handler = open_log_file(log, rotate_past=20)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.emit(logging.LogRecord("t", logging.INFO, "", 0, "new", (), None))
    handler.close()
    assert log.read_text() == "new\n"
    assert (state_dir / "hook.log.1").read_text() == "old\n" * 10
    assert stat.S_IMODE(log.stat().st_mode) == 0o600

"""The fast client (nri_numa/hook/fast_forward.py, built-in modules only) against the client it
stands in for (nri_numa.hook.client, which uses json): the same arguments, the same request
bytes, the same reading of every answer, the same words."""

from __future__ import annotations

import json

import pytest

from nri_numa.hook import client, deadline, entry
from nri_numa.hook import fast_forward


@pytest.mark.parametrize("args", [
    ["createRuntime", "--state-dir", "/s", "--timeout=2.5", "--cgroup-root", "/c"],
    ["poststop", "--config=/etc/c.json", "--topology", "/t.json", "--log-file", "/l"],
    ["precreate", "--start-daemon", "--proc-root", "/p"], ["prestart"],
    [], ["--help"], ["createRuntime", "--bogus"], ["createRuntime", "--config"], ["start"],
    ["poststop", "poststop"], ["createRuntime", "--start-daemon=1"]])
def test_arguments_are_read_as_the_client_reads_them(args):
    theirs = client.parse_hook_args(args)
    ours = fast_forward.parse_args(args)
    if theirs is None:
        assert ours is None
    else:
        stage, options = theirs
        flag = options.pop("start_daemon", False)
        assert ours == (stage, options, flag)


@pytest.mark.parametrize("stdin", [b'{"id": "c1", "pid": 42}', b"", b"\xff\xfe\x00\x1f\"\\",
                                   "caf\u00e9 \U0001f600 \u2028".encode(), b"\xed\xa0\x80"])
def test_the_request_is_byte_for_byte_the_clients(stdin):
    options = {"state_dir": "/run/nri-numa", "timeout": "8", "config": "/etc/\u00e9\"x",
               "started": 1764215000.123456}
    assert fast_forward.encode_request("createRuntime", stdin, options) == \
        client.encode_request("createRuntime", stdin, options)


@pytest.mark.parametrize("reply", [
    {"exit": 0, "stdout": "", "stderr": ""},
    {"exit": 1, "stdout": "", "stderr": "nri-numa hook createRuntime: refused \"x\"\n"},
    {"exit": 0, "stdout": '{"ociVersion": "1.0.2", "a\\u00e9": [1, 2]}', "stderr": "\t\u2028"},
    {"exit": -3, "stdout": "\ud83d\ude00 \udcff", "stderr": "", "extra": "ignored"}])
def test_every_answer_the_daemon_writes_is_read_as_json_reads_it(reply):
    for line in (json.dumps(reply), json.dumps(reply, ensure_ascii=False, indent=1)):
        raw = line.encode("utf-8", "surrogatepass")
        try:
            expected = client.decode_reply(raw)
        except client.ProtocolError:
            with pytest.raises(fast_forward.ProtocolError):
                fast_forward.decode_reply(raw)
            continue
        assert fast_forward.decode_reply(raw) == expected


@pytest.mark.parametrize("line", [
    b'{"exit": 0, "stdout": "", "stderr": "", "x": [1, {"y": null}], "z": 1.5e3}',
    b' {"stdout":"a","stderr":"b","exit":7} ', b'{"exit": 0, "exit": 2, "stdout": "", "stderr": ""}',
    b'{"exit": 01, "stdout": "", "stderr": ""}', b'{"exit": 1.0, "stdout": "", "stderr": ""}',
    b'{"exit": true, "stdout": "", "stderr": ""}', b'{"exit": 0, "stdout": ""}', b"{", b"[1]",
    b"", b"nope", b'{"exit": 0, "stdout": "", "stderr": ""} x', b'{"exit": 0,}',
    b'{"exit": 0 "stdout": ""}', b'{"exit": 0, "stdout": "\\q", "stderr": ""}', b"{}",
    b'{"exit": -0, "stdout": "", "stderr": ""}', b'{"exit": 0, "stdout": "", "stderr": "\xff"}'])
def test_odd_answers_get_the_clients_verdict(line):
    try:
        expected = client.decode_reply(line)
    except client.ProtocolError as e:
        with pytest.raises(fast_forward.ProtocolError) as got:
            fast_forward.decode_reply(line)
        assert str(got.value) == str(e)
    else:
        assert fast_forward.decode_reply(line) == expected


def test_the_words_and_defaults_are_the_hooks():
    assert fast_forward.COUNTED == deadline.COUNTED
    assert fast_forward.DAEMON_HINT == deadline.DAEMON_HINT
    assert fast_forward.DEFAULT_STATE_DIR == str(entry.DEFAULT_STATE_DIR) == client.DEFAULT_STATE_DIR
    assert fast_forward.DEFAULT_TIMEOUT_S == entry.DEFAULT_TIMEOUT_S
    assert fast_forward.MAX_TIMEOUT_S == entry.MAX_TIMEOUT_S
    assert (fast_forward.SOCKET_NAME, fast_forward.LOG_NAME) == (client.SOCKET_NAME, entry.LOG_NAME)
    assert fast_forward.MAX_LINE == client.MAX_LINE
    assert set(fast_forward.STAGES) == set(entry.STAGES)
    assert fast_forward.VALUE_OPTIONS == client.VALUE_OPTIONS


@pytest.mark.parametrize("folder, joined", [("/run/nri-numa", "/run/nri-numa/hook.sock"),
                                            ("/run/nri-numa/", "/run/nri-numa/hook.sock"),
                                            ("", "hook.sock"), ("rel", "rel/hook.sock")])
def test_paths_join_as_os_path_joins_them(folder, joined):
    assert fast_forward.join(folder, "hook.sock") == joined


def test_the_log_line_is_written_as_the_hooks(tmp_path):
    path = tmp_path / "new" / "hook.log"
    fast_forward.log_line(str(path), "poststop", "gave up")
    deadline.log_line(str(path), "poststop", "gave up")
    ours, theirs = path.read_text().splitlines()
    assert ours.split(" ", 2)[2] == theirs.split(" ", 2)[2]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    (tmp_path / "link.log").symlink_to(path)
    fast_forward.log_line(str(tmp_path / "link.log"), "poststop", "not through a link")
    assert "not through a link" not in path.read_text()


DEFERRED_CHECK = r"""
import sys
sys.path.append(sys.argv[1])
import fast_forward

fast_forward.defer_path_extras()
import pathlib

assert [type(sys.modules[m]).__name__ for m in ("ntpath", "urllib.parse")] == ["Deferred"] * 2
assert "ipaddress" not in sys.modules and "nt" not in sys.modules
assert pathlib.Path("/a b").as_uri() == "file:///a%20b"  # pathlib's own binding, then loaded
assert pathlib.PureWindowsPath("C:/x/y").drive == "C:" and pathlib.PureWindowsPath("a", "b").parts == ("a", "b")
import ntpath
import urllib.parse
from urllib.parse import urlsplit

assert type(urllib.parse).__name__ == "module" and urllib.parse is sys.modules["urllib.parse"]
assert "ipaddress" in sys.modules
assert urllib.parse.quote("a b") == "a%20b" and urlsplit("http://h/p").path == "/p"
assert ntpath.join("a", "b") == "a\\b" and type(sys.modules["ntpath"]).__name__ == "module"
print("ok")
"""


def test_what_pathlib_imports_for_windows_paths_and_uris_loads_when_first_used():
    """In the fast client's process, ntpath and urllib.parse (with ipaddress) stand deferred
    until something uses them; then the real modules answer, pathlib's references included."""
    import subprocess
    import sys
    from pathlib import Path

    here = str(Path(fast_forward.__file__).parent)
    done = subprocess.run([sys.executable, "-I", "-S", "-c", DEFERRED_CHECK, here],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr

"""The C client (nri-numa-hook-client) against the Python fast client it stands in for
(nri_numa/hook/fast_client.py, which runs nri_numa.hook.client), both run as real processes
against a recording daemon of this test on a real unix socket: the request bytes, the reading
of every answer (exit status, stdout, stderr, the one-line refusals of an odd answer), and the
bounds on what they read."""

from __future__ import annotations

import json
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nri_numa.hook import c_client, client, deadline

REPO = Path(__file__).resolve().parents[3]
PYTHON_CLIENT = [sys.executable, "-I", "-S", str(REPO / "nri_numa" / "hook" / "fast_client.py")]
STARTED = re.compile(rb'"started": ([0-9.e+-]+)\}\}\n$')


class RecordingDaemon:
    """Listens on ``<state>/hook.sock``; each connection's request line is recorded and
    answered with ``reply`` (None: closed without a word)."""

    def __init__(self, state: Path,
                 reply: bytes | None = b'{"exit": 0, "stdout": "", "stderr": ""}\n'):
        state.mkdir(parents=True, exist_ok=True)
        self.path = state / "hook.sock"
        self.reply = reply
        self.requests: list[bytes] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                if self.reply is not None:
                    try:
                        conn.sendall(self.reply)
                    except OSError:  # a client that gave up first
                        pass

    def close(self) -> None:
        self.listener.close()
        self.path.unlink()


def run(command: list, args: list, stdin: bytes | None = b"{}") -> subprocess.CompletedProcess:
    return subprocess.run([*command, *args], input=stdin, capture_output=True, cwd="/",
                          timeout=60)


def request_of(command: list, args: list, stdin: bytes, state: Path) -> bytes:
    daemon = RecordingDaemon(state)
    try:
        done = run(command, args, stdin)
        assert done.returncode == 0, done.stderr
    finally:
        daemon.close()
    [request] = daemon.requests
    return request


ODD = b"\xff\xfe\x00\x1f\"\\\x7f\t\n\r\b\f/"
MIXED = "caf\u00e9 \U0001f600 \u2028".encode() + b"\xed\xa0\x80\xe2\x82A\xf4\x90\x80\x80\xc0\xaf"


@pytest.mark.parametrize("args, stdin", [
    (["createRuntime"], b'{"id": "c1", "pid": 42}'),
    (["--config", "/etc/c.json", "poststop", "--topology=/t.json", "--timeout", "2.5",
      "--cgroup-root", "/c", "--proc-root=/p", "--config", "/second"], b""),
    (["precreate", "--start-daemon", "--config", "/etc/\u00e9\"x\\y\t"], ODD),
    (["prestart", b"--config=/etc/\xff\xfe\xed\xa0\x80", "--timeout=1e1"], MIXED),
    (["createRuntime", "--timeout", "86400", "--log-file", ""],
     bytes(random.Random(7).randrange(256) for _ in range(300_000))),
], ids=["plain", "every-option", "escapes", "not-utf8", "300k-random-stdin"])
def test_the_request_is_byte_for_byte_the_python_clients(tmp_path, c_client_binary, args, stdin):
    state = tmp_path / "state"
    args = [*args, "--state-dir", str(state)]
    ours = request_of([str(c_client_binary)], args, stdin, state)
    theirs = request_of(PYTHON_CLIENT, args, stdin, state)
    ours_started, theirs_started = STARTED.search(ours)[1], STARTED.search(theirs)[1]
    # The process's start as Python's repr writes that float, within a moment of now.
    assert ours_started.decode() == repr(float(ours_started))
    assert abs(float(ours_started) - time.time()) < 30
    assert ours.replace(ours_started, theirs_started) == theirs
    request = json.loads(ours)
    assert request["stdin"].encode("utf-8", "surrogateescape") == stdin


@pytest.mark.parametrize("value", [1764215000.123456, 1764215000.0, 0.1, 1e-05, 0.0001, 1e16,
                                   123456789012345.6, 5e-324, 2.5e300])
def test_started_is_written_as_python_writes_a_float(tmp_path, c_client_binary, value):
    """The float formatting alone, through a tiny C program built from the client's source."""
    source = c_client.SOURCE.read_text()
    start = source.index("static void float_repr")
    end = source.index("\n}\n", start) + 3
    program = tmp_path / "repr.c"
    program.write_text("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
                       + source[start:end]
                       + 'int main(int c, char **v) { char o[64]; (void)c; '
                         'float_repr(strtod(v[1], NULL), o, sizeof o); puts(o); return 0; }\n')
    cc = c_client.find_compiler()
    subprocess.run([cc, *c_client.CFLAGS, "-o", str(tmp_path / "repr"), str(program)],
                   check=True)
    done = subprocess.run([str(tmp_path / "repr"), repr(value)], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == repr(value)


REPLIES = [
    b'{"exit": 0, "stdout": "", "stderr": ""}',
    b'{"exit": 1, "stdout": "", "stderr": "nri-numa hook createRuntime: refused \\"x\\"\\n"}',
    b'{"exit": 0, "stdout": "{\\"a\\u00e9\\": [1, 2]} \\ud83d\\ude00", "stderr": "\\t\\u2028"}',
    b'{"exit": 0, "stdout": "\\udcff\\udc80 ok", "stderr": "\\udcff \\ud800"}',
    b'{"stdout": "caf\xc3\xa9", "stderr": "b", "exit": 7, "extra": [1, {"y": null}], "z": 1.5e3}',
    b' {"exit": 0, "exit": 2, "stdout": "a", "stderr": ""} ',
    b'{"exit": -3, "stdout": "", "stderr": ""}', b'{"exit": 256, "stdout": "", "stderr": ""}',
    b'{"exit": -0, "stdout": "", "stderr": ""}',
    b'{"exit": 01, "stdout": "", "stderr": ""}', b'{"exit": 1.0, "stdout": "", "stderr": ""}',
    b'{"exit": true, "stdout": "", "stderr": ""}', b'{"exit": 0, "stdout": ""}', b"{", b"[1]",
    b"", b"nope", b'{"exit": 0, "stdout": "", "stderr": ""} x', b'{"exit": 0,}',
    b'{"exit": 0 "stdout": ""}', b'{"exit": 0, "stdout": "\\q", "stderr": ""}', b"{}",
    b'{"exit": 0, "stdout": "", "stderr": "\xff"}', b'{"exit": 0, "stdout": "\x01", "stderr": ""}',
    b'{"exit": 0, "stdout": "\\ud83d\\u12", "stderr": ""}', b'"text"', b"null",
    b'{"exit": 0, "stdout": "", "stderr": "", "n": NaN, "i": -Infinity}',
]


@pytest.mark.parametrize("reply", REPLIES, ids=range(len(REPLIES)))
def test_every_answer_is_read_as_the_python_client_reads_it(tmp_path, c_client_binary, reply):
    state = tmp_path / "state"
    outcomes = []
    for command in ([str(c_client_binary)], PYTHON_CLIENT):
        daemon = RecordingDaemon(state, reply + b"\n")
        try:
            done = run(command, ["createRuntime", "--state-dir", str(state)])
        finally:
            daemon.close()
        outcomes.append((done.returncode, done.stdout, done.stderr))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("reply", [None, b'{"exit": 0, "stdout": "' + b"x" * (200_000) + b'"'],
                         ids=["closed", "cut-short"])
def test_a_daemon_that_hangs_up_before_a_whole_line_fails_the_hook(tmp_path, c_client_binary,
                                                                   reply):
    state = tmp_path / "state"
    daemon = RecordingDaemon(state, reply)
    try:
        done = run([str(c_client_binary)], ["poststop", "--state-dir", str(state)])
    finally:
        daemon.close()
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode() == (
        f"nri-numa hook poststop: the hook daemon at {state}/hook.sock failed before "
        "answering: the connection closed before a whole line came\n")
    logged = (state / "hook.log").read_text()
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR hook\[\d+\] poststop: the "
                     r"hook daemon at .* failed before answering: the connection closed before "
                     r"a whole line came \(\d+ ms\)$", logged, re.M)


def test_more_stdin_than_the_daemon_takes_is_one_line_before_anything_is_sent(tmp_path,
                                                                             c_client_binary):
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    try:
        done = run([str(c_client_binary)], ["createRuntime", "--state-dir", str(state)],
                   b"{" * (client.MAX_LINE + 1))
    finally:
        daemon.close()
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"nri-numa hook createRuntime: the hook daemon at {state}/hook.sock failed before "
        f"answering: more than {client.MAX_LINE} bytes on stdin, which is no OCI state\n")
    assert daemon.requests in ([], [b""])  # connected, nothing sent


@pytest.mark.parametrize("client", ["c", "python"])
def test_a_closed_stdin_is_one_line_not_the_socket_read_as_stdin(tmp_path, c_client_binary,
                                                                 client):
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    command = [str(c_client_binary)] if client == "c" else PYTHON_CLIENT
    try:
        started = time.monotonic()
        done = subprocess.run(["sh", "-c", 'exec "$@" <&-', "sh", *command, "createRuntime",
                               "--state-dir", str(state), "--timeout", "5"],
                              capture_output=True, timeout=60)
        took = time.monotonic() - started
    finally:
        daemon.close()
    assert done.returncode == 1 and took < 4
    assert done.stderr.decode() == (
        f"nri-numa hook createRuntime: the hook daemon at {state}/hook.sock failed before "
        "answering: [Errno 9] Bad file descriptor\n")


@pytest.mark.parametrize("args", [
    ["createRuntime", "--timeout", " 8"], ["createRuntime", "--timeout", "1_0"],
    ["createRuntime", "--timeout", "nan"], ["createRuntime", "--timeout", "0x10"],
    ["createRuntime", "--timeout", "86401"], ["createRuntime", "--state"],
    ["createRuntime", "--start-daemon=1"], ["poststop", "poststop"], []])
def test_arguments_it_does_not_read_itself_go_to_the_full_hook_with_stdin_untouched(
        tmp_path, c_client_binary, args):
    """With a daemon listening, these never reach it from the C client: it execs the full
    hook, whose argparse or client judges them as without the C client."""
    state = tmp_path / "state"
    daemon = RecordingDaemon(state)
    try:
        ours = run([str(c_client_binary)], [*args, "--state-dir", str(state)], b"{}")
        theirs = run([sys.executable, "-m", "nri_numa", "hook"],
                     [*args, "--state-dir", str(state)], b"{}")
    finally:
        daemon.close()
    assert (ours.returncode, ours.stdout, ours.stderr) == \
        (theirs.returncode, theirs.stdout, theirs.stderr)


def test_a_socket_path_past_the_kernels_limit_is_one_line(tmp_path, c_client_binary):
    state = tmp_path / ("d" * (108 - len(str(tmp_path)) - len("/hook.sock")))
    done = run([str(c_client_binary)], ["createRuntime", "--state-dir", str(state)])
    theirs = run(PYTHON_CLIENT, ["createRuntime", "--state-dir", str(state)])
    assert (done.returncode, done.stderr) == (theirs.returncode, theirs.stderr) == (
        1, f"nri-numa hook createRuntime: cannot reach the hook daemon at {state}/hook.sock: "
           "AF_UNIX path too long\n".encode())


def test_the_constants_are_the_python_clients():
    source = c_client.SOURCE.read_text()
    for name in ("SOCKET_NAME", "LOG_NAME", "DEFAULT_STATE_DIR"):
        assert f'#define {name} {json.dumps(getattr(client, name))}' in source
    assert f'#define COUNTED {json.dumps(deadline.COUNTED)}' in source
    assert f"#define DEFAULT_TIMEOUT_S {client.DEFAULT_TIMEOUT_S!r}" in source
    assert f"#define MAX_TIMEOUT_S {client.MAX_TIMEOUT_S!r}" in source
    assert client.MAX_LINE == 64 << 20 and "#define MAX_LINE (64L << 20)" in source
    hint = re.search(r'#define DAEMON_HINT ((?:"[^\n]*"\s*\\?\s*)+)', source)[1]
    assert "".join(json.loads(s) for s in re.findall(r'"(?:[^"\\]|\\.)*"', hint)) == \
        deadline.DAEMON_HINT
    for stage in client.STAGES:
        assert f'"{stage}"' in source
    for flag, key in client.VALUE_OPTIONS.items():
        assert f'{{"{flag}", "{key}"}}' in source


def test_the_installed_package_carries_the_source_and_builds_it_without_the_tree(
        tmp_path, c_client_binary):
    """setuptools' build_py of a copy of the project (what a wheel holds) has the C file as
    package data, and the build command run from there, outside any checkout, makes a client
    that forwards (the compiler is there: the fixture built one)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (project / name).write_bytes((REPO / name).read_bytes())
    shutil.copytree(REPO / "nri_numa", project / "nri_numa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                    "build_py", "--build-lib", str(lib)], cwd=project, check=True,
                   capture_output=True)
    assert (lib / "nri_numa" / "hook" / "c_client" / "nri-numa-hook-client.c").is_file()
    built = tmp_path / "bin" / "client"
    built.parent.mkdir()
    done = subprocess.run([sys.executable, "-I", "-m", "nri_numa.hook.c_client", "--output",
                           str(built)], cwd=lib, capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, str(built)), done.stderr
    state = tmp_path / "state"
    request = request_of([str(built)], ["poststop", "--state-dir", str(state)], b"{}", state)
    assert json.loads(request)["stage"] == "poststop"


def test_a_build_that_cannot_be_done_says_why_in_one_line(tmp_path, c_client_binary):
    for args, said in ((["--cc", "no-such-cc"], "no C compiler found (no-such-cc)"),
                       (["--python", "python3"], "is not an absolute path"),
                       (["--python", '/o/"x'], "holds a character this build does not quote"),
                       (["--output", str(tmp_path / "none" / "x")], "is not a folder")):
        done = subprocess.run([sys.executable, "-m", "nri_numa.hook.c_client", *args],
                              capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 1 and done.stdout == ""
        [line] = done.stderr.splitlines()
        assert line.startswith("nri-numa hook client: ") and said in line


def test_with_no_daemon_it_becomes_the_fast_client_which_runs_the_hook_in_process(tmp_path):
    """The fallback is the interpreter on the installation's fast client, ``-I -S``, as the
    shipped Python hooks run it (not ``-m nri_numa hook`` with site's start); the hook then
    places the container in that process."""
    from nri_numa.topology.synthetic import preset_topology
    from tests.integration.hook.fake_host import FakeHost, oci_state, topology_file, write_bundle

    if c_client.find_compiler() is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build nri-numa-hook-client")
    seen = tmp_path / "argv"
    python = tmp_path / "python3"  # records how the client runs it, then is the interpreter
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {seen}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    built = c_client.build(tmp_path / c_client.BINARY_NAME, str(python))
    seen.unlink()  # the build asked the interpreter where its fast client is

    topology = preset_topology("intel-2s-ht")
    host = FakeHost(tmp_path / "host", 1, topology.online_cpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}))
    args = ["createRuntime", "--state-dir", str(tmp_path / "state"), "--config", str(config),
            "--topology", str(topology_file(tmp_path, topology)),
            "--cgroup-root", str(host.cgroup_root), "--proc-root", str(host.proc)]
    bundle = write_bundle(host.base, "c1", 1)
    host.start(4242, "/pods/c1")
    done = run([str(built)], args, oci_state("c1", 4242, bundle))
    assert done.returncode == 0, done.stderr
    assert seen.read_text().splitlines() == [
        "-I", "-S", str((REPO / "nri_numa" / "hook" / "fast_client.py").resolve()), *args]
    assert len(host.cpus("/pods/c1")) == 1

"""The hook's fast paths as a runtime runs them: the Python fast client (`python3 -I -S
nri_numa/hook/fast_client.py STAGE ...`) and the C client (nri-numa-hook-client, built from
nri_numa/hook/c_client), each test once per client. Real processes, a real `nri-numa
hook-daemon` on a real unix socket in a temp folder, stdin, stderr and the exit status."""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nri_numa.hook.client import SOCKET_NAME
from nri_numa.hook.entry import LOG_NAME
from tests.integration.hook.fake_host import oci_state
from tests.integration.hook.test_hook_daemon import (create, daemon_setup, exclusive_cpus,
                                                     start_daemon)
from tests.integration.hook.test_hook_daemon_start import (bound_socket, daemon_pids,
                                                           stop_daemons, wait_for_log)

REPO = Path(__file__).resolve().parents[3]
FAST = [sys.executable, "-I", "-S", str(REPO / "nri_numa" / "hook" / "fast_client.py")]


@pytest.fixture(params=["python", "c"])
def client(request) -> list[str]:
    """The command that runs a fast client: the Python one, or the C one."""
    if request.param == "python":
        return FAST
    return [str(request.getfixturevalue("c_client_binary"))]


@pytest.fixture
def fast(client):
    """Runs the client under test as a runtime runs a hook."""
    return functools.partial(run_client, client)


@pytest.fixture
def setup(tmp_path):
    host, state, served, args = daemon_setup(tmp_path)
    yield host, state, served, args
    stop_daemons(state)  # one a test had started by --start-daemon


@pytest.fixture
def daemon(setup):
    _, state, served, _ = setup
    process = start_daemon(served, state)
    yield process
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=10)


def run_client(client: list[str], stage: str, args: list[str], stdin: bytes,
               timeout: float = 8.0) -> subprocess.CompletedProcess:
    # cwd: a folder of no interest, as a runtime runs a hook in the bundle.
    return subprocess.run([*client, stage, *args, "--timeout", str(timeout)], input=stdin,
                          capture_output=True, cwd="/", timeout=60)


def one_line(text: bytes, stage: str = "createRuntime") -> str:
    lines = text.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"nri-numa hook {stage}: ")
    return lines[0]


def test_the_daemon_runs_the_hook_and_the_client_relays_it(setup, daemon, fast):
    host, state, _, args = setup
    done = fast("createRuntime", args, create(host, "c1", 5001, 3))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert len(exclusive_cpus(host, state)["c1"]) == 3
    assert f"hook[{daemon.pid}] createRuntime: placed container c1" in (state / LOG_NAME).read_text()
    host.stop(5001)
    done = fast("poststop", args, oci_state("c1", None, host.base))
    assert done.returncode == 0, done.stderr
    assert exclusive_cpus(host, state) == {}


def test_a_refusal_is_the_hooks_exit_status_and_one_line(setup, daemon, tmp_path, fast):
    host, _, _, args = setup
    other = tmp_path / "other.json"
    other.write_text("{}")
    done = fast("createRuntime", [*args, "--config", str(other)], create(host, "c1", 5001, 1))
    assert done.returncode == 1
    assert "the hook daemon serves --config" in one_line(done.stderr)


@pytest.mark.parametrize("stdin", [b"", b"not json \xff\xfe", b'{"id": "c1"}'])
def test_bad_stdin_is_one_line(setup, daemon, stdin, fast):
    _, _, _, args = setup
    done = fast("createRuntime", args, stdin)
    assert done.returncode == 1 and done.stdout == b""
    one_line(done.stderr)


def test_without_a_daemon_the_full_hook_runs_in_this_process(setup, client):
    host, state, _, args = setup
    process = subprocess.Popen([*client, "createRuntime", *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    out, err = process.communicate(create(host, "c1", 5001, 2), timeout=60)
    assert (process.returncode, out, err) == (0, b"", b"")
    # The same process (exec): its pid is the one that logged the run, and no daemon ran it.
    assert f"hook[{process.pid}] createRuntime: placed container c1" in \
        (state / LOG_NAME).read_text()
    assert len(exclusive_cpus(host, state)["c1"]) == 2 and daemon_pids(state) == []


def test_a_socket_nobody_listens_on_means_no_daemon(setup, fast):
    host, state, _, args = setup
    state.mkdir(parents=True)
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(state / SOCKET_NAME))  # bound, never listening: refused, as a dead daemon's
    try:
        done = fast("createRuntime", args, create(host, "c1", 5001, 1))
    finally:
        left.close()
    assert done.returncode == 0, done.stderr
    assert "c1" in exclusive_cpus(host, state)


def test_start_daemon_starts_one_and_hands_it_the_run(setup, fast):
    host, state, _, args = setup
    done = fast("createRuntime", [*args, "--start-daemon"], create(host, "c1", 5001, 2))
    assert done.returncode == 0, done.stderr
    [pid] = daemon_pids(state)
    log = wait_for_log(state, "(socket handed over)")
    assert f"hook[{pid}] createRuntime: placed container c1" in log
    done = fast("createRuntime", [*args, "--start-daemon"], create(host, "c2", 5002, 2))
    assert done.returncode == 0, done.stderr
    assert daemon_pids(state) == [pid]
    assert f"hook[{pid}] createRuntime: placed container c2" in (state / LOG_NAME).read_text()


def test_a_daemon_that_never_answers_fails_the_hook_at_its_timeout(setup, fast):
    host, state, _, args = setup
    listener = bound_socket(state / SOCKET_NAME)  # connections wait in its backlog forever
    try:
        started = time.monotonic()
        done = fast("createRuntime", args, create(host, "c1", 5001, 1), timeout=1.0)
        took = time.monotonic() - started
    finally:
        listener.close()
    assert done.returncode == 1 and took < 5
    line = one_line(done.stderr)
    assert "1 s" in line and "--timeout" in line
    assert line.split(": ", 1)[1] in (state / LOG_NAME).read_text()


def test_stdin_left_open_gives_up_at_the_timeout_saying_so(setup, client):
    _, state, _, args = setup
    listener = bound_socket(state / SOCKET_NAME)
    try:
        process = subprocess.Popen([*client, "poststop", *args, "--timeout", "1"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, cwd="/")
        process.wait(timeout=10)  # stdin stays open: never written, never closed
        err = process.stderr.read()
    finally:
        listener.close()
        process.stdin.close()
    assert process.returncode == 1
    assert one_line(err, "poststop").endswith(
        "gave up after 1 s (--timeout, counted from the start of the hook process) while "
        "reading the OCI state on stdin")


@pytest.mark.parametrize("extra, code, where, said", [
    (["--bogus"], 2, "stderr", b"nri-numa: error: unrecognized arguments: --bogus"),
    (["--help"], 0, "stdout", b"usage: nri-numa hook"),
    (["--timeout", "0"], 1, "stderr", b"timeout must be positive")])
def test_arguments_argparse_must_judge_go_to_the_full_hook(setup, client, extra, code, where,
                                                         said):
    _, _, _, args = setup
    done = subprocess.run([*client, "createRuntime", *args, *extra], capture_output=True,
                          cwd="/", timeout=60)
    assert done.returncode == code
    assert said in getattr(done, where)


def test_with_a_daemon_the_fast_path_loads_the_client_alone(setup, daemon):
    """What a run the daemon takes loads of nri_numa: the client and its deadline, no engine,
    no command line (the rest loads only for a run in process)."""
    host, _, _, args = setup
    done = subprocess.run([*FAST[:1], "-X", "importtime", *FAST[1:], "createRuntime", *args],
                          input=create(host, "c1", 5001, 0), capture_output=True, cwd="/",
                          timeout=60)
    assert done.returncode == 0
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines()
              if line.startswith("import time:") and "|" in line}
    assert {name for name in loaded if name.startswith("nri_numa")} == {
        "nri_numa", "nri_numa.cli", "nri_numa.hook", "nri_numa.hook.client",
        "nri_numa.hook.deadline", "nri_numa.hook.state_folder"}
    assert "argparse" not in loaded


SITE_FOLDERS = ("import sys; sys.path.append(sys.argv[1]); import fast_forward; "
                "print('\\n'.join(fast_forward.site_folders()))")


def _lines(command: list[str]) -> list[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("system_packages", [False, True])
def test_the_hook_in_process_sees_its_venvs_packages(tmp_path, system_packages):
    """Under -I -S a venv's interpreter has the base installation's prefix, and Debian's site
    then names none of the venv's folders: the full hook run in the fast client's process (its
    config's YAML parser, NVML's bindings live there) still gets the folders site itself gives
    that interpreter, the venv's and, where the venv includes them, the base installation's."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv),
                    *(["--system-site-packages"] if system_packages else [])], check=True)
    python = str(venv / "bin" / "python")
    ours = _lines([python, "-I", "-S", "-c", SITE_FOLDERS, str(REPO / "nri_numa" / "hook")])
    standard = _lines([python, "-I", "-S", "-c", "import sys; print('\\n'.join(sys.path))"])
    with_site = _lines([python, "-I", "-c", "import sys; print('\\n'.join(sys.path))"])
    assert ours == [p for p in with_site if p not in standard]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert ours[0] == f"{venv}/lib/{version}/site-packages"
    if not system_packages:
        assert ours == [f"{venv}/lib/{version}/site-packages"]

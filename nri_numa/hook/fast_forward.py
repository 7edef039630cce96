"""Forwarding one hook run to ``nri-numa hook-daemon`` from a bare interpreter: the work of the
hook's fast path (nri_numa/hook/fast_client.py, the file the hooks run, imports this as a
top-level module from its folder).

The hook runs under ``python3 -I -S``, which skips ``site`` (an editable install's path finder
alone costs ~13 ms) and every user path, so nothing of nri_numa can be imported here: this
module is the whole client, and it loads only built-in modules (``posix``, ``_socket``,
``_json``), none of ``os``, ``socket`` (which loads ``enum`` and ``selectors``), ``json``
(``re``), ``argparse`` or ``typing``. bench/bench_hook.py measures it against ``nri-numa hook``.

It speaks the wire of nri_numa.hook.client and keeps its rules: the same arguments, one JSON
line each way, ``--timeout`` counted from the process's start with the same give-up lines on
stderr and in the hook log, and a daemon that accepted the run is final (a daemon that dies or
stalls fails the hook closed). When nobody accepts on ``<state-dir>/hook.sock``, or the
arguments are anything but a plain hook run (``--help``, a bad option), this process goes on as
the full ``nri-numa hook`` with the same arguments and the stdin untouched (``run_full_hook``):
that runs the stage in process, or with ``--start-daemon`` starts the daemon, exactly as
without the fast path, and the deadline still counts from the process's start.
"""

import _json
import _signal
import _socket
import posix
import sys
import time

SOCKET_NAME = "hook.sock"
LOG_NAME = "hook.log"
DEFAULT_STATE_DIR = "/run/nri-numa"
DEFAULT_TIMEOUT_S = 4.0
MAX_TIMEOUT_S = 86400.0
MAX_LINE = 64 << 20  # as nri_numa.hook.client.MAX_LINE: the daemon drops a longer request
STAGES = ("createRuntime", "prestart", "poststop", "precreate")
VALUE_OPTIONS = {"--state-dir": "state_dir", "--config": "config", "--topology": "topology",
                 "--log-file": "log_file", "--timeout": "timeout",
                 "--cgroup-root": "cgroup_root", "--proc-root": "proc_root"}
FLAG_OPTIONS = ("--start-daemon",)
# The give-up wording of nri_numa.hook.deadline, which a test keeps in step with this.
COUNTED = "(--timeout, counted from the start of the hook process)"
DAEMON_HINT = ('the hook daemon had more runs queued than it could serve in that time '
               '(docs/oci-hook.md, "Burst-proof setup")')
_START_TIME_FIELD = 22  # /proc/PID/stat, 1-based; clock ticks after boot
_FOLDER_FLAGS = posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC
_LOG_FLAGS = (posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT | posix.O_NOFOLLOW
              | posix.O_CLOEXEC | posix.O_NONBLOCK)
_S_IFMT, _S_IFREG, _S_IFDIR = 0o170000, 0o100000, 0o040000


class ProtocolError(Exception):
    """A reply that is not what the daemon must send."""


class NotPlain(Exception):
    """A reply outside the small form read here: json decides it."""


def parse_args(args):
    """(stage, options, start_daemon) from ``hook``'s arguments; None for anything argparse
    must judge. The rules of nri_numa.hook.client.parse_hook_args."""
    stage = None
    options = {}
    start_daemon = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, eq, value = arg.partition("=")
        if arg in FLAG_OPTIONS:
            start_daemon = True
        elif name in VALUE_OPTIONS:
            if not eq:
                if i >= len(args):
                    return None
                value = args[i]
                i += 1
            options[VALUE_OPTIONS[name]] = value
        elif arg in STAGES and stage is None:
            stage = arg
        else:
            return None
    return None if stage is None else (stage, options, start_daemon)


def hook_timeout(options):
    """``--timeout`` in seconds; None when argparse must word the error."""
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError:
        return None
    return timeout if 0 < timeout <= MAX_TIMEOUT_S else None


def join(folder, name):
    return folder + name if not folder or folder.endswith("/") else folder + "/" + name


def process_started():
    """When this process started, as a ``time.monotonic()`` value (now when unknown)."""
    now = time.monotonic()
    try:
        fd = posix.open("/proc/self/stat", posix.O_RDONLY | posix.O_CLOEXEC)
        try:
            text = posix.read(fd, 4096)
        finally:
            posix.close(fd)
        ticks = int(text.rpartition(b")")[2].split()[_START_TIME_FIELD - 3])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / posix.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - max(age, 0.0)


def encode_request(stage, stdin, options):
    """The request line, byte for byte what nri_numa.hook.client.encode_request sends."""
    text = stdin.decode("utf-8", "surrogateescape")
    fields = ", ".join(f"{_json.encode_basestring_ascii(k)}: {_value(v)}"
                       for k, v in options.items())
    return (f'{{"stage": {_json.encode_basestring_ascii(stage)}, '
            f'"stdin": {_json.encode_basestring_ascii(text)}, "options": {{{fields}}}}}\n'
            ).encode("ascii")


def _value(value):
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    return float.__repr__(value)  # "started": json writes a float as its repr


def decode_reply(line):
    """(exit, stdout, stderr) from the daemon's answer; ProtocolError otherwise."""
    try:
        reply = _flat_object(line.decode("utf-8"))
    except (NotPlain, UnicodeDecodeError):
        import json  # only for an answer outside the plain form the daemon writes

        try:
            reply = json.loads(line)
        except ValueError:
            raise ProtocolError("the hook daemon's answer is not JSON") from None
        if not isinstance(reply, dict):
            raise ProtocolError("the hook daemon's answer is not a JSON object")
    code, out, err = reply.get("exit"), reply.get("stdout"), reply.get("stderr")
    if isinstance(code, bool) or not isinstance(code, int) or not isinstance(out, str) \
            or not isinstance(err, str):
        raise ProtocolError("the hook daemon's answer lacks exit, stdout or stderr")
    return code, out, err


_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"


def _flat_object(text):
    """A JSON object whose values are strings or integers, as json.loads reads it; NotPlain
    for anything else (json then decides, so the two never disagree)."""
    i = _skip(text, 0)
    if text[i:i + 1] != "{":
        raise NotPlain()
    found = {}
    i = _skip(text, i + 1)
    if text[i:i + 1] == "}":
        i += 1
    else:
        while True:
            if text[i:i + 1] != '"':
                raise NotPlain()
            key, i = _string(text, i + 1)
            i = _skip(text, i)
            if text[i:i + 1] != ":":
                raise NotPlain()
            i = _skip(text, i + 1)
            if text[i:i + 1] == '"':
                found[key], i = _string(text, i + 1)
            else:
                found[key], i = _integer(text, i)
            i = _skip(text, i)
            mark = text[i:i + 1]
            i = _skip(text, i + 1)
            if mark == "}":
                break
            if mark != ",":
                raise NotPlain()
    if _skip(text, i) != len(text):
        raise NotPlain()
    return found


def _skip(text, i):
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _string(text, i):
    try:
        return _json.scanstring(text, i, True)
    except (ValueError, SystemError):
        # SystemError: under -I -S, with json not yet imported, scanstring fails to build its
        # JSONDecodeError for a bad string and raises that instead; json then words it.
        raise NotPlain() from None


def _integer(text, i):
    start = i
    if text[i:i + 1] == "-":
        i += 1
    first = i
    while i < len(text) and text[i] in _DIGITS:
        i += 1
    digits = text[first:i]
    if not digits or (digits[0] == "0" and len(digits) > 1) or text[i:i + 1] in (".", "e", "E"):
        raise NotPlain()
    return int(text[start:i]), i


def read_line(conn):
    """One newline-terminated line; ProtocolError when the peer closes first."""
    chunks = []
    size = 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ProtocolError("the connection closed before a whole line came")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")


def read_stdin(fd=0):
    """Everything on stdin, up to MAX_LINE bytes; ProtocolError past that."""
    chunks = []
    size = 0
    while True:
        chunk = posix.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_LINE:
            raise ProtocolError(f"more than {MAX_LINE} bytes on stdin, which is no OCI state")


def log_line(path, stage, line, level="ERROR"):
    """Append one line to the hook log as nri_numa.hook.deadline.log_line does: never through
    a symlink, never waiting on a FIFO; a log that cannot be written is skipped."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    text = f"{stamp} {level} hook[{posix.getpid()}] {stage}: {line}\n".encode("utf-8", "replace")
    folder_path, slash, name = path.rpartition("/")
    try:
        folder = _open_folder((folder_path or "/") if slash else ".")
        try:
            fd = posix.open(name, _LOG_FLAGS, 0o600, dir_fd=folder)
        finally:
            posix.close(folder)
    except OSError:
        return
    try:
        if posix.fstat(fd).st_mode & _S_IFMT == _S_IFREG:
            posix.write(fd, text)
    except OSError:
        pass
    finally:
        posix.close(fd)


def _open_folder(path):
    """The folder ``path``, made (0700, with its parents) when missing, as
    nri_numa.hook.state_folder.open_state_folder opens it."""
    try:
        return posix.open(path, _FOLDER_FLAGS)
    except FileNotFoundError:
        parent = path.rstrip("/").rpartition("/")[0]
        if parent:
            posix.close(_open_folder(parent))
        try:
            posix.mkdir(path, 0o700)
        except FileExistsError:
            pass
    return posix.open(path, _FOLDER_FLAGS)


class Run:
    """One forwarded hook run: its deadline, what it is doing (for the give-up line) and its
    log."""

    def __init__(self, stage, timeout, log_path, started):
        self.stage = stage
        self.timeout = timeout
        self.log_path = log_path
        self.started = started
        self.phase = "starting up (Python and nri-numa)"
        self.hint = ""

    def left(self):
        return self.timeout - (time.monotonic() - self.started)

    def elapsed_ms(self):
        return (time.monotonic() - self.started) * 1000

    def arm(self):
        _signal.signal(_signal.SIGALRM, self._expire)
        _signal.setitimer(_signal.ITIMER_REAL, max(self.left(), 0.001))

    def disarm(self):
        # An interval timer survives execve, and the exec'd process would die of its SIGALRM.
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)

    def _expire(self, signum, frame):
        line = f"gave up after {self.timeout:g} s {COUNTED} while {self.phase}"
        if self.hint:
            line = f"{line}: {self.hint}"
        try:
            sys.stderr.write(f"nri-numa hook {self.stage}: {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        log_line(self.log_path, self.stage, f"{line} ({self.elapsed_ms():.0f} ms)")
        posix._exit(1)

    def fail(self, reason):
        print(f"nri-numa hook {self.stage}: {reason}", file=sys.stderr, flush=True)
        log_line(self.log_path, self.stage, f"{reason} ({self.elapsed_ms():.0f} ms)")
        return 1


def run_full_hook(args):
    """``nri-numa hook ARGS`` in this process: the stage run here, or a daemon started
    (``--start-daemon``), or argparse's answer to ``--help`` or a bad option. The interpreter
    stays as the hook started it (``-I -S``): after the standard library, sys.path gets the
    package's folder, then the site-packages ``site`` would add (``site_folders``), without
    ``site``'s own start (.pth files, an editable install's finder: 13-20 ms of each run on the
    project's VM). What pathlib loads for Windows paths and URIs waits until used
    (``defer_path_extras``). Running here rather than exec'ing a new interpreter saves its
    start, 15-20 ms there; the deadline counts from this process's start either way."""
    sys.stdout.flush()
    sys.stderr.flush()
    here = __file__.rpartition("/")[0] or "."
    if here in sys.path:  # fast_client.py put it there: its modules are not top-level ones
        sys.path.remove(here)
    # After the standard library, whose every import would otherwise look in this folder first.
    sys.path.append(package_root())
    sys.path.extend(p for p in site_folders() if p not in sys.path)
    defer_path_extras()
    from nri_numa.cli import after_fast_client

    return after_fast_client(args)


# What pathlib, which all of nri-numa uses, imports for what a hook never does: Windows paths
# (ntpath, which first tries to import nt and _winapi) and Path.as_uri (urllib.parse, which
# loads ipaddress). ~4 ms of each run in process on the project's VM.
DEFERRED = {"ntpath": (), "urllib.parse": ("quote_from_bytes",)}


class Deferred(type(sys)):
    """A stand-in for a module, in its place in sys.modules until anything of it is used: then
    the real module is imported, takes that place, and answers."""

    def __getattr__(self, name):
        if name == "__path__":  # the import system asking whether it is a package: neither is
            raise AttributeError(name)
        return getattr(real_module(self.__name__), name)


def real_module(name):
    if type(sys.modules.get(name)) is Deferred:
        del sys.modules[name]
    __import__(name)
    return sys.modules[name]


def _deferred_function(module, name):
    """What ``from module import name`` binds while the module is deferred."""
    def call(*args, **kwargs):
        return getattr(real_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def defer_path_extras():
    """Put the stand-ins of DEFERRED in sys.modules (and on their packages), unless loaded."""
    for name, functions in DEFERRED.items():
        if name in sys.modules:
            continue
        stand_in = Deferred(name)
        for function in functions:
            setattr(stand_in, function, _deferred_function(name, function))
        package, _, leaf = name.rpartition(".")
        if package:
            __import__(package)
            setattr(sys.modules[package], leaf, stand_in)
        sys.modules[name] = stand_in


def site_folders():
    """The site-packages folders ``site`` would put on sys.path (those that exist), named by
    ``site`` imported under ``-S`` (which starts nothing). In a venv (a pyvenv.cfg beside the
    interpreter or one folder up, as ``site`` looks), the venv's, and the base installation's
    too where the venv includes them. Under ``-S`` nothing made sys.prefix the venv's, which
    ``site`` does first (and Debian's ``site`` names a venv's site-packages only then): so does
    this."""
    import site

    bin_folder = sys.executable.rpartition("/")[0]
    venv = bin_folder.rpartition("/")[0]
    prefixes = None
    for folder in (bin_folder, venv):
        try:
            with open(join(folder, "pyvenv.cfg"), encoding="utf-8") as f:
                settings = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        sys.prefix = sys.exec_prefix = venv
        prefixes = [venv, sys.base_prefix] if _includes_system_packages(settings) else [venv]
        break
    return [p for p in site.getsitepackages(prefixes) if _is_folder(p)]


def _is_folder(path):
    try:
        return posix.stat(path).st_mode & _S_IFMT == _S_IFDIR
    except OSError:
        return False


def _includes_system_packages(settings):
    for line in settings.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False


def package_root():
    """The folder that holds the nri_numa package this file belongs to."""
    here = __file__ if __file__.startswith("/") else join(posix.getcwd(), __file__)
    return here.rsplit("/", 3)[0] or "/"


def forward(args, stdin_fd=0):
    """The exit status of the run the daemon did; None when this process must run the full
    hook (no daemon, or arguments for argparse to judge)."""
    parsed = parse_args(args)
    timeout = None if parsed is None else hook_timeout(parsed[1])
    if timeout is None:
        return None
    stage, options, _ = parsed
    state_dir = options.get("state_dir", DEFAULT_STATE_DIR)
    run = Run(stage, timeout, options.get("log_file") or join(state_dir, LOG_NAME),
              process_started())
    run.arm()
    try:
        run.phase = "looking for the hook daemon"
        path = join(state_dir, SOCKET_NAME)
        try:  # a closed stdin, before the socket can take its number and be read as it
            posix.fstat(stdin_fd)
            no_stdin = None
        except OSError as e:
            no_stdin = e
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            conn.settimeout(max(run.left(), 0.001))
            try:
                conn.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                return None
            except OSError as e:
                return run.fail(f"cannot reach the hook daemon at {path}: {e}")
            # The daemon counts the time spent before it took the request from here.
            options["started"] = time.time() - (time.monotonic() - run.started)
            try:
                run.phase = "reading the OCI state on stdin"
                if no_stdin is not None:
                    raise no_stdin
                request = encode_request(stage, read_stdin(stdin_fd), options)
                run.phase, run.hint = "waiting for the hook daemon's answer", DAEMON_HINT
                conn.settimeout(max(run.left(), 0.001))
                conn.sendall(request)
                code, out, err = decode_reply(read_line(conn))
            except TimeoutError:
                return run.fail(f"no answer from the hook daemon at {path} within "
                                f"{timeout:g} s (--timeout)")
            except (OSError, ProtocolError) as e:
                return run.fail(f"the hook daemon at {path} failed before answering: {e}")
        finally:
            conn.close()
        sys.stdout.write(out)
        sys.stdout.flush()
        sys.stderr.write(err)
        sys.stderr.flush()
        return code
    finally:
        run.disarm()


def main(args):
    code = forward(args)
    return run_full_hook(args) if code is None else code

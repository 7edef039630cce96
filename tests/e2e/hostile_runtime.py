"""A hostile NRI runtime for the real `nri-numa run` process: seeded, bounded cases of garbage,
truncated frames, oversized length fields and random bytes, sent over the runtime side of the
tests' fake runtime (tests/integration/nri/fake_runtime.py, which has its own framing code).
Every random choice is drawn when a case is made, so a seed gives the same cases.

Three kinds of case, by what they do to a connection:

* ``before_registration``: bytes the plugin meets before the runtime has accepted it; each ends
  its connection. Few of them: the plugin's waits between attempts grow until a runtime takes it
  in (Synchronize), and these never do.
* ``survivable``: sent on one registered, synchronized connection, which must stay up: garbage
  envelopes, mutated messages for real methods, well-formed messages with odd values
  (integration/nri/odd_requests.py), frames for unknown connections, zero-length
  frames, bad stream ids, responses nobody asked for, legal but odd framing. After each one the
  runtime checks the plugin still answers (Configure).
* ``session_enders``: sent on a fresh synchronized connection each, which they end: frame lengths
  over the 16 MiB limit, frames or headers cut short by EOF, random byte streams, a ttrpc length
  over 4 MiB.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from dataclasses import dataclass

from nri_numa.nri.pb import api_pb2, ttrpc_pb2
from tests import nri_messages as msg
from tests.integration.nri.fake_runtime import FRAME, PLUGIN, TTRPC, FakeRuntime
from tests.integration.nri.odd_requests import odd_event

MAX_FRAME = 16 << 20  # the plugin's limit on an incoming frame
MAX_MESSAGE = 4 << 20  # ttrpc's limit on a message
REQUEST, RESPONSE, DATA = 1, 2, 3
EVENTS = 0x6CF  # what the plugin subscribes to: its answer to Configure
# Methods whose mutated requests cannot change how the plugin is configured or end the session.
FUZZED_METHODS = ("CreateContainer", "UpdateContainer", "StopContainer", "StateChange")


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[HostileRuntime], object]  # what it returns is not used


def _garbage(rng: random.Random, low: int, high: int) -> bytes:
    return rng.randbytes(rng.randint(low, high))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    """Random bytes replaced, inserted or cut off: mostly-valid protobuf."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        action = rng.random()
        at = rng.randrange(len(out) + 1)
        if action < 0.6 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif action < 0.9:
            out[at:at] = rng.randbytes(rng.randint(1, 16))
        else:
            del out[at:]
    return bytes(out)


def _valid_request(rng: random.Random, method: str) -> bytes:
    sandbox = msg.pod(f"fuzz{rng.randrange(1000)}", rng.choice(["guaranteed", "besteffort"]))
    millis = rng.randint(1, 2) * 1000
    container = msg.container(sandbox, "c", cpu=millis, cpu_limit=millis, memory=1 << 26,
                              cpus="0-1", mems="0", state=api_pb2.CONTAINER_RUNNING)
    if method == "CreateContainer":
        return msg.create(sandbox, container).SerializeToString()
    if method == "UpdateContainer":
        return api_pb2.UpdateContainerRequest(pod=sandbox, container=container).SerializeToString()
    if method == "StopContainer":
        return api_pb2.StopContainerRequest(pod=sandbox, container=container).SerializeToString()
    return msg.event(rng.choice([api_pb2.REMOVE_CONTAINER, api_pb2.STOP_POD_SANDBOX]), sandbox,
                     container).SerializeToString()


def _envelope(method: str, payload: bytes) -> bytes:
    return ttrpc_pb2.Request(service=PLUGIN, method=method, payload=payload,
                             timeout_nano=2_000_000_000).SerializeToString()


class HostileRuntime(FakeRuntime):
    """The fake runtime, plus stream ids for requests it sends by hand."""

    def take_stream(self) -> int:
        with self._lock:
            stream = self._next_stream
            self._next_stream += 2
        return stream


def _answered(runtime: HostileRuntime, stream: int) -> ttrpc_pb2.Response:
    return runtime.wait_response(stream, timeout=3.0)


def _request(runtime: HostileRuntime, body: bytes) -> ttrpc_pb2.Response:
    """The plugin's answer (any status) to a request envelope ``body`` on a new stream."""
    stream = runtime.take_stream()
    runtime.send_message(1, stream, REQUEST, body)
    return _answered(runtime, stream)


# --- survivable -------------------------------------------------------------------------------


def _garbage_envelope(rng: random.Random) -> Case:
    body = _garbage(rng, 0, 300)
    return Case("garbage request envelope", lambda r: _request(r, body))


def _mutated_method(rng: random.Random) -> Case:
    method = rng.choice(FUZZED_METHODS)
    body = _envelope(method, _mutate(rng, _valid_request(rng, method)))
    return Case(f"mutated {method}", lambda r: _request(r, body))


def _odd_values(rng: random.Random) -> Case:
    method, request = odd_event(rng)
    while method == "Synchronize":  # one that fails ends the session, by design
        method, request = odd_event(rng)
    body = _envelope(method, request.SerializeToString())
    return Case(f"{method} with odd values", lambda r: _request(r, body))


def _unknown_method(rng: random.Random) -> Case:
    service = rng.choice([PLUGIN, "nri.pkg.api.v1alpha1.Runtime", rng.randbytes(8).hex()])
    method = rng.choice(["Nope", "", rng.randbytes(6).hex()])
    body = ttrpc_pb2.Request(service=service, method=method,
                             payload=_garbage(rng, 0, 64)).SerializeToString()

    def run(runtime: HostileRuntime) -> None:
        assert _request(runtime, body).status.code == 12  # UNIMPLEMENTED

    return Case("unknown service or method", run)


def _unknown_connection(rng: random.Random) -> Case:
    conn = rng.randint(3, 0xFFFFFFFF)
    data = _garbage(rng, 1, 4096)
    return Case("frame for an unknown connection", lambda r: r.send_payload(conn, data))


def _zero_length_frame(rng: random.Random) -> Case:
    conn = rng.choice([1, 2])
    return Case("zero-length frame", lambda r: r.send_raw(FRAME.pack(conn, 0)))


def _bad_stream_id(rng: random.Random) -> Case:
    body = _envelope("CreateContainer", _valid_request(rng, "CreateContainer"))
    even = rng.random() < 0.5

    def run(runtime: HostileRuntime) -> None:
        if even:
            stream = runtime.take_stream() - 1  # even, and below the counter: moves nothing
            runtime.send_message(1, stream, REQUEST, body)
            assert _answered(runtime, stream).status.code == 3  # INVALID_ARGUMENT
        else:  # a used odd id: the old answer is already there, the ping shows the rest
            runtime.send_message(1, max(1, runtime.take_stream() - 2), REQUEST, body)

    return Case("even or reused stream id", run)


def _wrong_message_type(rng: random.Random) -> Case:
    conn, kind = rng.choice([(1, RESPONSE), (1, DATA), (2, RESPONSE), (2, DATA), (2, REQUEST)])
    stream = rng.randrange(1, 1 << 20) * 2 + 1
    body = _garbage(rng, 0, 200)

    def run(runtime: HostileRuntime) -> None:
        runtime.send_payload(conn, TTRPC.pack(len(body), stream + 10_000_000, kind, 0) + body)

    return Case("response, data or stray request where none belongs", run)


def _odd_framing(rng: random.Random) -> Case:
    body = _envelope("CreateContainer", _valid_request(rng, "CreateContainer"))
    size = TTRPC.size + len(body)
    cuts = sorted(rng.sample(range(1, size), k=min(size - 1, rng.randint(1, 12))))

    def run(runtime: HostileRuntime) -> None:
        stream = runtime.take_stream()
        message = TTRPC.pack(len(body), stream, REQUEST, 0) + body
        pieces = [message[a:b] for a, b in zip([0, *cuts], [*cuts, size])]
        runtime.send_raw(b"".join(FRAME.pack(1, len(p)) + p for p in pieces))
        _answered(runtime, stream)

    return Case("a request cut into many small frames", run)


SURVIVABLE = (_garbage_envelope, _mutated_method, _odd_values, _odd_values, _unknown_method,
              _unknown_connection, _zero_length_frame, _bad_stream_id, _wrong_message_type,
              _odd_framing)


def survivable(rng: random.Random, count: int) -> list[Case]:
    return [rng.choice(SURVIVABLE)(rng) for _ in range(count)]


def ping(runtime: HostileRuntime) -> None:
    """The plugin still serves this connection."""
    assert runtime.configure().events == EVENTS


# --- session enders ---------------------------------------------------------------------------


def _end_writing(runtime: HostileRuntime) -> None:
    try:
        runtime.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the plugin closed first


def _huge_frame(rng: random.Random) -> Case:
    conn = rng.choice([1, 2, rng.randint(3, 99)])
    data = FRAME.pack(conn, rng.randint(MAX_FRAME + 1, 0xFFFFFFFF)) + _garbage(rng, 0, 64)
    return Case("frame length over 16 MiB", lambda r: r.send_raw(data))


def _truncated_frame(rng: random.Random) -> Case:
    length = rng.randint(11, 4096)
    data = FRAME.pack(1, length) + _garbage(rng, 0, length - 1)

    def run(runtime: HostileRuntime) -> None:
        runtime.send_raw(data)
        _end_writing(runtime)

    return Case("frame cut short by EOF", run)


def _truncated_header(rng: random.Random) -> Case:
    data = FRAME.pack(1, rng.randint(1, 4096))[: rng.randint(1, 7)]

    def run(runtime: HostileRuntime) -> None:
        runtime.send_raw(data)
        _end_writing(runtime)

    return Case("frame header cut short by EOF", run)


def _random_stream(rng: random.Random) -> Case:
    data = _garbage(rng, 16, 512)

    def run(runtime: HostileRuntime) -> None:
        runtime.send_raw(data)
        _end_writing(runtime)

    return Case("random bytes", run)


def _huge_message(rng: random.Random) -> Case:
    length, rest = rng.randint(MAX_MESSAGE + 1, 0xFFFFFFFF), _garbage(rng, 0, 64)

    def run(runtime: HostileRuntime) -> None:
        stream = runtime.take_stream()
        runtime.send_payload(1, TTRPC.pack(length, stream, REQUEST, 0) + rest)
        assert _answered(runtime, stream).status.code == 8  # RESOURCE_EXHAUSTED, body skipped
        _end_writing(runtime)

    return Case("ttrpc length over 4 MiB", run)


ENDERS = (_huge_frame, _truncated_frame, _truncated_header, _random_stream, _huge_message)


def session_enders(rng: random.Random, count: int) -> list[Case]:
    return [ENDERS[i % len(ENDERS)](rng) for i in range(count)]


def before_registration(rng: random.Random) -> list[Callable[[socket.socket], None]]:
    """Raw sends on a just-accepted connection, before any registration is answered."""
    noise, frame = _garbage(rng, 8, 256), FRAME.pack(2, rng.randint(MAX_FRAME + 1, 0xFFFFFFFF))
    return [lambda s: s.sendall(noise), lambda s: s.sendall(frame)]

"""ttrpc over a real mux on a socketpair: header, message cutting, client/server, errors, stream ids."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.nri.pb import ttrpc_pb2
from nri_numa.nri.wire.mux import ConnectionClosed, Mux
from nri_numa.nri.wire.ttrpc import Client, RawHandler, Server
from nri_numa.nri.wire.ttrpc_message import (
    HEADER,
    MAX_MESSAGE_SIZE,
    Code,
    MessageDecoder,
    MessageHeader,
    MessageType,
    TtrpcError,
    encode_message,
)

SERVICE = "test.Echo"
FRAME = struct.Struct(">II")


# --- header and message cutting -------------------------------------------------------------


def test_header_layout_is_big_endian_length_stream_type_flags() -> None:
    header = MessageHeader(length=65, stream_id=1, type=MessageType.REQUEST)
    assert header.encode().hex() == "00000041" "00000001" "01" "00"
    assert MessageHeader.decode(bytes.fromhex("0000000700000003" "0200")) == MessageHeader(7, 3, 2, 0)


def test_encode_message_refuses_bodies_over_4_mib() -> None:
    assert len(encode_message(1, MessageType.RESPONSE, b"\0" * MAX_MESSAGE_SIZE)) == MAX_MESSAGE_SIZE + 10
    with pytest.raises(TtrpcError) as raised:
        encode_message(1, MessageType.RESPONSE, b"\0" * (MAX_MESSAGE_SIZE + 1))
    assert raised.value.code == Code.RESOURCE_EXHAUSTED
    assert "4194305 exceeds maximum message size of 4194304" in str(raised.value)


messages_strategy = st.lists(
    st.tuples(st.integers(1, 2**32 - 1), st.sampled_from([1, 2, 3]), st.binary(max_size=300)), max_size=6
)


@settings(max_examples=200, deadline=None)
@given(messages=messages_strategy, cuts=st.lists(st.integers(0, 2000), max_size=10))
def test_decoder_output_does_not_depend_on_how_bytes_are_cut(messages, cuts) -> None:
    wire = b"".join(encode_message(sid, MessageType(kind), body) for sid, kind, body in messages)
    points = sorted({min(c, len(wire)) for c in cuts} | {0, len(wire)})
    decoder = MessageDecoder()
    out = []
    for start, end in zip(points, points[1:]):
        out += decoder.feed(wire[start:end])
    assert [(m.header.stream_id, m.header.type, m.body) for m in out] == messages
    assert not any(m.oversized for m in out)


def test_decoder_skips_an_oversized_body_fed_in_pieces_and_continues() -> None:
    decoder = MessageDecoder(max_size=100)
    big = HEADER.pack(150, 5, 1, 0) + b"b" * 150
    after = encode_message(7, MessageType.REQUEST, b"next")
    out = decoder.feed(big[:20])
    assert [(m.header.stream_id, m.oversized, m.body) for m in out] == [(5, True, b"")]
    out = decoder.feed(big[20:100]) + decoder.feed(big[100:] + after[:3]) + decoder.feed(after[3:])
    assert [(m.header.stream_id, m.body) for m in out] == [(7, b"next")]


def test_decoder_flags_a_length_of_2_pow_32_minus_1() -> None:
    out = MessageDecoder().feed(HEADER.pack(0xFFFFFFFF, 1, 1, 0) + b"rest")
    assert len(out) == 1 and out[0].oversized and out[0].header.length == 0xFFFFFFFF


def test_zero_length_body_is_a_message() -> None:
    out = MessageDecoder().feed(bytes.fromhex("00000000" "00000001" "0200"))
    assert [(m.header.length, m.header.stream_id, m.body) for m in out] == [(0, 1, b"")]


# --- client and server over a real mux --------------------------------------------------------


class Peers:
    """A Client on one end of a socketpair and a Server on the other, on mux connection 2."""

    def __init__(self, handlers: dict[str, RawHandler], inline: tuple[str, ...] = ()) -> None:
        self.client_sock, self.server_sock = socket.socketpair()
        self.client_mux, self.server_mux = Mux(self.client_sock), Mux(self.server_sock)
        self.client = Client(self.client_mux, 2)
        self.server = Server(self.server_mux, 2, {(SERVICE, m): h for m, h in handlers.items()},
                             inline=[(SERVICE, m) for m in inline])
        self.wire_stream_ids: list[int] = []  # request stream ids in the order the server saw them
        self.client_mux.attach(2, self.client)
        self.server_mux.attach(2, _Tee(self.server, self.wire_stream_ids))
        self.client_mux.start()
        self.server_mux.start()

    def close(self) -> None:
        self.client_mux.close()
        self.server_mux.close()
        assert self.server.stop(2.0)


class _Tee:
    """Records the stream ids of requests as they arrive, then hands the bytes to the server."""

    def __init__(self, server: Server, ids: list[int]) -> None:
        self._server, self._ids, self._decoder = server, ids, MessageDecoder()

    def feed(self, data: bytes) -> None:
        self._ids.extend(m.header.stream_id for m in self._decoder.feed(data))
        self._server.feed(data)

    def connection_lost(self, reason: str) -> None:
        self._server.connection_lost(reason)


def echo(payload: bytes) -> bytes:
    return payload[::-1]


def slow(seconds: float) -> RawHandler:
    def handler(payload: bytes) -> bytes:
        time.sleep(seconds)
        return payload

    return handler


def failing(error: Exception) -> RawHandler:
    def handler(payload: bytes) -> bytes:
        raise error

    return handler


@pytest.fixture
def peers() -> Iterator[Callable[[dict[str, RawHandler]], Peers]]:
    made: list[Peers] = []

    def make(handlers: dict[str, RawHandler], inline: tuple[str, ...] = ()) -> Peers:
        made.append(Peers(handlers, inline))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_call_returns_the_handlers_payload(peers) -> None:
    p = peers({"Echo": echo})
    assert p.client.call(SERVICE, "Echo", b"abc", timeout=2) == b"cba"
    assert p.client.call(SERVICE, "Echo", b"", timeout=2) == b""
    assert p.wire_stream_ids == [1, 3]


def test_unknown_method_and_service_get_unimplemented(peers) -> None:
    p = peers({"Echo": echo})
    with pytest.raises(TtrpcError) as method:
        p.client.call(SERVICE, "Nope", b"", timeout=2)
    with pytest.raises(TtrpcError) as service:
        p.client.call("other.Service", "Echo", b"", timeout=2)
    assert (method.value.code, method.value.message) == (12, "method test.Echo/Nope is not implemented")
    assert (service.value.code, service.value.message) == (12, "service other.Service is not served here")
    assert p.client.call(SERVICE, "Echo", b"ok", timeout=2) == b"ko"


def test_handler_exception_becomes_unknown_with_its_message(peers, caplog) -> None:
    p = peers({"Boom": failing(ValueError("cpus 0-3 are taken")), "Echo": echo})
    with caplog.at_level(logging.ERROR), pytest.raises(TtrpcError) as raised:
        p.client.call(SERVICE, "Boom", b"", timeout=2)
    assert (raised.value.code, raised.value.message) == (Code.UNKNOWN, "cpus 0-3 are taken")
    assert "handler for test.Echo/Boom failed" in caplog.text
    assert p.client.call(SERVICE, "Echo", b"still", timeout=2) == b"llits"


def test_handler_ttrpc_error_keeps_its_code(peers) -> None:
    p = peers({"Bad": failing(TtrpcError(Code.INVALID_ARGUMENT, "malformed X"))})
    with pytest.raises(TtrpcError) as raised:
        p.client.call(SERVICE, "Bad", b"", timeout=2)
    assert (raised.value.code, raised.value.message) == (3, "malformed X")


def test_oversized_request_is_refused_before_sending(peers) -> None:
    p = peers({"Echo": echo})
    with pytest.raises(TtrpcError) as raised:
        p.client.call(SERVICE, "Echo", b"\0" * MAX_MESSAGE_SIZE, timeout=2)
    assert raised.value.code == Code.RESOURCE_EXHAUSTED
    assert p.client.call(SERVICE, "Echo", b"a", timeout=2) == b"a"
    assert p.wire_stream_ids == [1]  # the refused call never took a stream id


def test_oversized_response_becomes_resource_exhausted(peers) -> None:
    p = peers({"Big": lambda _payload: b"\0" * MAX_MESSAGE_SIZE, "Echo": echo})
    with pytest.raises(TtrpcError) as raised:
        p.client.call(SERVICE, "Big", b"", timeout=5)
    assert raised.value.code == Code.RESOURCE_EXHAUSTED
    assert p.client.call(SERVICE, "Echo", b"ab", timeout=2) == b"ba"


def test_large_messages_below_the_limit_pass(peers) -> None:
    p = peers({"Echo": echo})
    payload = bytes(range(256)) * 8000  # 2 MB
    assert p.client.call(SERVICE, "Echo", payload, timeout=5) == payload[::-1]


def test_deadline_is_kept_and_the_late_answer_dropped(peers, caplog) -> None:
    p = peers({"Slow": slow(2.0), "Echo": echo})
    started = time.monotonic()
    with pytest.raises(TtrpcError) as raised:
        p.client.call(SERVICE, "Slow", b"", timeout=0.1)
    assert time.monotonic() - started < 1.5
    assert raised.value.code == Code.DEADLINE_EXCEEDED
    assert raised.value.message == "no response to test.Echo/Slow (stream 1) within 0.1 s"
    with caplog.at_level(logging.WARNING):
        deadline = time.monotonic() + 10
        while "dropping ttrpc response" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.client.call(SERVICE, "Echo", b"xy", timeout=2) == b"yx"
    assert "dropping ttrpc response on inactive stream 1" in caplog.text


def test_pending_calls_fail_promptly_when_the_connection_goes(peers) -> None:
    p = peers({"Slow": slow(1.0)})
    errors: list[BaseException] = []

    def call() -> None:
        try:
            p.client.call(SERVICE, "Slow", b"", timeout=10)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.1)
    p.server_mux.close("runtime went away")
    caller.join(2)
    assert not caller.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ConnectionClosed)
    assert errors[0].reason == "the runtime closed the connection"
    with pytest.raises(ConnectionClosed):
        p.client.call(SERVICE, "Slow", b"", timeout=1)


def test_concurrent_calls_keep_stream_ids_odd_and_increasing_on_the_wire(peers) -> None:
    p = peers({"Echo": echo})
    results: list[bool] = []

    def worker(n: int) -> None:
        for i in range(40):
            payload = f"{n}:{i}".encode() * (1 + (i % 3) * 700)
            results.append(p.client.call(SERVICE, "Echo", payload, timeout=5) == payload[::-1])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [True] * 320
    assert p.wire_stream_ids == list(range(1, 640, 2))


# --- a raw peer talking to our Server ----------------------------------------------------------


class RawPeer:
    """Talks ttrpc by hand to a Server, to send what a well-behaved client never would."""

    def __init__(self, handlers: dict[str, RawHandler]) -> None:
        self.sock, server_sock = socket.socketpair()
        self.mux = Mux(server_sock)
        self.server = Server(self.mux, 1, {(SERVICE, m): h for m, h in handlers.items()})
        self.mux.attach(1, self.server)
        self.mux.start()
        self.sock.settimeout(2)
        self.decoder = MessageDecoder()

    def send(self, stream: int, body: bytes, kind: int = 1) -> None:
        message = HEADER.pack(len(body), stream, kind, 0) + body
        chunks = (message[i : i + 4096] for i in range(0, len(message), 4096))
        self.sock.sendall(b"".join(FRAME.pack(1, len(c)) + c for c in chunks))

    def request(self, stream: int, method: str, payload: bytes = b"") -> None:
        self.send(stream, ttrpc_pb2.Request(service=SERVICE, method=method, payload=payload).SerializeToString())

    def response(self) -> tuple[int, ttrpc_pb2.Response]:
        pending = b""
        while True:
            while len(pending) >= 8:
                length = int.from_bytes(pending[4:8], "big")
                if len(pending) < 8 + length:
                    break
                out = self.decoder.feed(pending[8 : 8 + length])
                pending = pending[8 + length :]
                if out:
                    return out[0].header.stream_id, ttrpc_pb2.Response.FromString(out[0].body)
            pending += self.sock.recv(1 << 16)

    def close(self) -> None:
        self.mux.close()
        self.server.stop(2)
        self.sock.close()


@pytest.fixture
def raw_peer() -> Iterator[RawPeer]:
    peer = RawPeer({"Echo": echo})
    yield peer
    peer.close()


def test_ok_response_has_the_containerd_accepted_form(raw_peer) -> None:
    raw_peer.request(1, "Echo", b"\x10\xff\x0f")
    stream, response = raw_peer.response()
    assert stream == 1
    assert response.SerializeToString().hex() == "0a00" "1203" "0fff10"


def test_even_and_reused_stream_ids_are_refused_on_their_stream(raw_peer) -> None:
    raw_peer.request(2, "Echo")
    stream, response = raw_peer.response()
    assert (stream, response.status.code) == (2, Code.INVALID_ARGUMENT)
    assert response.status.message == "StreamID must be odd for client initiated streams"
    raw_peer.request(5, "Echo")
    assert raw_peer.response()[1].status.code == 0
    raw_peer.request(3, "Echo")
    stream, response = raw_peer.response()
    assert (stream, response.status.code) == (3, Code.INVALID_ARGUMENT)
    assert response.status.message == "StreamID cannot be re-used and must increment"
    raw_peer.request(7, "Echo", b"ab")
    assert raw_peer.response()[1].payload == b"ba"


def test_oversized_request_gets_resource_exhausted_and_the_connection_survives(raw_peer) -> None:
    raw_peer.send(1, b"\0" * (MAX_MESSAGE_SIZE + 1))
    stream, response = raw_peer.response()
    assert (stream, response.status.code) == (1, Code.RESOURCE_EXHAUSTED)
    assert response.status.message == "message length 4194305 exceeds maximum message size of 4194304"
    raw_peer.request(3, "Echo", b"ok")
    assert raw_peer.response()[1].payload == b"ko"


def test_unparsable_request_gets_invalid_argument(raw_peer) -> None:
    raw_peer.send(1, b"\xff\xff\xff")
    stream, response = raw_peer.response()
    assert (stream, response.status.code) == (1, Code.INVALID_ARGUMENT)
    assert response.status.message.startswith("unmarshal request error: ")


def test_responses_and_data_sent_to_a_server_are_ignored(raw_peer) -> None:
    raw_peer.send(1, b"", kind=2)
    raw_peer.send(3, b"xx", kind=3)
    raw_peer.request(5, "Echo", b"12")
    assert raw_peer.response() == (5, ttrpc_pb2.Response(status=ttrpc_pb2.Status(), payload=b"21"))


def test_malformed_response_fails_only_that_call() -> None:
    client_sock, peer = socket.socketpair()
    mux = Mux(client_sock)
    client = Client(mux, 2)
    mux.attach(2, client)
    mux.start()

    def answer() -> None:
        peer.recv(1 << 16)
        body = b"\x0a\x05\x08"  # status field claims 5 bytes, only 1 follows
        peer.sendall(FRAME.pack(2, 10 + len(body)) + HEADER.pack(len(body), 1, 2, 0) + body)

    responder = threading.Thread(target=answer)
    responder.start()
    with pytest.raises(TtrpcError) as raised:
        client.call(SERVICE, "Echo", b"", timeout=2)
    responder.join()
    assert raised.value.code == Code.UNKNOWN
    assert raised.value.message.startswith("malformed response to test.Echo/Echo")
    mux.close()
    peer.close()


def test_inline_methods_run_on_the_reader_and_the_others_on_workers(peers) -> None:
    def thread_name(_payload: bytes) -> bytes:
        return threading.current_thread().name.encode()

    p = peers({"Quick": thread_name, "Other": thread_name, "Fails": failing(ValueError("boom"))},
              inline=("Quick", "Fails"))
    assert p.client.call(SERVICE, "Quick", b"", timeout=2) == b"nri-mux-reader"
    assert p.client.call(SERVICE, "Other", b"", timeout=2).startswith(b"nri-ttrpc-2-")
    with pytest.raises(TtrpcError) as raised:  # a failing inline handler is a status, the
        p.client.call(SERVICE, "Fails", b"", timeout=2)  # reader carries on
    assert (raised.value.code, raised.value.message) == (Code.UNKNOWN, "boom")
    assert p.client.call(SERVICE, "Quick", b"", timeout=2) == b"nri-mux-reader"


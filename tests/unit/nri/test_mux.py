"""The mux over a real socketpair: framing both ways, per-connection delivery, hostile input."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nri_numa.nri.wire.mux import (
    MAX_INCOMING_FRAME_PAYLOAD,
    MAX_OUTGOING_FRAME_PAYLOAD,
    ConnectionClosed,
    Mux,
    ProtocolError,
    encode_frames,
)

FRAME = struct.Struct(">II")
CLOSE_DEADLINE = 2.0


class Recorder:
    """A sink that keeps what it was given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.feeds = 0
        self.lost: str | None = None
        self.lost_event = threading.Event()

    def feed(self, data: bytes) -> None:
        self.feeds += 1
        self.data += data

    def connection_lost(self, reason: str) -> None:
        self.lost = reason
        self.lost_event.set()


class Exploding(Recorder):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def feed(self, data: bytes) -> None:
        raise self.error


def frame(conn: int, payload: bytes, length: int | None = None) -> bytes:
    return FRAME.pack(conn, len(payload) if length is None else length) + payload


def parse_frames(raw: bytes) -> list[tuple[int, bytes]]:
    frames, pos = [], 0
    while pos < len(raw):
        conn, length = FRAME.unpack_from(raw, pos)
        frames.append((conn, raw[pos + 8 : pos + 8 + length]))
        pos += 8 + length
    return frames


def recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def pair() -> Iterator[tuple[Mux, socket.socket, dict[int, Recorder]]]:
    ours, peer = socket.socketpair()
    mux = Mux(ours)
    sinks = {1: Recorder(), 2: Recorder()}
    for conn, sink in sinks.items():
        mux.attach(conn, sink)
    mux.start()
    yield mux, peer, sinks
    mux.close()
    peer.close()


def wait_closed(mux: Mux) -> str:
    assert mux.closed.wait(CLOSE_DEADLINE), "mux did not close"
    return mux.reason


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 8192, 10_000, 1 << 20])
def test_encode_frames_cuts_at_4096_and_keeps_bytes(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    frames = parse_frames(encode_frames(7, data))
    assert all(conn == 7 for conn, _ in frames)
    assert all(len(p) <= MAX_OUTGOING_FRAME_PAYLOAD for _, p in frames)
    assert all(len(p) == 4096 for _, p in frames[:-1])
    assert b"".join(p for _, p in frames) == data
    assert len(frames) == -(-size // 4096)


def test_send_writes_frames_of_at_most_4096_bytes(pair) -> None:
    mux, peer, _ = pair
    payload = b"x" * 10_000
    mux.send(2, payload)
    mux.close()
    frames = parse_frames(recv_all(peer))
    assert [(c, len(p)) for c, p in frames] == [(2, 4096), (2, 4096), (2, 1808)]


def test_frames_reach_their_connection_in_order(pair) -> None:
    mux, peer, sinks = pair
    peer.sendall(frame(1, b"ab") + frame(2, b"XY") + frame(1, b"") + frame(1, b"cd") + frame(2, b"Z"))
    peer.shutdown(socket.SHUT_WR)
    wait_closed(mux)
    assert bytes(sinks[1].data) == b"abcd"
    assert bytes(sinks[2].data) == b"XYZ"
    assert sinks[1].feeds == 2  # zero-length frames carry nothing and are not handed on


def test_frames_for_unknown_connections_are_dropped(pair) -> None:
    mux, peer, sinks = pair
    peer.sendall(frame(0, b"zero") + frame(3, b"three") + frame(0xFFFFFFFF, b"max") + frame(1, b"ok"))
    peer.shutdown(socket.SHUT_WR)
    assert wait_closed(mux) == "the runtime closed the connection"
    assert bytes(sinks[1].data) == b"ok"
    assert sinks[2].data == b""


def test_frame_header_split_across_writes_is_reassembled(pair) -> None:
    mux, peer, sinks = pair
    wire = frame(1, b"hello") + frame(2, b"world")
    for byte in wire:
        peer.sendall(bytes([byte]))
    peer.shutdown(socket.SHUT_WR)
    wait_closed(mux)
    assert bytes(sinks[1].data) == b"hello" and bytes(sinks[2].data) == b"world"


def test_largest_legal_frame_is_accepted(pair) -> None:
    mux, peer, sinks = pair
    payload = b"\x5a" * MAX_INCOMING_FRAME_PAYLOAD
    sender = threading.Thread(target=peer.sendall, args=(frame(1, payload),))
    sender.start()
    sender.join(10)
    peer.shutdown(socket.SHUT_WR)
    assert wait_closed(mux) == "the runtime closed the connection"
    assert len(sinks[1].data) == MAX_INCOMING_FRAME_PAYLOAD


@pytest.mark.parametrize("length", [MAX_INCOMING_FRAME_PAYLOAD + 1, 1 << 31, 0xFFFFFFFF])
def test_oversized_frame_closes_with_reason(pair, length: int) -> None:
    mux, peer, sinks = pair
    peer.sendall(FRAME.pack(1, length) + b"junk")
    reason = wait_closed(mux)
    assert reason == f"protocol error: frame of {length} bytes on connection 1 exceeds the 16 MiB frame limit"
    assert sinks[1].lost_event.wait(CLOSE_DEADLINE) and sinks[1].lost == reason
    assert sinks[2].lost_event.wait(CLOSE_DEADLINE) and sinks[2].lost == reason
    assert sinks[1].data == b""


def test_eof_inside_header_is_reported(pair) -> None:
    mux, peer, _ = pair
    peer.sendall(b"\x00\x00\x00")
    peer.shutdown(socket.SHUT_WR)
    assert wait_closed(mux) == "protocol error: connection ended inside a frame header (3 of 8 bytes)"


def test_eof_inside_payload_is_reported(pair) -> None:
    mux, peer, sinks = pair
    peer.sendall(FRAME.pack(2, 100) + b"y" * 40)
    peer.shutdown(socket.SHUT_WR)
    reason = wait_closed(mux)
    assert reason == "protocol error: connection ended inside a frame on connection 2 (40 of 100 payload bytes)"
    assert sinks[2].data == b""


def test_clean_eof_is_reported(pair) -> None:
    mux, peer, sinks = pair
    peer.close()
    assert wait_closed(mux) == "the runtime closed the connection"
    assert sinks[1].lost_event.wait(CLOSE_DEADLINE)


@pytest.mark.parametrize("error, reason", [
    (ProtocolError("bad ttrpc header"), "protocol error: bad ttrpc header"),
    (KeyError("oops"), "internal error while reading: KeyError: 'oops'"),  # a bug in a sink
], ids=["protocol error", "sink bug"])
def test_a_sink_that_raises_closes_the_mux_with_its_reason_not_the_process(
        monkeypatch, error, reason) -> None:
    escaped: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    ours, peer = socket.socketpair()
    mux = Mux(ours)
    mux.attach(1, Exploding(error))
    mux.start()
    peer.sendall(frame(1, b"x"))
    assert wait_closed(mux) == reason
    mux.close()
    assert escaped == []
    peer.close()


def test_close_is_idempotent_and_releases_everything() -> None:
    ours, peer = socket.socketpair()
    mux, sink = Mux(ours), Recorder()
    mux.attach(1, sink)
    mux.start()
    mux.close("first")
    mux.close("second")
    peer.close()
    assert mux.reason == "first"
    assert ours.fileno() == -1
    assert sink.lost == "first"
    assert not any(t.name == "nri-mux-reader" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(ConnectionClosed) as raised:
        mux.send(1, b"late")
    assert raised.value.reason == "first"


def test_close_before_start_closes_the_socket() -> None:
    ours, peer = socket.socketpair()
    mux = Mux(ours)
    mux.close()
    assert ours.fileno() == -1
    peer.close()


def test_write_to_a_vanished_peer_closes_the_mux(pair) -> None:
    mux, peer, _ = pair
    peer.close()
    wait_closed(mux)
    with pytest.raises(ConnectionClosed):
        mux.send(1, b"x" * 100)


def test_write_that_cannot_progress_times_out() -> None:
    ours, peer = socket.socketpair()
    mux = Mux(ours, write_timeout=0.2)
    mux.start()
    started = time.monotonic()
    with pytest.raises(ConnectionClosed) as raised:
        for _ in range(64):  # the peer never reads: the socket buffer fills up
            mux.send(1, b"\0" * (1 << 20))
    assert time.monotonic() - started < 2.0
    assert raised.value.reason.startswith("write to the runtime failed: ")
    mux.close()
    peer.close()


def test_concurrent_senders_never_interleave_messages(pair) -> None:
    mux, peer, _ = pair
    sizes = [10, 4096, 4097, 9000, 20_000, 1, 5000, 12_345]
    messages = [bytes([65 + i]) * size for i, size in enumerate(sizes)]
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(recv_all(peer)))
    reader.start()
    threads = [threading.Thread(target=lambda m=m: [mux.send(1, m) for _ in range(20)]) for m in messages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mux.close()
    reader.join(5)
    frames = parse_frames(received[0])
    assert all(len(p) <= 4096 for _, p in frames)
    stream = b"".join(p for _, p in frames)
    pos, seen = 0, []
    while pos < len(stream):
        message = messages[stream[pos] - 65]
        assert stream[pos : pos + len(message)] == message, "a message was interleaved with another"
        seen.append(len(message))
        pos += len(message)
    assert sorted(seen) == sorted(sizes * 20)


def reference_parse(raw: bytes) -> tuple[dict[int, bytes], str]:
    """What a correct reader makes of ``raw`` followed by EOF: bytes per known conn, close reason."""
    delivered = {1: b"", 2: b""}
    pos = 0
    while True:
        if pos == len(raw):
            return delivered, "the runtime closed the connection"
        if len(raw) - pos < 8:
            return delivered, f"protocol error: connection ended inside a frame header ({len(raw) - pos} of 8 bytes)"
        conn, length = FRAME.unpack_from(raw, pos)
        if length > MAX_INCOMING_FRAME_PAYLOAD:
            return delivered, (
                f"protocol error: frame of {length} bytes on connection {conn} exceeds the 16 MiB frame limit"
            )
        body = raw[pos + 8 : pos + 8 + length]
        if len(body) < length:
            return delivered, (
                f"protocol error: connection ended inside a frame on connection {conn} "
                f"({len(body)} of {length} payload bytes)"
            )
        if conn in delivered:
            delivered[conn] += body
        pos += 8 + length


def small_frames() -> st.SearchStrategy[bytes]:
    legal = st.builds(frame, st.sampled_from([0, 1, 2, 3, 0xFFFFFFFF]), st.binary(max_size=40))
    header_only = st.builds(lambda c, n: FRAME.pack(c, n), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
    return st.lists(st.one_of(legal, header_only, st.binary(max_size=12)), max_size=8).map(b"".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.one_of(st.binary(max_size=200), small_frames()))
def test_any_bytes_end_in_a_clean_close_matching_the_reference(raw: bytes) -> None:
    ours, peer = socket.socketpair()
    mux = Mux(ours)
    sinks = {1: Recorder(), 2: Recorder()}
    for conn, sink in sinks.items():
        mux.attach(conn, sink)
    mux.start()
    peer.sendall(raw)
    peer.shutdown(socket.SHUT_WR)
    try:
        expected, reason = reference_parse(raw)
        assert wait_closed(mux) == reason
        assert {c: bytes(s.data) for c, s in sinks.items()} == expected
        assert sinks[1].lost_event.wait(CLOSE_DEADLINE) and sinks[1].lost == reason
    finally:
        mux.close()
        peer.close()

"""A ttrpc message: its 10-byte header, encoding one, cutting them out of a connection's byte
stream (skipping oversized bodies), and the status codes and error a call ends with."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

HEADER = struct.Struct(">IIBB")
MAX_MESSAGE_SIZE = 4 << 20


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3  # ttrpc >= 1.2 streaming; NRI never uses it


class Code(enum.IntEnum):
    """The gRPC status codes ttrpc and NRI use."""

    OK = 0
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12


class TtrpcError(Exception):
    """A call that ended with a non-OK status, from the peer or decided locally (deadline, size)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{_code_name(code)} (code {code}): {message}")


@dataclass(frozen=True, slots=True)
class MessageHeader:
    length: int
    stream_id: int
    type: int
    flags: int = 0

    def encode(self) -> bytes:
        return HEADER.pack(self.length, self.stream_id, self.type, self.flags)

    @classmethod
    def decode(cls, data: bytes) -> MessageHeader:
        return cls(*HEADER.unpack(data))


@dataclass(frozen=True, slots=True)
class Message:
    """One ttrpc message. ``oversized`` ones arrive without their body, which was skipped."""

    header: MessageHeader
    body: bytes
    oversized: bool = False


def encode_message(stream_id: int, message_type: MessageType, body: bytes) -> bytes:
    if len(body) > MAX_MESSAGE_SIZE:
        raise TtrpcError(Code.RESOURCE_EXHAUSTED, oversize_text(len(body)))
    return MessageHeader(len(body), stream_id, message_type).encode() + body


class MessageDecoder:
    """Cuts ttrpc messages out of one connection's byte stream, whatever the frame boundaries."""

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self._max_size = max_size
        self._buffer = bytearray()
        self._skip = 0  # body bytes of an oversized message still to throw away

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        messages: list[Message] = []
        while True:
            if self._skip:
                dropped = min(self._skip, len(self._buffer))
                del self._buffer[:dropped]
                self._skip -= dropped
                if self._skip:
                    return messages
            if len(self._buffer) < HEADER.size:
                return messages
            header = MessageHeader.decode(bytes(self._buffer[: HEADER.size]))
            if header.length > self._max_size:
                # Like ttrpc: skip the body without holding it, then report it so it can be refused.
                del self._buffer[: HEADER.size]
                self._skip = header.length
                messages.append(Message(header, b"", oversized=True))
                continue
            end = HEADER.size + header.length
            if len(self._buffer) < end:
                return messages
            messages.append(Message(header, bytes(self._buffer[HEADER.size : end])))
            del self._buffer[:end]


def oversize_text(length: int) -> str:
    return f"message length {length} exceeds maximum message size of {MAX_MESSAGE_SIZE}"


def _code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return "CODE"

"""A schema as comparable data, and the device plugin schema a kubelet binary carries.

Go's gogo-protobuf code keeps each .proto file's descriptor in the binary, gzipped, to register
it at start; ``embedded_descriptor`` finds the one whose package is ``v1beta1`` and that serves
``DevicePlugin``."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"  # as Go's compress/gzip writes it
_TYPES = {v: k.removeprefix("TYPE_").lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}


def describe(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Package, services with their methods, messages with their fields: number → [label type name]."""
    def fields(message: descriptor_pb2.DescriptorProto) -> dict[str, list[str]]:
        return {str(f.number): [
            "repeated" if f.label == f.LABEL_REPEATED else "",
            f.type_name.rsplit(".", 1)[-1] if f.type_name else _TYPES[f.type], f.name]
            for f in message.field}

    messages = {}
    for message in file.message_type:
        messages[message.name] = fields(message)
        for nested in message.nested_type:
            messages[f"{message.name}.{nested.name}"] = fields(nested)
    return {"package": file.package,
            "services": {s.name: {m.name: [m.input_type.rsplit(".", 1)[-1],
                                           m.output_type.rsplit(".", 1)[-1],
                                           "stream" if m.server_streaming else ""]
                                  for m in s.method} for s in file.service},
            "messages": messages}


def embedded_descriptor(binary: Path) -> descriptor_pb2.FileDescriptorProto | None:
    data = binary.read_bytes()
    at = data.find(GZIP_HEADER)
    while at >= 0:
        try:
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[at:at + (1 << 18)])
            file = descriptor_pb2.FileDescriptorProto.FromString(raw)
        except Exception:  # noqa: BLE001 - most gzip headers here start something else
            file = None
        if file is not None and file.package == "v1beta1" and \
                any(s.name == "DevicePlugin" for s in file.service):
            return file
        at = data.find(GZIP_HEADER, at + 1)
    return None

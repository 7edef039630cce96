"""What a runtime hands a hook: the OCI state on stdin, the spec in the bundle.

The state is ``{"ociVersion", "id", "status", "pid", "bundle", "annotations"}``
(docs/oci-hook.md, "What each runtime hands a hook"): runc leaves ``pid`` out at poststop, crun sends 0 there, and
``annotations`` is present only when the container has some. The spec is the bundle's
``config.json`` as the runtime loaded it; editing it from a hook changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nri_numa.safeio.bounds import MAX_NAME, clip, quote
from nri_numa.safeio.documents import DocumentError, NotParsedError, load_json

MAX_INPUT_BYTES = 16 << 20  # a spec with a large seccomp profile is ~100 kB; this is far beyond


class HookInputError(ValueError):
    """State or spec that cannot be read; the message says which and why."""


@dataclass(frozen=True, slots=True)
class OciState:
    id: str
    status: str
    pid: int | None  # None when the runtime gave none (poststop) or 0
    bundle: str
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "annotations", MappingProxyType(dict(self.annotations)))


def parse_state(raw: bytes | str) -> OciState:
    """The state JSON a runtime writes to a hook's stdin; HookInputError names the bad field."""
    data = _json(raw, "the OCI state on stdin")
    if not isinstance(data, dict):
        raise HookInputError("the OCI state on stdin must be a JSON object")
    cid = data.get("id")
    if not isinstance(cid, str) or not cid or "\n" in cid or len(cid) > MAX_NAME:
        raise HookInputError(f"OCI state: id must be a non-empty one-line string of at most "
                             f"{MAX_NAME} characters, not {quote(cid)}")
    pid = data.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 0):
        raise HookInputError(f"OCI state of {clip(cid)}: pid must be a non-negative integer, "
                             f"not {quote(pid)}")
    annotations = data.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise HookInputError(f"OCI state of {clip(cid)}: annotations must map strings to "
                             "strings")
    for key in ("status", "bundle"):
        if not isinstance(data.get(key, ""), str):
            raise HookInputError(f"OCI state of {clip(cid)}: {key} must be a string")
    return OciState(cid, data.get("status", ""), pid or None, data.get("bundle", ""), annotations)


def parse_spec(raw: bytes | str, where: str) -> dict[str, Any]:
    data = _json(raw, where)
    if not isinstance(data, dict):
        raise HookInputError(f"{where} must hold a JSON object (an OCI runtime spec)")
    return data


def read_spec(bundle: str) -> dict[str, Any]:
    """``<bundle>/config.json``."""
    if not bundle or not Path(bundle).is_absolute():
        raise HookInputError(f"OCI state: bundle must be an absolute path, not {quote(bundle)}")
    path = Path(bundle) / "config.json"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise HookInputError(f"cannot read the spec {path}: {e.strerror}") from None
    return parse_spec(raw, str(path))


def read_input(stream: Any) -> bytes:
    """All of a hook's stdin (binary), refusing absurd sizes rather than filling memory."""
    try:
        raw = stream.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise HookInputError(f"cannot read stdin: {e}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise HookInputError(f"stdin holds more than {MAX_INPUT_BYTES} bytes")
    return raw


def _json(raw: bytes | str, where: str) -> Any:
    """The JSON value, its nesting, size and digits bounded (nri_numa.safeio.documents): a spec
    nests about 8 deep, and precreate copies it whole."""
    if len(raw) > MAX_INPUT_BYTES:
        raise HookInputError(f"{where} is larger than {MAX_INPUT_BYTES} bytes")
    if not raw.strip():
        raise HookInputError(f"{where} is empty")
    try:
        return load_json(raw, where)
    except NotParsedError as e:
        raise HookInputError(f"{where} is not JSON: {e.detail}") from None
    except DocumentError as e:
        raise HookInputError(str(e)) from None

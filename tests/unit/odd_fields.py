"""What the tests of the one-pass readers share: a field changed to an odd value, or removed."""

from __future__ import annotations

GONE = object()  # as a field's new value: the key is removed


def change(record: dict, key: str, value: object) -> None:
    if value is GONE:
        record.pop(key, None)
    else:
        record[key] = value

"""Which requests the Memory Manager places, and how it checks them."""

from __future__ import annotations

import pytest
from mm_builders import GB, HP1G

from nri_numa.engine.memory import MemoryRequestError, is_memory_resource, requested_resources


@pytest.mark.parametrize(
    "name, is_memory",
    [
        ("memory", True),
        ("hugepages-2Mi", True),
        ("hugepages-", False),
        ("cpu", False),
        ("nvidia.com/gpu", False),
    ],
)
def test_is_memory_resource(name: str, is_memory: bool) -> None:
    assert is_memory_resource(name) is is_memory


def test_requested_resources_keeps_only_memory_and_hugepages() -> None:
    assert requested_resources({"cpu": 2, "memory": GB, HP1G: GB, "example.com/nic": 1}) == {
        "memory": GB,
        HP1G: GB,
    }


@pytest.mark.parametrize(
    "value, message",
    [
        (2**63, r"^\[memorymanager\] failed to represent quantity as int64$"),
        (-1, "negative"),
        ("1Gi", "integer number of bytes"),
        (True, "integer number of bytes"),
    ],
)
def test_requested_resources_rejects_what_the_kubelet_cannot_hold(
    value: object, message: str
) -> None:
    with pytest.raises(MemoryRequestError, match=message):
        requested_resources({"memory": value})  # type: ignore[dict-item]


def test_largest_int64_request_is_accepted() -> None:
    assert requested_resources({"memory": 2**63 - 1}) == {"memory": 2**63 - 1}

"""The writer keeps the object equal to the node's, touching only nri-numa's fields; the exporter
retries with growing waits and says once when writing starts and stops failing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nri_numa.cluster.export_process import BACKOFF_CAP, BACKOFF_FIRST, Exporter, Inbox
from nri_numa.cluster.nrt_writer import ApiError, NrtWriter


class ApiServerInMemory:
    """Objects by name with resourceVersions, answering as the API server does: 404, 409."""

    def __init__(self, node_uid: str | None = "uid-1") -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.node = node_uid
        self.down = False
        self._version = 0

    def _bump(self, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self._version)
        self.objects[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.down:
            raise ApiError(0, "no answer: connection refused")

    def get(self, name: str) -> dict[str, Any] | None:
        self._call("get")
        found = self.objects.get(name)
        return copy.deepcopy(found) if found else None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self._call("create")
        if body["metadata"]["name"] in self.objects:
            raise ApiError(409, "already exists")
        return self._bump(body)

    def replace(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._call("replace")
        current = self.objects.get(name)
        if current is None:
            raise ApiError(404, "not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified")
        return self._bump(body)

    def node_uid(self, name: str) -> str | None:
        self._call("node")
        return self.node


def desired(available: str = "3", name: str = "n1") -> dict[str, Any]:
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "nri-numa"}},
            "topologyPolicies": ["None"],
            "zones": [{"name": "node-0", "type": "Node", "resources": [
                {"name": "cpu", "capacity": "4", "allocatable": "3", "available": available}]}],
            "attributes": [{"name": "topologyManagerPolicy", "value": "none"}]}


def test_created_then_one_call_per_change_then_nothing_when_unchanged():
    server = ApiServerInMemory()
    writer = NrtWriter(server)
    assert writer.ensure(desired("3")).action == "created"
    server.calls.clear()
    assert writer.ensure(desired("2")).action == "updated"
    assert server.calls == ["replace"]  # no read before a write that follows our own write
    server.calls.clear()
    assert writer.ensure(desired("2")).action == "unchanged" and server.calls == []
    stored = server.objects["n1"]
    assert stored["zones"][0]["resources"][0]["available"] == "2"
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}]


def test_what_others_added_stays_and_what_they_changed_of_ours_is_mended():
    server = ApiServerInMemory()
    writer = NrtWriter(server)
    writer.ensure(desired("3"))
    theirs = server.objects["n1"]
    theirs["metadata"]["labels"]["team"] = "gpu"
    theirs["metadata"]["annotations"] = {"note": "keep"}
    theirs["zones"][0]["resources"][0]["available"] = "99"
    server._bump(theirs)
    result = writer.ensure(desired("3"), read_first=True)
    assert result.action == "updated" and result.mended
    stored = server.objects["n1"]
    assert stored["zones"][0]["resources"][0]["available"] == "3"
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "nri-numa", "team": "gpu"}
    assert stored["metadata"]["annotations"] == {"note": "keep"}
    assert not writer.ensure(desired("3"), read_first=True).mended


def test_a_conflict_reads_the_object_and_writes_again():
    server = ApiServerInMemory()
    writer = NrtWriter(server)
    writer.ensure(desired("3"))
    other = server.objects["n1"]
    other["metadata"]["labels"]["x"] = "y"
    server._bump(other)  # someone wrote since: our resourceVersion is stale
    assert writer.ensure(desired("1")).action == "updated"
    assert server.objects["n1"]["metadata"]["labels"]["x"] == "y"
    assert server.objects["n1"]["zones"][0]["resources"][0]["available"] == "1"


def test_the_owner_reference_comes_once_the_node_exists():
    server = ApiServerInMemory(node_uid=None)
    writer = NrtWriter(server)
    writer.ensure(desired())
    assert "ownerReferences" not in server.objects["n1"]["metadata"] and not writer.owned_by_node
    server.node = "uid-7"
    assert writer.ensure(desired(), read_first=True).action == "updated"
    assert server.objects["n1"]["metadata"]["ownerReferences"][0]["uid"] == "uid-7"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_retry_with_growing_waits_and_are_said_once_then_recovery_once():
    server, clock, said = ApiServerInMemory(), Clock(), []
    exporter = Exporter(server, said.append, resync_s=60.0, clock=clock)
    server.down = True
    waits = []
    for _ in range(6):
        exporter.write(desired(), read_first=False)
        waits.append(exporter._retry_at - clock.now)
    assert waits == [BACKOFF_FIRST, 1.0, 2.0, BACKOFF_CAP, BACKOFF_CAP, BACKOFF_CAP]
    logs = [m for m in said if m["kind"] == "log"]
    assert len(logs) == 1 and logs[0]["level"] == "warning"
    assert "connection refused" in logs[0]["message"]
    assert said[-1]["state"] == "failing" and said[-1]["errors"] == 6
    server.down = False
    exporter.write(desired(), read_first=False)
    logs = [m for m in said if m["kind"] == "log"]
    assert len(logs) == 2 and "answers again" in logs[1]["message"]
    assert said[-1]["state"] == "synced" and said[-1]["writes"] == 1
    assert exporter._retry_at is None


def filled_inbox() -> Inbox:
    inbox = Inbox()
    for available in ("3", "2", "1"):
        inbox.put({"kind": "nrt", "object": desired(available)})
    inbox.put({"kind": "refusal", "pod": "p"})
    inbox.put({"kind": "refusal", "pod": "q"})
    return inbox


def test_the_inbox_keeps_the_latest_object_and_every_other_message_in_order():
    desired_object, fresh, others = filled_inbox().take()
    assert fresh and desired_object["zones"][0]["resources"][0]["available"] == "1"
    assert [m["pod"] for m in others] == ["p", "q"]


def test_the_exporter_ends_when_its_input_closes():
    server = ApiServerInMemory()
    inbox = filled_inbox()
    inbox.close()
    Exporter(server, [].append, resync_s=60.0).serve(inbox)  # returns: the input closed
    assert "n1" not in server.objects  # closed before the loop took anything: nothing written


@pytest.mark.parametrize("handler_fails", [False, True])
def test_other_messages_go_to_their_handler_and_a_failing_handler_is_only_logged(handler_fails):
    server, said, handled = ApiServerInMemory(), [], []

    def refusal(message):
        handled.append(message["pod"])
        if handler_fails:
            raise RuntimeError("the API server said no")

    exporter = Exporter(server, said.append, resync_s=60.0, handlers={"refusal": refusal})
    exporter._handle({"kind": "refusal", "pod": "p"})
    exporter._handle({"kind": "mystery"})
    exporter._handle({"kind": "mystery"})
    assert handled == ["p"]
    warnings = [m["message"] for m in said if m["kind"] == "log"]
    assert sum("mystery" in w for w in warnings) == 1
    assert any("the API server said no" in w for w in warnings) == handler_fails

"""The agent's side of the export with a real child process on a real pipe: a burst becomes one
object, the child's reports become the status and log lines, a child that dies is started again
and gets the latest object, and stopping the agent ends the child."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nri_numa.agent.prometheus_text import Registry, exposition
from nri_numa.cluster import feed as feed_module
from nri_numa.cluster.feed import ClusterFeed, ExportCollector
from tests.polling import until

# Stands in for the export process: records each message, answers each object with a status.
RECORDER = r"""
import json, sys
out = open(sys.argv[1], "a")
print(json.dumps({"kind": "log", "level": "warning", "message": "recorder started"}), flush=True)
for line in sys.stdin:
    out.write(line); out.flush()
    message = json.loads(line)
    if message["kind"] == "nrt":
        print(json.dumps({"kind": "status", "state": "synced", "message": "updated",
                          "writes": message["object"]["n"], "errors": 0, "last_success": 1.5}),
              flush=True)
"""


def received(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)
    return [sys.executable, str(script), str(tmp_path / "received.jsonl")], tmp_path / "received.jsonl"


def test_a_burst_of_changes_is_one_object_and_the_status_comes_back(recorder, caplog):
    command, path = recorder
    count = {"n": 0}
    feed = ClusterFeed(lambda: {"n": count["n"]}, command, batch_s=0.2)
    caplog.set_level(logging.INFO, logger="nri_numa.cluster")
    feed.start()
    try:
        until(lambda: received(path))  # the first object goes at start
        for _ in range(200):
            count["n"] += 1
            feed.changed()
        until(lambda: received(path)[-1]["object"]["n"] == 200)
        objects = [m for m in received(path) if m["kind"] == "nrt"]
        assert len(objects) <= 3, objects  # the start, then the burst in one or two batches
        until(lambda: feed.status.writes == 200)
        assert feed.status.state == "synced" and feed.status.last_success == 1.5
        assert "recorder started" in caplog.text
    finally:
        feed.stop()
    assert feed.status.state == "stopped"


def export_metrics(feed: ClusterFeed) -> dict[str, tuple[str, float]]:
    """sample name -> (its family's type, value), as Prometheus's own parser reads a scrape."""
    registry = Registry()
    registry.register(ExportCollector(feed))
    return {s.name: (f.type, s.value)
            for f in text_string_to_metric_families(exposition(registry.collect()))
            for s in f.samples}


def test_the_export_metrics_follow_the_status(recorder):
    command, _ = recorder
    feed = ClusterFeed(lambda: {"n": 7}, command, batch_s=0.05)
    assert export_metrics(feed) == {  # before the process said anything: no success yet
        "nri_numa_nrt_export_synced": ("gauge", 0), "nri_numa_nrt_export_writes_total":
        ("counter", 0), "nri_numa_nrt_export_errors_total": ("counter", 0),
        "nri_numa_nrt_export_restarts_total": ("counter", 0)}
    feed.start()
    try:
        until(lambda: feed.status.writes == 7)
        got = export_metrics(feed)
    finally:
        feed.stop()
    assert got["nri_numa_nrt_export_synced"] == ("gauge", 1)
    assert got["nri_numa_nrt_export_writes_total"] == ("counter", 7)
    assert got["nri_numa_nrt_export_last_success_timestamp_seconds"] == ("gauge", 1.5)


def test_other_messages_go_in_order_before_the_object(recorder):
    command, path = recorder
    feed = ClusterFeed(lambda: {"n": 1}, command, batch_s=0.05)
    feed.start()
    try:
        until(lambda: received(path))
        for pod in ("a", "b", "c"):
            feed.send({"kind": "refusal", "pod": pod})
        feed.changed()
        until(lambda: len(received(path)) >= 5)
        kinds = [(m["kind"], m.get("pod")) for m in received(path)[1:5]]
        assert kinds == [("refusal", "a"), ("refusal", "b"), ("refusal", "c"), ("nrt", None)]
    finally:
        feed.stop()


def test_a_child_that_dies_is_started_again_and_gets_the_latest_object(recorder, monkeypatch):
    monkeypatch.setattr(feed_module, "RESTART_FIRST_S", 0.1)
    command, path = recorder
    count = {"n": 1}
    feed = ClusterFeed(lambda: {"n": count["n"]}, command, batch_s=0.05)
    feed.start()
    try:
        until(lambda: received(path))
        first = feed._process
        first.kill()
        first.wait()
        count["n"] = 2
        until(lambda: feed._process is not first and feed._running())
        until(lambda: [m for m in received(path) if m["kind"] == "nrt"][-1]["object"]["n"] == 2)
        assert feed.restarts == 1
    finally:
        feed.stop()


def test_stopping_ends_the_child_through_its_input(recorder):
    command, path = recorder
    feed = ClusterFeed(lambda: {"n": 1}, command, batch_s=0.05)
    feed.start()
    until(lambda: received(path))
    process = feed._process
    feed.stop()
    assert process.poll() == 0  # it read to the end of its input and exited by itself

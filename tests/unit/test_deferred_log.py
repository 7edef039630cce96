"""nri_numa.deferred_log: routed lines go to the hook's sink only, others through logging."""

from __future__ import annotations

import logging

from nri_numa import deferred_log


class Sink:
    def __init__(self) -> None:
        self.lines: list[tuple[int, str, object]] = []

    def write(self, level: int, message: str, exc_info: object) -> None:
        self.lines.append((level, message, exc_info))


def test_a_routed_line_goes_to_the_sink_alone(caplog):
    sink, log = Sink(), deferred_log.get_logger("nri_numa.test")
    deferred_log.route_to(sink)
    try:
        with caplog.at_level(logging.DEBUG):
            log.debug("dropped %s", 1)
            log.warning("moved %s to %s", "c1", "0-3")
            log.info("odd %s", "format", "args")  # a format that does not fit still gives a line
    finally:
        deferred_log.unroute(sink)
    assert sink.lines == [(30, "moved c1 to 0-3", None), (20, "odd %s ('format', 'args')", None)]
    assert caplog.records == []


def test_an_exception_reaches_the_sink_as_type_value_and_traceback():
    sink, log = Sink(), deferred_log.get_logger("nri_numa.test")
    deferred_log.route_to(sink)
    try:
        try:
            raise ValueError("boom")
        except ValueError as e:
            log.exception("unexpected")
            log.error("given", exc_info=e)
    finally:
        deferred_log.unroute(sink)
    for _, _, (kind, value, traceback) in sink.lines:
        assert kind is ValueError and str(value) == "boom" and traceback is not None


def test_without_a_route_a_line_goes_through_logging_with_its_caller(caplog):
    with caplog.at_level(logging.INFO, logger="nri_numa.test"):
        deferred_log.get_logger("nri_numa.test").info("placed %s", "c1", extra={"event": "x"})
    [record] = caplog.records
    assert (record.name, record.getMessage(), record.event) == ("nri_numa.test", "placed c1", "x")
    assert record.filename == "test_deferred_log.py"  # stacklevel: the line that logged

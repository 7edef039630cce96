"""Prometheus's text exposition format (version 0.0.4) for the agent's few metric families.

The agent used prometheus_client for this, but importing it loads its HTTP and TLS stack too
(ssl, http.server, wsgiref, urllib.request, email), a share of the agent's idle memory
(bench/README.md) for ten families. What the agent needs is small: counters, one histogram,
families built at scrape time, a registry of collectors, and the text.

No ``_created`` samples: prometheus_client adds one per counter and histogram (as a separate
gauge family in this format), the kubelet exposes none, and nothing here reads them.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
KINDS = ("counter", "gauge", "histogram")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class Sample:
    name: str  # the full sample name: with _total, _bucket, _sum or _count where the type has it
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class MetricFamily:
    """One family: its samples are added while it is built, at scrape time."""

    name: str  # without a counter's _total
    help: str
    kind: str  # one of KINDS
    label_names: tuple[str, ...] = ()
    samples: list[Sample] = field(default_factory=list, compare=False)
    # Counters only: whether the name on the TYPE line and the samples ends in _total. The
    # kubelet has counters named without it (container_aligned_compute_resources_count).
    total: bool = True

    def __post_init__(self) -> None:
        if not _METRIC_NAME.fullmatch(self.name):
            raise ValueError(f"metric name {self.name!r} is not a Prometheus metric name")
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name}: type {self.kind!r} is not one of {KINDS}")
        for label in self.label_names:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__") or label == "le":
                raise ValueError(f"metric {self.name}: {label!r} is not a label name to use")

    @property
    def exposed_name(self) -> str:
        """The name on the HELP and TYPE lines: a counter's carries _total, as its sample does."""
        return f"{self.name}_total" if self.kind == "counter" and self.total else self.name

    def add(self, label_values: Sequence[str], value: float, suffix: str | None = None,
            extra: Mapping[str, str] | None = None) -> None:
        """One sample; ``suffix`` defaults to the type's (``_total`` for a counter)."""
        if len(label_values) != len(self.label_names):
            raise ValueError(f"metric {self.name}: {len(label_values)} label values for the "
                             f"labels {self.label_names}")
        if suffix is None:
            suffix = "_total" if self.kind == "counter" and self.total else ""
        labels = dict(zip(self.label_names, label_values))
        labels.update(extra or {})
        self.samples.append(Sample(self.name + suffix, labels, float(value)))


def gauge_family(name: str, help: str, labels: Sequence[str] = ()) -> MetricFamily:
    return MetricFamily(name, help, "gauge", tuple(labels))


def counter_family(name: str, help: str, value: float) -> MetricFamily:
    """A counter without labels whose value is read elsewhere (at scrape time)."""
    family = MetricFamily(name, help, "counter")
    family.add((), value)
    return family


class Collector(Protocol):
    def collect(self) -> Iterable[MetricFamily]: ...


C = TypeVar("C", bound=Collector)


class Counter:
    """A counter moved by the agent; ``inc`` takes a lock for a few instructions."""

    def __init__(self, name: str, help: str) -> None:
        MetricFamily(name, help, "counter")  # checks the name now, not at the first scrape
        self.name, self.help = name, help
        self._lock = threading.Lock()
        self._value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counter {self.name} can only go up, not by {amount}")
        with self._lock:
            self._value += amount

    @property
    def value(self) -> float:
        return self._value

    def collect(self) -> list[MetricFamily]:
        return [counter_family(self.name, self.help, self._value)]


class LabelledCounter:
    """A counter with labels, every series of ``series`` shown from the start (at 0), as the
    kubelet's ``Add(0)`` does; ``total=False`` keeps a kubelet name without ``_total``.
    Incrementing a series outside ``series`` is a programming error (ValueError)."""

    def __init__(self, name: str, help: str, label_names: Sequence[str],
                 series: Sequence[Sequence[str]], total: bool = True) -> None:
        MetricFamily(name, help, "counter", tuple(label_names), total=total)
        self.name, self.help, self.total = name, help, total
        self.label_names = tuple(label_names)
        self._lock = threading.Lock()
        self._values = {tuple(labels): 0.0 for labels in series}
        if any(len(labels) != len(self.label_names) for labels in self._values):
            raise ValueError(f"counter {name}: every series needs {len(self.label_names)} label "
                             "values")

    def inc(self, labels: Sequence[str], amount: float = 1.0) -> None:
        key = tuple(labels)
        if amount < 0:
            raise ValueError(f"counter {self.name} can only go up, not by {amount}")
        with self._lock:
            if key not in self._values:
                raise ValueError(f"counter {self.name} has no series {key}")
            self._values[key] += amount

    def value(self, labels: Sequence[str]) -> float:
        return self._values[tuple(labels)]

    def collect(self) -> list[MetricFamily]:
        family = MetricFamily(self.name, self.help, "counter", self.label_names,
                              total=self.total)
        with self._lock:
            values = list(self._values.items())
        for labels, value in values:
            family.add(labels, value)
        return [family]


class Histogram:
    """Observations counted in buckets by upper bound (``le``), cumulative when exposed."""

    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        MetricFamily(name, help, "histogram")
        bounds = [float(b) for b in buckets]
        if not bounds or any(b >= c for b, c in zip(bounds, bounds[1:])) or any(map(math.isnan,
                                                                                       bounds)):
            raise ValueError(f"histogram {name}: buckets must be increasing, not {buckets}")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.name, self.help = name, help
        self._bounds = tuple(bounds)
        self._lock = threading.Lock()
        self._counts = [0] * len(bounds)  # per bucket, not yet cumulative
        self._sum = 0.0

    def observe(self, value: float) -> None:
        index = bisect_left(self._bounds, value)  # the first bound >= value: le is inclusive
        with self._lock:
            self._counts[min(index, len(self._counts) - 1)] += 1
            self._sum += value

    def collect(self) -> list[MetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = MetricFamily(self.name, self.help, "histogram")
        running = 0
        for bound, count in zip(self._bounds, counts):
            running += count
            family.add((), running, "_bucket", {"le": format_value(bound)})
        family.add((), running, "_count")
        family.add((), total, "_sum")
        return [family]


class Registry:
    """The collectors one scrape reads, in the order they were registered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._collectors: list[Collector] = []

    def register(self, collector: C) -> C:
        with self._lock:
            self._collectors.append(collector)
        return collector

    def collect(self) -> Iterator[MetricFamily]:
        """Every collector's families; one that raises is logged and left out of this scrape
        (the rest are still served)."""
        with self._lock:
            collectors = tuple(self._collectors)
        for collector in collectors:
            try:
                families = list(collector.collect())
            except Exception:
                log.exception("metrics: %s failed; its metrics are left out of this scrape",
                              type(collector).__name__)
                continue
            yield from families

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of the sample with this full name and exactly these labels; None if none."""
        wanted = dict(labels or {})
        for family in self.collect():
            for sample in family.samples:
                if sample.name == name and dict(sample.labels) == wanted:
                    return sample.value
        return None


def format_value(value: float) -> str:
    """A float as Prometheus parses it (Go's ParseFloat): ``+Inf``, ``-Inf``, ``NaN``, else the
    shortest form that reads back exactly (integers as ``1.0``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def exposition(families: Iterable[MetricFamily]) -> str:
    """The text of one scrape."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.exposed_name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.exposed_name} {family.kind}")
        for sample in family.samples:
            labels = ",".join(f'{name}="{escape_label_value(value)}"'
                              for name, value in sample.labels.items())
            lines.append(f"{sample.name}{{{labels}}} {format_value(sample.value)}" if labels
                         else f"{sample.name} {format_value(sample.value)}")
    return "".join(f"{line}\n" for line in lines)

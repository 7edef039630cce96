"""The agent's Prometheus text exposition, read back by prometheus_client's own parser (an
independent implementation of format 0.0.4): names, labels with every character the format
escapes, values including the infinities and NaN, cumulative histogram buckets."""

from __future__ import annotations

import logging
import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nri_numa.agent.prometheus_text import (Counter, Histogram, LabelledCounter, MetricFamily,
                                            Registry, counter_family, exposition, format_value,
                                            gauge_family)


def parsed(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """family name -> its samples, as Prometheus's parser reads them."""
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


class Fixed:
    def __init__(self, *families: MetricFamily) -> None:
        self.families = families

    def collect(self) -> tuple[MetricFamily, ...]:
        return self.families


ODD_VALUES = ['back\\slash', 'a "quoted" word', "two\nlines", "\\n is not a newline",
              "trailing backslash\\", "ünïcode ✓", "", "{braces}=,"]


@pytest.mark.parametrize("value", ODD_VALUES)
def test_label_values_round_trip_through_prometheus_parser(value: str):
    family = gauge_family("odd", "Labels the format must escape.", ["v", "w"])
    family.add([value, "plain"], 3)
    assert parsed(exposition([family])) == {"odd": [("odd", {"v": value, "w": "plain"}, 3.0)]}


def test_label_escaping_is_the_formats():
    family = gauge_family("odd", "h", ["v"])
    family.add(['a\\b"c\nd'], 1)
    assert 'odd{v="a\\\\b\\"c\\nd"} 1.0\n' in exposition([family])


def test_help_escapes_backslash_and_newline_only():
    family = gauge_family("documented", 'Two\nlines, a \\ and a "quote".')
    family.add([], 1)
    text = exposition([family])
    assert '# HELP documented Two\\nlines, a \\\\ and a "quote".\n' in text
    [read] = text_string_to_metric_families(text)
    assert read.documentation == 'Two\nlines, a \\ and a "quote".'


@pytest.mark.parametrize("value", [0.0, 1.0, -2.5, 1e-9, 66571993088.0, 1795762261.7985141,
                                   2.0 ** 70, math.inf, -math.inf])
def test_values_read_back_exactly(value: float):
    family = gauge_family("v", "A value.")
    family.add([], value)
    assert parsed(exposition([family]))["v"][0][2] == value


def test_special_values_are_spelt_as_prometheus_spells_them():
    assert [format_value(v) for v in (math.inf, -math.inf, math.nan, 3, 0.25)] == [
        "+Inf", "-Inf", "NaN", "3.0", "0.25"]
    family = gauge_family("v", "A value.")
    family.add([], math.nan)
    assert math.isnan(parsed(exposition([family]))["v"][0][2])


def test_counters_expose_total_on_every_line_and_no_created_sample():
    counter = Counter("jobs", "Jobs done.")
    counter.inc()
    counter.inc(2)
    text = exposition(counter.collect())
    assert text == "# HELP jobs_total Jobs done.\n# TYPE jobs_total counter\njobs_total 3.0\n"
    [family] = text_string_to_metric_families(text)
    assert (family.name, family.type) == ("jobs", "counter")
    assert [(s.name, s.value) for s in family.samples] == [("jobs_total", 3.0)]


def test_a_counter_does_not_go_down():
    counter = Counter("jobs", "Jobs done.")
    with pytest.raises(ValueError, match="counter jobs can only go up, not by -1"):
        counter.inc(-1)
    assert counter.value == 0


def test_histogram_buckets_are_cumulative_with_inf_count_and_sum():
    histogram = Histogram("wait_ms", "Waits.", buckets=(1, 2, 4))
    for value in (0.5, 1, 1.5, 3, 3, 100):  # 1 is in le="1": the bound is inclusive
        histogram.observe(value)
    [family] = text_string_to_metric_families(exposition(histogram.collect()))
    assert family.type == "histogram"
    buckets = [(s.labels["le"], s.value) for s in family.samples if s.name == "wait_ms_bucket"]
    assert buckets == [("1.0", 2), ("2.0", 3), ("4.0", 5), ("+Inf", 6)]
    rest = {s.name: s.value for s in family.samples if s.name != "wait_ms_bucket"}
    assert rest == {"wait_ms_count": 6, "wait_ms_sum": 109.0}


def test_histogram_buckets_must_increase():
    with pytest.raises(ValueError, match="buckets must be increasing"):
        Histogram("h", "H.", buckets=(1, 1, 2))
    with pytest.raises(ValueError, match="buckets must be increasing"):
        Histogram("h", "H.", buckets=())


@pytest.mark.parametrize(("name", "labels", "problem"), [
    ("9lives", (), "'9lives' is not a Prometheus metric name"),
    ("a-b", (), "'a-b' is not a Prometheus metric name"),
    ("ok", ("bad-label",), "'bad-label' is not a label name to use"),
    ("ok", ("__reserved",), "'__reserved' is not a label name to use"),
    ("ok", ("le",), "'le' is not a label name to use"),
])
def test_bad_names_are_refused_with_one_line(name: str, labels: tuple[str, ...], problem: str):
    with pytest.raises(ValueError, match=problem):
        gauge_family(name, "Bad.", labels)


def test_a_sample_needs_a_value_for_every_label():
    family = gauge_family("g", "G.", ["a", "b"])
    with pytest.raises(ValueError, match=r"g: 1 label values for the labels \('a', 'b'\)"):
        family.add(["x"], 1)


class Broken:
    def collect(self) -> list[MetricFamily]:
        raise RuntimeError("boom")


def test_a_collector_that_raises_costs_its_families_only(caplog):
    registry = Registry()
    registry.register(Fixed(counter_family("before", "B.", 1)))
    registry.register(Broken())
    registry.register(Fixed(counter_family("after", "A.", 2)))
    with caplog.at_level(logging.ERROR):
        families = parsed(exposition(registry.collect()))
    assert families == {"before": [("before_total", {}, 1.0)],
                        "after": [("after_total", {}, 2.0)]}
    assert [r.getMessage() for r in caplog.records] == [
        "metrics: Broken failed; its metrics are left out of this scrape"]


def test_get_sample_value_matches_name_and_exact_labels():
    registry = Registry()
    family = gauge_family("free", "Free.", ["node", "pool"])
    family.add(["0", "shared"], 4)
    family.add(["1", "shared"], 5)
    registry.register(Fixed(family))
    histogram = registry.register(Histogram("d", "D.", buckets=(1,)))
    histogram.observe(0.5)
    assert registry.get_sample_value("free", {"node": "1", "pool": "shared"}) == 5
    assert registry.get_sample_value("free", {"node": "1"}) is None
    assert registry.get_sample_value("d_bucket", {"le": "1.0"}) == 1
    assert registry.get_sample_value("d_count") == 1
    assert registry.get_sample_value("absent") is None


def test_a_labelled_counter_keeps_a_kubelet_name_without_total_and_shows_every_series():
    counter = LabelledCounter("kubelet_like_count", "Named as the kubelet names it.",
                              ("boundary", "scope"),
                              [("numa_node", "pod"), ("numa_node", "container")], total=False)
    counter.inc(("numa_node", "pod"))
    text = exposition(counter.collect())
    assert "# TYPE kubelet_like_count counter\n" in text
    assert 'kubelet_like_count{boundary="numa_node",scope="pod"} 1.0\n' in text
    assert 'kubelet_like_count{boundary="numa_node",scope="container"} 0.0\n' in text
    [family] = text_string_to_metric_families(text)
    assert (family.name, family.type) == ("kubelet_like_count", "counter")
    with pytest.raises(ValueError, match="has no series"):
        counter.inc(("physical_cpu", "pod"))
    with pytest.raises(ValueError, match="can only go up"):
        counter.inc(("numa_node", "pod"), -1)

"""The pieces every input class shares, on any value: CPU lists and masks are refused before
they are expanded, annotations under numa.nri.io/ are read or refused in one line, and
``quote``/``clip``/``one_line`` always give one short line any stream can write."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from nri_numa.engine.annotations import (DEVICES, DEVICES_FOR, OVERRIDES, AnnotationError,
                                         pod_topology)
from nri_numa.engine.config_reader import config_from_mapping
from nri_numa.engine.devices.requested import parse_devices
from nri_numa.safeio.bounds import LINE_LIMIT, QUOTE_LIMIT, clip, one_line, quote
from nri_numa.topology.cpulist import MAX_EXPANDED, MAX_ID, ListFormatError, parse_list, parse_mask
from tests.property.bad_input import LONG, TEXT, VALUE, check_line, examples

LIST_PIECES = st.sampled_from(["0", "1", "7", "65535", "65536", "4294967295", "9" * 30, "-",
                               ",", ":", "2", "0-65535", "00", " ", "\x00", "\n", "١", "_"])
LISTS = st.one_of(TEXT, st.lists(LIST_PIECES, max_size=30).map("".join),
                  st.integers(1, 30_000).map(lambda n: "0-65535," * n + "0"))


@settings(max_examples=examples(300))
@given(LISTS)
def test_a_cpu_list_is_read_within_bounds_or_refused_in_one_line(text):
    began = time.monotonic()
    try:
        ids = parse_list(text)
    except ListFormatError as e:
        check_line(str(e))
    else:
        assert len(ids) <= MAX_EXPANDED and all(0 <= i <= MAX_ID for i in ids)
    assert time.monotonic() - began < 2  # measured, not expanded


@settings(max_examples=examples(200))
@given(st.one_of(TEXT, st.text(alphabet="0123456789abcdefABCDEF,", max_size=20_000)))
def test_a_cpu_mask_is_read_within_bounds_or_refused_in_one_line(text):
    try:
        ids = parse_mask(text)
    except ListFormatError as e:
        check_line(str(e))
    else:
        assert all(0 <= i <= MAX_ID for i in ids)


NAMES = st.one_of(st.sampled_from([*OVERRIDES, DEVICES, DEVICES_FOR + "c", "numa.nri.io/x"]),
                  TEXT.map(lambda t: "numa.nri.io/" + t))
DEVICE_VALUES = st.one_of(TEXT, st.lists(st.sampled_from(
    ["nvidia.com/gpu", "=", "2", "0", "9" * 30, ",", "nic", "pci/15b3:1021", "pci/zz", " ",
     "²", "١", "1024", "1025"]), max_size=12).map("".join))


@settings(max_examples=examples(200))
@given(st.dictionaries(NAMES, st.one_of(TEXT, DEVICE_VALUES, VALUE), max_size=3),
       st.booleans())
def test_annotations_are_read_or_refused_in_one_line(annotations, overrides):
    config = config_from_mapping({"topologyManagerPolicy": "restricted",
                                  "allowPodOverrides": overrides})
    try:
        pod_topology(config, annotations, other_known=[DEVICES])
    except AnnotationError as e:
        check_line(str(e))


@settings(max_examples=examples(200))
@given(DEVICE_VALUES, st.sampled_from([DEVICES, DEVICES_FOR + "c", DEVICES_FOR + "x" * 5000]))
def test_device_annotations_are_read_or_refused_in_one_line(value, annotation):
    try:
        counts = parse_devices(value, annotation)
    except AnnotationError as e:
        check_line(str(e))
    else:
        assert all(0 < n <= 1024 for n in counts.values())


@settings(max_examples=examples(300))
@given(st.one_of(VALUE, LONG, TEXT))
def test_a_quoted_value_is_one_short_line(value):
    for shown in (quote(value), clip(value) if isinstance(value, str) else quote(value)):
        assert "\n" not in shown and len(shown) <= 2 * QUOTE_LIMIT + 40, shown
        shown.encode("utf-8")


@settings(max_examples=examples(300))
@given(st.one_of(TEXT, LONG), st.integers(10, LINE_LIMIT))
def test_one_line_is_one_line(text, limit):
    line = one_line(text, limit)
    assert len(line) <= limit and "\n" not in line and "\r" not in line
    line.encode("utf-8")

import pytest
from hypothesis import given, strategies as st

from nri_numa.topology.cpulist import (ListFormatError, format_list, format_mask, parse_list,
                                       parse_mask)


@pytest.mark.parametrize("text, expected", [
    ("", set()),
    ("\n", set()),
    ("0", {0}),
    ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
    ("0-3\x00", {0, 1, 2, 3}),             # hwloc fixtures end some files in NUL
    ("2,4-31,32-63", set(range(4, 64)) | {2}),  # unmerged neighbours, as the kernel docs show
    ("0-8:4", {0, 4, 8}),                  # the stride form cgroup files accept
])
def test_parse_list(text, expected):
    assert parse_list(text) == expected


@pytest.mark.parametrize("text", ["a", "1-", "-1", "3-1", "1,,2", "0-8:0", "1.5"])
def test_parse_list_rejects_garbage_with_the_text_named(text):
    with pytest.raises(ListFormatError, match="list"):
        parse_list(text)


@pytest.mark.parametrize("text, expected", [
    ("0000,0000000f", {0, 1, 2, 3}),
    ("00000003\n", {0, 1}),
    ("f0000000,00000000", set(range(60, 64))),
    ("", set()),
])
def test_parse_mask(text, expected):
    assert parse_mask(text) == expected


def test_parse_mask_rejects_garbage():
    with pytest.raises(ListFormatError, match="mask"):
        parse_mask("zz")


@given(st.frozensets(st.integers(0, 2000)))
def test_list_round_trip(ids):
    assert parse_list(format_list(ids)) == ids


@given(st.frozensets(st.integers(0, 300)))
def test_mask_round_trip(ids):
    assert parse_mask(format_mask(ids)) == ids


def test_format_merges_ranges():
    assert format_list([5, 1, 2, 3, 7, 8]) == "1-3,5,7-8"
    assert format_mask({0, 33}, width_bits=64) == "00000002,00000001"

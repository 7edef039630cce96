"""Kubernetes quantities: apimachinery's grammar, rounding up, and clear refusals."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nri_numa.engine.quantity import (BINARY_SUFFIXES, DECIMAL_SUFFIXES, MAX_INT64,
                                      QuantityError, bytes_value, cpu_millicores, format_binary,
                                      format_millicores, parse_quantity, resource_amount,
                                      whole_count)

GI = 2**30


@pytest.mark.parametrize("text, millicores", [
    ("500m", 500),
    ("2", 2000),
    ("1.5", 1500),
    ("2000m", 2000),
    ("100k", 100_000_000),
    ("1e3", 1_000_000),
    ("1E3", 1_000_000),  # E followed by digits is an exponent, not exa
    ("1e+3", 1_000_000),
    ("1e-3", 1),
    (".5", 500),
    ("1.", 1000),
    ("+3", 3000),
    ("0", 0),
    ("-0", 0),
    ("000", 0),
    ("0.1m", 1),  # rounded up: a non-zero request never becomes zero
    ("1n", 1),
    ("1u", 1),
    ("1001u", 2),
    (" 250m ", 250),  # the API server trims blanks
    (2, 2000),
    (0.5, 500),
    (1e-05, 1),
])
def test_cpu_millicores(text, millicores):
    assert cpu_millicores(text) == millicores


@pytest.mark.parametrize("text, amount", [
    ("2Gi", 2 * GI),
    ("512Mi", 512 * 2**20),
    ("1G", 10**9),
    ("1M", 10**6),
    ("1Mi", 2**20),
    ("1k", 1000),
    ("1Ki", 1024),
    ("1e3", 1000),
    ("100k", 100_000),
    ("1.5Gi", 1610612736),
    ("0.5Ki", 512),
    ("1.5", 2),  # bytes round up as Quantity.Value() does
    ("100m", 1),
    ("7Ei", 7 * 2**60),
    ("1E", 10**18),  # E alone is exa
    ("9223372036854775807", MAX_INT64),
    ("1e-999999999", 1),  # vanishingly small but not zero
])
def test_bytes_value(text, amount):
    assert bytes_value(text) == amount


def test_parse_quantity_is_exact():
    assert parse_quantity("1.2345") == Fraction(12345, 10000)
    assert parse_quantity("3Ki") == 3072
    assert parse_quantity("0.1") + parse_quantity("0.2") == parse_quantity("0.3")


@pytest.mark.parametrize("value, fragment", [
    ("abc", 'bad quantity "abc"'),
    ("", 'bad quantity ""'),
    ("   ", 'bad quantity ""'),
    ("1K", 'unknown suffix "K"'),  # kilo is a lowercase k
    ("1ki", 'unknown suffix "ki"'),
    ("1 Gi", 'unknown suffix " Gi"'),
    ("1e", 'unknown suffix "e"'),
    ("1e3.5", 'unknown suffix "e3.5"'),
    ("1.2.3", 'unknown suffix ".3"'),
    ("0x10", 'unknown suffix "x10"'),
    ("Gi", 'bad quantity "Gi"'),  # Go reads this as zero; a number needs a digit here
    (".", 'bad quantity "."'),
    ("-1", "must not be negative"),
    ("-500m", "must not be negative"),
    ("8Ei", "too large"),  # Go caps it silently at 2^63-1
    ("9223372036854775808", "too large"),
    ("1e999999999", "too large"),
    ("1" * 101, "longer than 100 characters"),
    (True, "not bool"),
    (None, "not NoneType"),
    ([1], "not list"),
    (float("inf"), "finite"),
    (float("nan"), "finite"),
    (-1, "must not be negative"),
])
def test_bad_quantities_are_named(value, fragment):
    with pytest.raises(QuantityError) as e:
        bytes_value(value)
    assert fragment in str(e.value)


def test_cpu_too_large_in_millicores():
    # 10^16 cores fit in an int64 of bytes but not of millicores.
    assert bytes_value("10P") == 10**16
    with pytest.raises(QuantityError, match="too large .* millicores"):
        cpu_millicores("10P")


@pytest.mark.parametrize("value, count", [("2", 2), (3, 3), ("2000m", 2), ("1k", 1000), ("0", 0)])
def test_whole_count(value, count):
    assert whole_count(value) == count


@pytest.mark.parametrize("value", ["1.5", "500m", 0.5])
def test_whole_count_refuses_fractions(value):
    with pytest.raises(QuantityError, match="whole number"):
        whole_count(value)


def test_resource_amount_uses_the_kubelet_unit():
    assert resource_amount("cpu", "1.5") == 1500
    assert resource_amount("memory", "1.5") == 2
    assert resource_amount("hugepages-2Mi", "4Mi") == 4 * 2**20


@pytest.mark.parametrize("amount, text", [
    (0, "0"), (1023, "1023"), (1024, "1Ki"), (1536, "1536"), (2 * 2**20, "2Mi"),
    (1536 * 1024, "1536Ki"), (GI, "1Gi"), (16 * GI, "16Gi"), (2**60, "1Ei"), (3 * 2**61, "6Ei"),
])
def test_format_binary(amount, text):
    assert format_binary(amount) == text
    assert bytes_value(text) == amount


@pytest.mark.parametrize("millicores, text", [(0, "0"), (2000, "2"), (1500, "1500m"), (1, "1m")])
def test_format_millicores(millicores, text):
    assert format_millicores(millicores) == text


@given(st.integers(0, 10**6), st.sampled_from(sorted(BINARY_SUFFIXES)))
def test_binary_suffixes_multiply_by_powers_of_1024(n, suffix):
    assert parse_quantity(f"{n}{suffix}") == n * BINARY_SUFFIXES[suffix]


@given(st.integers(0, 10**6), st.sampled_from(sorted(DECIMAL_SUFFIXES)))
def test_decimal_suffixes_multiply_by_powers_of_ten(n, suffix):
    assert parse_quantity(f"{n}{suffix}") == n * Fraction(10) ** DECIMAL_SUFFIXES[suffix]


@given(st.decimals(min_value=0, max_value=10**9, places=6, allow_nan=False, allow_infinity=False),
       st.integers(-12, 6))
def test_exponent_form_matches_decimal_arithmetic(number, exponent):
    text = f"{number:f}e{exponent}"
    expected = Fraction(Decimal(number)) * Fraction(10) ** exponent
    assert parse_quantity(text) == expected
    assert cpu_millicores(text) == -(-expected * 1000 // 1)


@given(st.integers(0, 10**12))
def test_millicores_round_trip(millicores):
    assert cpu_millicores(format_millicores(millicores)) == millicores
    assert cpu_millicores(f"{millicores}m") == millicores

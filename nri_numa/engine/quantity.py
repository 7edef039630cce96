"""Kubernetes resource quantities ("500m", "2", "1.5Gi", "1e3") as the kubelet sees them.

The grammar is apimachinery's ``resource.Quantity``: a decimal number (``2``, ``1.5``, ``.5``,
``1.``) with an optional sign and one optional suffix —

* binary SI: ``Ki Mi Gi Ti Pi Ei`` (powers of 1024);
* decimal SI: ``n u m k M G T P E`` (note ``k`` is lowercase and ``E`` alone is exa);
* a decimal exponent: ``e3``, ``E-2``, ``e+6``.

Values are exact fractions: the kubelet never uses floating point for quantities. Converting to
an integer unit rounds *up*, as ``Quantity.MilliValue()`` and ``Quantity.Value()`` do, so
``"0.1m"`` of CPU is 1 millicore and ``"1.5"`` bytes is 2 bytes (a non-zero request never
becomes zero).

Deliberate differences from apimachinery, all stricter:

* a number needs at least one digit (Go also accepts ``"."``, ``"m"`` or ``"Gi"`` as zero);
* negative quantities are rejected: nothing this engine reads may be negative;
* a value beyond 2^63-1 in the unit asked for is rejected instead of overflowing (the kubelet's
  int64 accessors would wrap) or being capped (Go silently caps ``"8Ei"`` at 2^63-1);
* at most ``MAX_QUANTITY_LENGTH`` characters, so a hostile string cannot make us build huge ints.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING

from nri_numa.safeio.bounds import quote

if TYPE_CHECKING:
    from fractions import Fraction

MAX_INT64 = 2**63 - 1
MAX_QUANTITY_LENGTH = 100

BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15,
                    "E": 18}

_NUMBER = re.compile(r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>.*)",
                     re.DOTALL)
_EXPONENT = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)")

# With at most MAX_QUANTITY_LENGTH digits a non-zero mantissa lies in [1e-100, 1e100], so beyond
# these exponents the value is certainly too large, or certainly below one nano-unit.
_EXPONENT_BOUND = 2 * MAX_QUANTITY_LENGTH

_SUFFIX_HELP = ("a number with an optional suffix: m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei "
                "or an exponent such as e3")


class QuantityError(ValueError):
    """A value that is not a usable Kubernetes quantity; the message quotes it."""


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact, non-negative value of a quantity, in its base unit (cores, bytes, devices).

    Accepts the string form, and ints and finite floats as YAML or JSON numbers give them
    (``cpu: 2``, ``cpu: 0.5``), which is how the API server reads numbers too.
    """
    # Imported here (with decimal, which it loads): a hook process that reads no quantity,
    # as createRuntime and poststop do not, never pays for them.
    from fractions import Fraction

    text = _as_text(value)
    match = _NUMBER.fullmatch(text)
    assert match is not None  # the pattern matches every string
    whole, frac = match["whole"], match["frac"] or ""
    if not whole and not frac:
        raise QuantityError(f"bad quantity {_quote(text)}: expected {_SUFFIX_HELP}")
    mantissa = Fraction(int(whole + frac or "0"), 10 ** len(frac))
    amount = _apply_suffix(mantissa, match["suffix"], text)
    if match["sign"] == "-" and amount != 0:
        raise QuantityError(f"bad quantity {_quote(text)}: must not be negative")
    return amount


def cpu_millicores(value: str | int | float) -> int:
    """CPU quantity → millicores, rounded up ("500m" → 500, "1.5" → 1500, "0.1m" → 1)."""
    return _to_int(parse_quantity(value) * 1000, value, "millicores")


def bytes_value(value: str | int | float) -> int:
    """Memory or hugepages quantity → bytes, rounded up ("2Gi" → 2147483648, "1G" → 10**9)."""
    return _to_int(parse_quantity(value), value, "bytes")


def whole_count(value: str | int | float) -> int:
    """A count that must be a whole number, as extended resources (``nvidia.com/gpu``) are."""
    amount = parse_quantity(value)
    if amount.denominator != 1:
        raise QuantityError(f"bad quantity {_quote(_as_text(value))}: must be a whole number")
    return _to_int(amount, value, "units")


def resource_amount(resource: str, value: str | int | float) -> int:
    """A quantity in the integer unit the kubelet uses for ``resource``: millicores for ``cpu``,
    the rounded-up base unit (bytes, devices, ...) for everything else."""
    return cpu_millicores(value) if resource == "cpu" else bytes_value(value)


def format_binary(amount: int) -> str:
    """Bytes in apimachinery's canonical binary form: 2097152 → "2Mi", 1536 → "1536", 0 → "0".

    The largest power-of-1024 suffix that divides the amount exactly, as ``Quantity.String()``
    writes a BinarySI value; amounts below 1024 have no suffix.
    """
    if amount < 0:
        raise ValueError(f"negative amount {amount}")
    if amount < 1024:
        return str(amount)
    for suffix, factor in reversed(BINARY_SUFFIXES.items()):
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)


def format_millicores(millicores: int) -> str:
    """Millicores as a person writes them: 2000 → "2", 1500 → "1500m"."""
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def _quote(text: str) -> str:
    # Double quotes, as Kubernetes prints quantities in its own errors.
    return json.dumps(text, ensure_ascii=False)


def _as_text(value: object) -> str:
    # bool is an int in Python, but "cpu: true" is a mistake, not one CPU.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"bad quantity {quote(value)}: expected a string such as \"500m\" or "
                            f"\"2Gi\", or a number, not {type(value).__name__}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"bad quantity {value!r}: must be a finite number")
        return repr(value)
    if isinstance(value, int) and value.bit_length() > 4 * MAX_QUANTITY_LENGTH:
        # str() of it would be slow, or raise past 4300 digits; too long either way.
        raise QuantityError(f"bad quantity {quote(value)}: longer than "
                            f"{MAX_QUANTITY_LENGTH} characters")
    text = str(value).strip()  # the API server trims surrounding blanks too
    if len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityError(f"bad quantity {_quote(text[:20] + '...')}: longer than "
                            f"{MAX_QUANTITY_LENGTH} characters")
    return text


def _apply_suffix(mantissa: Fraction, suffix: str, text: str) -> Fraction:
    from fractions import Fraction

    if suffix in BINARY_SUFFIXES:
        return mantissa * BINARY_SUFFIXES[suffix]
    if suffix in DECIMAL_SUFFIXES:
        return mantissa * Fraction(10) ** DECIMAL_SUFFIXES[suffix]
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise QuantityError(f"bad quantity {_quote(text)}: unknown suffix {_quote(suffix)}; "
                            f"expected {_SUFFIX_HELP}")
    power = int(exponent["exp"])
    if mantissa != 0 and power > _EXPONENT_BOUND:
        raise QuantityError(f"bad quantity {_quote(text)}: too large")
    # Clamping a tiny exponent keeps the value positive and below any unit we round up to.
    return mantissa * Fraction(10) ** max(power, -_EXPONENT_BOUND)


def _to_int(amount: Fraction, value: object, unit: str) -> int:
    result = math.ceil(amount)
    if result > MAX_INT64:
        raise QuantityError(f"bad quantity {_quote(_as_text(value))}: too large ({result} {unit} "
                            "is more than 2^63-1)")
    return result

"""Kubernetes resource quantities ("1", "20000", "1.5", "2Gi", "500m", "1e3") as exact fractions.

GPU resources in HAMi are plain integers (count, MiB, percent), but a Pod may carry any valid
quantity; parsing them exactly lets the request derivation refuse a non-integer value instead of
silently truncating it.
"""

from __future__ import annotations

import re
from fractions import Fraction

from shared.core.errors import RequestError, shown

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)


MAX_QUANTITY_CHARS = 64
"""Characters of a quantity string: far more than any GPU value needs (2^31-1 has 10 digits),
and few enough that Python's int() never refuses it (it does over 4300 digits, with a bare
ValueError that no caller expects from the core)."""


def parse_quantity(value: object) -> Fraction:
    """Parse a quantity given as a string or a JSON number; raise RequestError when invalid."""
    if isinstance(value, bool):
        raise RequestError(f"quantity {value!r} is a boolean")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RequestError(f"quantity {value!r} is not finite")
        return Fraction(value)
    if not isinstance(value, str):
        raise RequestError(f"quantity {shown(value)} is not a string or number")
    if len(value) > MAX_QUANTITY_CHARS:
        raise RequestError(
            f"quantity {shown(value)} is too long: at most {MAX_QUANTITY_CHARS} characters"
        )
    match = _PATTERN.match(value.strip())
    if match is None:
        raise RequestError(f"quantity {shown(value)} is not a valid Kubernetes quantity")
    number = Fraction(match["num"])
    if match["bin"]:
        number *= _BINARY[match["bin"]]
    elif match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > 100:
            raise RequestError(f"quantity {value!r} has an unreasonable exponent")
        number *= Fraction(10) ** exponent
    else:
        number *= _DECIMAL[match["dec"] or ""]
    return -number if match["sign"] == "-" else number


def parse_integer_quantity(value: object, what: str) -> int:
    """Parse a quantity that must be a whole number (GPU counts, MiB, percent)."""
    try:
        number = parse_quantity(value)
    except RequestError as exc:
        raise RequestError(f"{what}: {exc}") from None  # name the resource, not only the value
    if number.denominator != 1:
        raise RequestError(f"{what} {shown(value)} is not a whole number")
    return int(number)

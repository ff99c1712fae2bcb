"""Kubernetes resource quantities ("500m", "1.5Gi", "2e3") as exact decimals.

Used wherever a component reads a ResourceList: the scheduler's fit and scoring, the node
agent's cgroup limits, downward API values and emptyDir size limits.
"""

from __future__ import annotations

import decimal
import math
import re

_SUFFIXES = {
    "": 1,
    "n": decimal.Decimal("1e-9"),
    "u": decimal.Decimal("1e-6"),
    "m": decimal.Decimal("1e-3"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|([numkMGTPE]i?|Ki|))$")


class QuantityError(ValueError):
    pass


def parse_quantity(value: object) -> decimal.Decimal:
    """The exact value of a quantity string (or number)."""
    if isinstance(value, bool):
        raise QuantityError(f"quantities must match the regular expression: {value!r}")
    if isinstance(value, int | float):
        return decimal.Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match or (match.group(3) or "") not in _SUFFIXES:
        raise QuantityError(f"quantities must match the regular expression: {value!r}")
    number = decimal.Decimal(match.group(1))
    if match.group(2):
        return number * (decimal.Decimal(10) ** int(match.group(2)[1:]))
    return number * _SUFFIXES[match.group(3) or ""]


def milli_value(value: object) -> int:
    """Go's `Quantity.MilliValue()`: thousandths, rounded up."""
    return math.ceil(parse_quantity(value) * 1000)


def int_value(value: object) -> int:
    """Go's `Quantity.Value()`: whole units, rounded up."""
    return math.ceil(parse_quantity(value))

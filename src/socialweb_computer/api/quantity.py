"""Kubernetes resource quantities ("500m", "1.5Gi", "2e3") with Go's arithmetic and printing.

Admission messages and ResourceQuota status print quantities the way apimachinery's
`Quantity.String()` does: the canonical form in the quantity's own format (binary SI when it
was written with Ki/Mi/..., decimal SI with m/k/M/..., or an exponent), with the largest
suffix that keeps the number whole ("1536Mi" stays, "2048Mi" is "2Gi", "0.5" is "500m"),
precision beyond nano rounded up. Sums keep the format of their first operand, as
`Quantity.Add` does. Written by hand: no Python library prints Go's canonical form.
Used wherever a component reads a ResourceList: admission (LimitRanger, ResourceQuota), the
quota controller, the scheduler's fit and scoring, the node agent's cgroup limits, downward API
values and emptyDir size limits.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re

BINARY_SI, DECIMAL_SI, DECIMAL_EXPONENT = "BinarySI", "DecimalSI", "DecimalExponent"

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_PATTERN = re.compile(
    r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
_NANO = decimal.Decimal("1e-9")
_CONTEXT = decimal.Context(prec=60)


class QuantityError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Quantity:
    value: decimal.Decimal
    format: str = DECIMAL_SI

    @classmethod
    def parse(cls, text: object) -> Quantity:
        if isinstance(text, Quantity):
            return text
        if isinstance(text, bool):
            raise QuantityError(
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        if isinstance(text, int):
            return cls(decimal.Decimal(text))
        if isinstance(text, float):
            return cls(decimal.Decimal(repr(text)))
        match = _PATTERN.match(str(text).strip())
        if not match:
            raise QuantityError(
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        number = decimal.Decimal(match[1])
        if match[2]:
            return cls(number.scaleb(int(match[2][1:]), _CONTEXT), DECIMAL_EXPONENT)
        suffix = match[3] or ""
        if suffix in _BINARY:
            return cls(_CONTEXT.multiply(number, decimal.Decimal(_BINARY[suffix])), BINARY_SI)
        return cls(number.scaleb(_DECIMAL[suffix], _CONTEXT), DECIMAL_SI)

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(_CONTEXT.add(self.value, other.value), self.format)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(_CONTEXT.subtract(self.value, other.value), self.format)

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __le__(self, other: Quantity) -> bool:
        return self.value <= other.value

    def cmp(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def milli_value(self) -> int:
        """Go's MilliValue(): thousandths, rounded up."""
        return math.ceil(self.value * 1000)

    def __str__(self) -> str:
        return canonical(self.value, self.format)


def _nano_ceiling(value: decimal.Decimal) -> decimal.Decimal:
    if value == value.quantize(_NANO, rounding=decimal.ROUND_CEILING):
        return value
    return value.quantize(_NANO, rounding=decimal.ROUND_CEILING)


def canonical(value: decimal.Decimal, fmt: str) -> str:
    """Quantity.String(): the canonical text of `value` in format `fmt`."""
    value = _nano_ceiling(value)
    if value == 0:
        return "0"
    if fmt == BINARY_SI and (value != value.to_integral_value() or -1024 < value < 1024):
        fmt = DECIMAL_SI
    if fmt == BINARY_SI:
        mantissa, power = int(value), 0
        while power < 6 and mantissa % 1024 == 0:
            mantissa //= 1024
            power += 1
        return f"{mantissa}{['', 'Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'][power]}"
    for exponent in range(18, -12, -3):
        scaled = value.scaleb(-exponent, _CONTEXT)
        if scaled == scaled.to_integral_value():
            mantissa = int(scaled)
            break
    if fmt == DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def parse(text: object) -> Quantity:
    return Quantity.parse(text)


def zero(fmt: str = DECIMAL_SI) -> Quantity:
    return Quantity(decimal.Decimal(0), fmt)


def parse_quantity(value: object) -> decimal.Decimal:
    """The exact value of a quantity string (or number)."""
    return Quantity.parse(value).value


def milli_value(value: object) -> int:
    """Go's `Quantity.MilliValue()`: thousandths, rounded up."""
    return math.ceil(parse_quantity(value) * 1000)


def int_value(value: object) -> int:
    """Go's `Quantity.Value()`: whole units, rounded up."""
    return math.ceil(parse_quantity(value))

"""Kubernetes resource quantities: exact parsing, arithmetic and canonical text.

A PodGroup's ``minResources`` is a sum of container requests, and deciding whether a PodGroup
needs an update means comparing quantities by value ("1" equals "1000m", "1Gi" equals
"1024Mi"). The ``kubernetes`` client has a parser, but pure code may not import it, so this is
a small exact one on :class:`decimal.Decimal`.

Canonical text follows the API machinery's rules, so that the sums we write read like the ones
upstream's controller writes ("42Gi", "21", "1500m"): a sum keeps the format of its first term;
binary quantities print with the largest ``Ki``..``Ei`` suffix that divides them, unless they are
below 1024 or fractional; decimal quantities print with an SI suffix whose exponent is a multiple
of three; anything finer than a nano-unit is rounded up to one.

Used by :mod:`mpijob.desired.min_resources` and :mod:`mpijob.desired.podgroup`.
"""

from __future__ import annotations

import decimal
import enum
import re
from dataclasses import dataclass, field
from decimal import Decimal

_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)"
_QUANTITY = re.compile(
    rf"^(?P<number>{_NUMBER})(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?\d+)|(?P<si>[numkMGTPE]?))$"
)

_BINARY_POWERS = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SI_EXPONENTS = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_SI_SUFFIXES = {exponent: suffix for suffix, exponent in _SI_EXPONENTS.items()}
_BINARY_SUFFIXES = {power // 10: suffix for suffix, power in _BINARY_POWERS.items()}
_NANO = Decimal("1e-9")
# Quantities are exact, but big integers times 10**18 exceed the default 28 digits.
_CONTEXT = decimal.Context(prec=100, rounding=decimal.ROUND_CEILING)


class QuantityFormat(enum.Enum):
    """How a quantity was written, which decides how its sums are printed."""

    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


@dataclass(frozen=True)
class Quantity:
    """An exact amount of a resource. Equality and hashing look at the value only."""

    value: Decimal
    format: QuantityFormat = field(default=QuantityFormat.DECIMAL_SI, compare=False)

    @classmethod
    def parse(cls, text: str | int | float) -> Quantity:
        """Parse a quantity as it appears in a manifest (a string, or a bare YAML number)."""
        if isinstance(text, bool):
            raise ValueError(f"quantities must be numbers or strings, not {text!r}")
        if isinstance(text, int):
            return cls(Decimal(text))
        if isinstance(text, float):
            return cls(Decimal(repr(text)))
        match = _QUANTITY.match(text.strip())
        if match is None:
            raise ValueError(
                f"quantities must match the regular expression of Kubernetes: {text!r}"
            )
        number = Decimal(match["number"])
        if match["binary"] is not None:
            power = _BINARY_POWERS[match["binary"]]
            return cls(_CONTEXT.multiply(number, Decimal(2) ** power), QuantityFormat.BINARY_SI)
        if match["exponent"] is not None:
            value = number.scaleb(int(match["exponent"]), _CONTEXT)
            return cls(value, QuantityFormat.DECIMAL_EXPONENT)
        return cls(number.scaleb(_SI_EXPONENTS[match["si"]], _CONTEXT))

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(_CONTEXT.add(self.value, other.value), self.format)

    def times(self, factor: int) -> Quantity:
        """This quantity multiplied by a replica count."""
        return Quantity(_CONTEXT.multiply(self.value, Decimal(factor)), self.format)

    def __str__(self) -> str:
        value = self.value
        if _CONTEXT.remainder(value, _NANO):
            value = value.quantize(_NANO, context=_CONTEXT)
        if value == 0:
            return "0"
        if (
            self.format is QuantityFormat.BINARY_SI
            and abs(value) >= 1024
            and value == value.to_integral_value()
        ):
            return _binary_text(int(value))
        return _decimal_text(value, self.format)


def parse(text: str | int | float) -> Quantity:
    """Shorthand for :meth:`Quantity.parse`."""
    return Quantity.parse(text)


def canonical(text: str | int | float) -> str:
    """The canonical spelling of a quantity (``"1000m"`` becomes ``"1"``)."""
    return str(Quantity.parse(text))


def _binary_text(amount: int) -> str:
    power = 0
    while amount % 1024 == 0 and power < max(_BINARY_SUFFIXES):
        amount //= 1024
        power += 1
    return f"{amount}{_BINARY_SUFFIXES[power] if power else ''}"


def _decimal_text(value: Decimal, fmt: QuantityFormat) -> str:
    mantissa = int(value.scaleb(9, _CONTEXT))
    exponent = -9
    while mantissa % 1000 == 0 and exponent < max(_SI_SUFFIXES):
        mantissa //= 1000
        exponent += 3
    if fmt is QuantityFormat.DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{_SI_SUFFIXES[exponent]}"

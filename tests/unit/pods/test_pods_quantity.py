"""The Kubernetes quantity parser and its canonical text."""

from __future__ import annotations

from decimal import Decimal

import pytest

from mpijob.pods import quantity
from mpijob.pods.quantity import Quantity

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", Decimal(1)),
        ("1000m", Decimal(1)),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("100n", Decimal("1e-7")),
        ("250u", Decimal("0.00025")),
        ("2k", Decimal(2000)),
        ("3M", Decimal(3_000_000)),
        ("1G", Decimal(10**9)),
        ("1T", Decimal(10**12)),
        ("1P", Decimal(10**15)),
        ("1E", Decimal(10**18)),
        ("1Ki", Decimal(1024)),
        ("1.5Gi", Decimal(1536 * 1024**2)),
        ("1Ei", Decimal(1024**6)),
        ("12e3", Decimal(12000)),
        ("1E-3", Decimal("0.001")),
        ("-2", Decimal(-2)),
        ("+2", Decimal(2)),
        (" 4 ", Decimal(4)),
        (7, Decimal(7)),
        (2.5, Decimal("2.5")),
    ],
)
def test_parse(text: str | int | float, value: Decimal) -> None:
    assert Quantity.parse(text).value == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1gi", "1Ki5", "1.2.3", "0x10", "1KiB", "e3"])
def test_malformed_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="regular expression"):
        Quantity.parse(text)


def test_booleans_are_not_quantities() -> None:
    with pytest.raises(ValueError, match="True"):
        Quantity.parse(True)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("1000m", "1"),
        ("1.5", "1500m"),
        ("1500", "1500"),
        ("2000", "2k"),
        ("0.1", "100m"),
        ("0", "0"),
        ("0Gi", "0"),
        ("42Gi", "42Gi"),
        ("1536Mi", "1536Mi"),
        ("2048Ki", "2Mi"),
        ("512Ki", "512Ki"),
        ("0.5Ki", "512"),
        ("1.5Ki", "1536"),
        ("1e3", "1e3"),
        ("1500e-3", "1500e-3"),
        ("0.0000000001", "1n"),
        ("-1500m", "-1500m"),
    ],
)
def test_canonical(text: str, canonical: str) -> None:
    """Canonical text as the API machinery prints it (binary below 1024 prints as decimal)."""
    assert quantity.canonical(text) == canonical


def test_equal_values_are_equal_whatever_their_spelling() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1073741824") == Quantity.parse("1024Mi")
    assert len({Quantity.parse("1"), Quantity.parse("1000m")}) == 1
    assert Quantity.parse("1") != Quantity.parse("1001m")


def test_sums_keep_the_first_terms_format() -> None:
    assert str(Quantity.parse("1Gi") + Quantity.parse("1G")) == "2073741824"
    assert str(Quantity.parse("1G") + Quantity.parse("1Gi")) == "2073741824"
    assert str(Quantity.parse("20Gi").times(2) + Quantity.parse("2Gi")) == "42Gi"
    assert str(Quantity.parse("100m").times(10)) == "1"


def test_huge_values_stay_exact() -> None:
    big = Quantity.parse("100000Gi").times(100_000)
    assert big.value == Decimal(100_000 * 100_000 * 1024**3)
    assert str(big) == "9765625Ti"

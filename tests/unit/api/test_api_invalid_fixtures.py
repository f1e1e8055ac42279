"""Every malformed MPIJob under tests/data/invalid is refused, naming the offending field.

Each fixture's header says who must refuse it: ``apiserver`` (our CRD's schema or CEL rules) or
``operator`` (parsing, validation and the operator's own rules, as the reconcile checks them).
The operator must refuse its own share; it refuses the API server's share too, so that jobs
stored under upstream's CRD get the same verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mpijob import api
from mpijob.handlers import reconcile
from mpijob.settings import OperatorSettings

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "invalid"
HEADER = re.compile(r"^# expect: (apiserver|operator) (\S+)$")
#: The API server refuses these; Go defaulting (and ours) would have repaired them.
REPAIRED_BY_DEFAULTING = {"empty-implementation.yaml"}


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.yaml"))


def _expectation(path: Path) -> tuple[str, str]:
    match = HEADER.match(path.read_text().splitlines()[0])
    assert match, f"{path.name}: first line must be '# expect: <who> <field>'"
    return match.group(1), match.group(2)


def _operator_verdict(path: Path) -> str | None:
    """The operator's error message for the fixture, or None if it would run the job."""
    job, errors = reconcile.checked(yaml.safe_load(path.read_text()), OperatorSettings())
    return api.validation_message(errors) if job is None or errors else None


def _dotted(text: str) -> str:
    # The API server writes map keys as ``.Key``; validation writes them as ``[Key]``.
    return re.sub(r"\[([A-Za-z][^\]]*)\]", r".\1", text)


def test_there_are_enough_distinct_fixtures() -> None:
    fixtures = _fixtures()
    assert len(fixtures) >= 24
    bodies = {yaml.safe_dump(yaml.safe_load(p.read_text()), sort_keys=True) for p in fixtures}
    assert len(bodies) == len(fixtures)
    who = {_expectation(p)[0] for p in fixtures}
    assert who == {"apiserver", "operator"}


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.stem)
def test_invalid_fixture_is_refused_naming_the_field(path: Path) -> None:
    who, field = _expectation(path)
    message = _operator_verdict(path)
    if path.name in REPAIRED_BY_DEFAULTING:
        assert who == "apiserver"
        assert message is None
        return
    assert message is not None, f"{path.name}: the operator would run this job"
    assert field in message or _dotted(field) in _dotted(message), message

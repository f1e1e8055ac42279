"""Kubernetes timestamps (``metav1.Time``): parsed into UTC to the second, written as RFC 3339
with a ``Z``, whatever zone or precision they came in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from mpijob.api.models import MPIJobStatus, format_time, parse_time, utc_seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (datetime(2026, 11, 28, 2, 14, 38, tzinfo=UTC), "2026-11-28T02:14:38Z"),
        (datetime(2026, 11, 28, 2, 14, 38, 999_999, tzinfo=UTC), "2026-11-28T02:14:38Z"),
        (datetime(2026, 11, 28, 2, 14, 38), "2026-11-28T02:14:38Z"),  # naive: UTC
        (
            datetime(2026, 6, 1, 23, 59, 59, 500, tzinfo=timezone(timedelta(hours=-7))),
            "2026-06-02T06:59:59Z",
        ),
        (datetime(5, 1, 1, tzinfo=UTC), "0005-01-01T00:00:00Z"),  # four digits, as Go writes
        (datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), "9999-12-31T23:59:59Z"),
    ],
)
def test_a_time_is_written_in_utc_to_the_second(value: datetime, written: str) -> None:
    assert format_time(value) == written
    assert parse_time(written) == utc_seconds(value)


def test_a_time_in_utc_is_kept_as_it_is_or_cut_to_the_second() -> None:
    whole = datetime(2026, 11, 28, 2, 14, 38, tzinfo=UTC)
    assert utc_seconds(whole) is whole  # nothing to change: not copied
    cut = utc_seconds(whole.replace(microsecond=1))
    assert cut == whole
    assert cut.tzinfo is UTC
    assert utc_seconds(whole.astimezone(timezone(timedelta(hours=9)))).tzinfo is UTC
    assert utc_seconds(whole.replace(tzinfo=timezone(timedelta(0)))).tzinfo is UTC


def test_times_parsed_by_the_models_are_in_utc_to_the_second() -> None:
    status = MPIJobStatus.model_validate(
        {"startTime": "2026-11-28T02:14:38.5Z", "completionTime": "2026-11-28T11:14:38+09:00"}
    )
    assert status.start_time == datetime(2026, 11, 28, 2, 14, 38, tzinfo=UTC)
    assert status.start_time.tzinfo is UTC
    assert status.completion_time == datetime(2026, 11, 28, 2, 14, 38, tzinfo=UTC)
    assert status.to_body() == {
        "startTime": "2026-11-28T02:14:38Z",
        "completionTime": "2026-11-28T02:14:38Z",
    }

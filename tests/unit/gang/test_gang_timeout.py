"""Admission deadlines from schedulingPolicy.scheduleTimeoutSeconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpijob.api import MPIJob
from mpijob.gang import timeout
from support.gang_jobs import job

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _stored(policy: dict[str, object] | None) -> MPIJob:
    mpi_job = job(policy=policy, workers=2)
    mpi_job.metadata.creation_timestamp = T0
    return mpi_job


def test_deadline_is_creation_plus_the_timeout() -> None:
    mpi_job = _stored({"scheduleTimeoutSeconds": 90})
    assert timeout.admission_deadline(mpi_job) == T0 + timedelta(seconds=90)
    assert not timeout.timed_out(mpi_job, T0 + timedelta(seconds=89))
    assert timeout.timed_out(mpi_job, T0 + timedelta(seconds=90))


@pytest.mark.parametrize(
    "policy", [None, {}, {"scheduleTimeoutSeconds": 0}, {"scheduleTimeoutSeconds": -5}]
)
def test_no_positive_timeout_means_no_deadline(policy: dict[str, object] | None) -> None:
    mpi_job = _stored(policy)
    assert timeout.admission_deadline(mpi_job) is None
    assert not timeout.timed_out(mpi_job, T0 + timedelta(days=365))


def test_a_job_not_yet_stored_has_no_deadline() -> None:
    assert timeout.admission_deadline(job(policy={"scheduleTimeoutSeconds": 5}, workers=1)) is None

"""The waiting condition of a job Kueue admitted says so; other decisions pass unchanged."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob import keys
from mpijob.gang import kueue
from mpijob.gang.queue import Admit, TimedOut, Wait, WaitingJob
from support import jobs

pytestmark = pytest.mark.unit

WAITING = WaitingJob("ns", "j", "uid-1", datetime(2026, 1, 1, tzinfo=UTC))
NO_FIT = "needs 4 GPUs on one opted-in node; most free on one node: 0"


def job(queue: str | None = "gpus", *, suspend: bool = False) -> Any:
    labels = {keys.KUEUE_QUEUE_LABEL: queue} if queue is not None else {}
    return jobs.parsed(
        jobs.body(
            "j",
            "ns",
            uid="",
            launcher={"spec": {"containers": [{"name": "l"}]}},
            metadata={"labels": labels},
            runPolicy={"suspend": suspend},
        )
    )


def test_a_job_kueue_admitted_waits_saying_kueue_admitted_it() -> None:
    got = kueue.explain(job("gpus"), Wait(WAITING, NO_FIT))
    assert isinstance(got, Wait)
    assert got.message == f"admitted by Kueue (LocalQueue gpus), not placed yet: {NO_FIT}"


@pytest.mark.parametrize(
    "queued",
    [job(None), job(""), job("gpus", suspend=True)],
    ids=["no-label", "empty", "suspended"],
)
def test_a_job_kueue_has_not_admitted_keeps_the_message(queued: Any) -> None:
    assert kueue.explain(queued, Wait(WAITING, NO_FIT)) == Wait(WAITING, NO_FIT)


@pytest.mark.parametrize(
    "decision",
    [Admit(WAITING, object()), TimedOut(WAITING, "late"), Wait(WAITING, "refused", refused=True)],
    ids=["admit", "timeout", "refused"],
)
def test_other_decisions_pass_unchanged(decision: Any) -> None:
    assert kueue.explain(job("gpus"), decision) is decision

"""The Events that matter, read back from the status their transitions wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpijob import keys
from mpijob.desired import events
from mpijob.desired import status as rules
from mpijob.gang import outcome, queue
from support.desired_jobs import make_job, pod

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def test_each_transition_s_event_is_implied_by_the_status_it_wrote() -> None:
    """Created, Running, then Succeeded: every Event a sync posted for a transition is one the
    written status implies, with the same type, reason and message."""
    job = make_job(name="test", namespace="default", workers=1)
    launcher = {"metadata": {"name": "test-launcher", "uid": "l"}, "status": {}}
    running = [pod("test-launcher-x", "Running", owner_uid="l")]
    result = rules.next_status(job, rules.Observed(), T0)
    posted = result.every_event()
    job.status = result.status
    seen = rules.Observed(launcher_job=launcher, pods=[*running, pod("test-worker-0", "Running")])
    result = rules.next_status(job, seen, T0 + timedelta(seconds=5))
    posted += result.every_event()
    job.status = result.status
    implied_running = {i.event for i in events.implied_by(job)}
    assert set(posted) <= implied_running
    done = {
        **launcher,
        "status": {
            "conditions": [{"type": "Complete", "status": "True"}],
            "completionTime": "2024-05-01T10:01:00Z",
        },
    }
    result = rules.next_status(job, rules.Observed(launcher_job=done), T0 + timedelta(minutes=1))
    posted += result.every_event()
    job.status = result.status
    implied = events.implied_by(job)
    assert [i.event.reason for i in implied] == ["MPIJobCreated", "MPIJobSucceeded"]
    assert {i.event for i in implied} <= set(posted)
    assert [i.since for i in implied] == [T0, T0 + timedelta(minutes=1)]


def test_admission_events_are_implied_and_the_waiting_message_is_not() -> None:
    job = make_job(name="test", namespace="default", workers=1)
    job.metadata.creation_timestamp = T0
    waiting = queue.waiting_job(job, priority_values={})
    for decision, expected in [
        (queue.Wait(waiting, "needs 8 GPUs"), []),
        (queue.Wait(waiting, "refused: too large", refused=True), [keys.REASON_DECISION_REFUSED]),
    ]:
        result = rules.next_status(
            job, rules.Observed(), T0, admission=outcome.outcome(decision, now=T0)
        )
        job.status = result.status
        admission = [i.event for i in events.implied_by(job) if i.event.reason != "MPIJobCreated"]
        assert [e.reason for e in admission] == expected
        assert set(admission) <= set(result.events)

"""Conditions and Events of admission decisions, applied with upstream's condition rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpijob.api import MPIJobStatus
from mpijob.desired import conditions
from mpijob.desired.events import Event
from mpijob.gang.outcome import ConditionChange, outcome
from mpijob.gang.queue import Admit, TimedOut, Wait, WaitingJob

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = WaitingJob("default", "pi", "uid-1", T0)


def test_waiting_sets_gang_admitted_false_with_the_missing_resources_and_no_event() -> None:
    message = "needs 4 GPUs on one opted-in node; largest free NVLink ring: 2"
    got = outcome(Wait(JOB, message), now=T0)
    assert got.conditions == [ConditionChange("GangAdmitted", "False", "GangWaiting", message)]
    assert got.event is None
    assert not got.failed


def test_admission_sets_gang_admitted_true_and_posts_a_normal_event() -> None:
    got = outcome(Admit(JOB, object()), now=T0 + timedelta(seconds=42))
    message = "MPIJob default/pi is admitted: the whole gang fits (waited 42s)."
    assert got.conditions == [ConditionChange("GangAdmitted", "True", "GangAdmitted", message)]
    assert got.event == Event("Normal", "GangAdmitted", message)
    assert not got.failed


def test_timeout_fails_the_job_with_our_reason_and_a_warning() -> None:
    got = outcome(TimedOut(JOB, "not admitted in time"), now=T0)
    assert got.conditions == [
        ConditionChange("GangAdmitted", "False", "GangScheduleTimeout", "not admitted in time"),
        ConditionChange("Failed", "True", "GangScheduleTimeout", "not admitted in time"),
    ]
    assert got.event == Event("Warning", "GangScheduleTimeout", "not admitted in time")
    assert got.failed


def _apply(status: MPIJobStatus, change: ConditionChange) -> bool:
    return conditions.set_condition(
        status, change.type, change.status, change.reason, change.message, T0
    )


def test_the_waiting_condition_follows_upstreams_rules_and_leaves_upstreams_types_alone() -> None:
    """Applied with set_condition: a new message with the same reason is not rewritten, and
    upstream's Created condition is untouched."""
    status = MPIJobStatus()
    conditions.set_condition(status, "Created", "True", "MPIJobCreated", "created", T0)
    for change in outcome(Wait(JOB, "needs 4 GPUs"), now=T0).conditions:
        assert _apply(status, change)
    for change in outcome(Wait(JOB, "needs 3 GPUs"), now=T0).conditions:
        assert not _apply(status, change)
    for change in outcome(TimedOut(JOB, "too late"), now=T0).conditions:
        assert _apply(status, change)

    assert [(c.type, c.status, c.reason, c.message) for c in status.conditions] == [
        ("Created", "True", "MPIJobCreated", "created"),
        ("GangAdmitted", "False", "GangScheduleTimeout", "too late"),
        ("Failed", "True", "GangScheduleTimeout", "too late"),
    ]


def test_a_job_over_its_namespaces_gpu_quota_names_it_with_a_warning() -> None:
    message = "ResourceQuota gpus in namespace default allows requests.nvidia.com/gpu: 0; ..."
    got = outcome(Wait(JOB, message, over_quota=True), now=T0)
    assert got.conditions == [ConditionChange("GangAdmitted", "False", "GPUQuotaExceeded", message)]
    assert got.event == Event("Warning", "GPUQuotaExceeded", message)
    assert not got.failed

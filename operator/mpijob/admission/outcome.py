"""What an admission decision means for the job's status and Events, as data.

Our condition sits beside upstream's, whose types and reasons are untouched:

* ``GangAdmitted=False``, reason ``GangWaiting``: the whole job does not fit yet; the message says
  what is missing (the placement's reason, e.g. "needs 4 GPUs on one opted-in node; largest free
  NVLink ring: 2") or which job it is queued behind.
* ``GangAdmitted=True``, reason ``GangAdmitted``: the job was admitted and its pods are created.
  A Normal Event ``GangAdmitted`` says so once.
* On timeout, ``GangAdmitted=False`` and ``Failed=True``, both with reason
  ``GangScheduleTimeout``, and a Warning Event of that reason. The job is then finished like any
  failed job: ``completionTime`` is set and it holds nothing (it never had workers).

Used by the handler after :func:`mpijob.admission.queue.decide`: it applies each
:class:`ConditionChange` with :func:`mpijob.desired.conditions.set_condition` (upstream's rules)
and posts the Event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, assert_never

from mpijob import keys
from mpijob.admission.queue import Admit, Decision, TimedOut, Wait
from mpijob.api import MPIJobStatus
from mpijob.api.models import utc_seconds
from mpijob.desired import conditions, events
from mpijob.desired.events import Event


@dataclass(frozen=True)
class ConditionChange:
    """One condition to set: the arguments of upstream's ``setCondition``."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """The status changes and Event one decision calls for."""

    conditions: list[ConditionChange] = field(default_factory=list)
    """Conditions to set, in order."""
    event: Event | None = None
    """An Event to post on the MPIJob, if any."""
    failed: bool = False
    """The job is now Failed: set ``completionTime``, count it in
    ``mpi_operator_jobs_failed_total`` and release what it holds."""


def outcome(decision: Decision[Any], *, now: datetime) -> Outcome:
    """The conditions and Event for one admission decision."""
    job = decision.job
    if isinstance(decision, Admit):
        waited = max(int((now - job.created).total_seconds()), 0)
        message = f"MPIJob {job.key} is admitted: the whole gang fits (waited {waited}s)."
        return Outcome(
            [ConditionChange(keys.COND_GANG_ADMITTED, "True", keys.REASON_GANG_ADMITTED, message)],
            events.normal(keys.REASON_GANG_ADMITTED, message),
        )
    if isinstance(decision, Wait):
        return Outcome(
            [
                ConditionChange(
                    keys.COND_GANG_ADMITTED, "False", keys.REASON_GANG_WAITING, decision.message
                )
            ]
        )
    if isinstance(decision, TimedOut):
        reason, message = keys.REASON_GANG_SCHEDULE_TIMEOUT, decision.message
        return Outcome(
            [
                ConditionChange(keys.COND_GANG_ADMITTED, "False", reason, message),
                ConditionChange(keys.COND_FAILED, "True", reason, message),
            ],
            events.warning(reason, message),
            failed=True,
        )
    assert_never(decision)


def apply(status: MPIJobStatus, result: Outcome, now: datetime) -> bool:
    """Set the outcome's conditions on ``status`` in place; True when anything changed.

    Upstream's rule keeps the message of a condition whose status and reason are unchanged;
    a waiting job's message is the news (what it waits for), so it is refreshed.
    """
    changed = False
    for change in result.conditions:
        if conditions.set_condition(
            status, change.type, change.status, change.reason, change.message, now
        ):
            changed = True
            continue
        current = status.condition(change.type)
        if (
            change.reason == keys.REASON_GANG_WAITING
            and current is not None
            and current.message != change.message
        ):
            current.message = change.message
            current.last_update_time = utc_seconds(now)
            changed = True
    return changed

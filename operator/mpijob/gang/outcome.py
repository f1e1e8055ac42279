"""What an admission decision means for the job's status and Events, as data.

Our condition sits beside upstream's, whose types and reasons are untouched:

* ``GangAdmitted=False``, reason ``GangWaiting``: the whole job does not fit yet; the message says
  what is missing (the placement's reason, e.g. "needs 4 GPUs on one opted-in node; largest free
  NVLink ring: 2") or which job it is queued behind.
* ``GangAdmitted=True``, reason ``GangAdmitted``: the job was admitted and its pods are created.
  A Normal Event ``GangAdmitted`` says so once.
* ``GangAdmitted=False``, reason ``PlacementNotRecorded``, and a Warning Event: the job fits but
  the API server refused its decision (the message quotes it, naming the field and limit).
* ``GangAdmitted=False``, reason ``GPUQuotaExceeded``, and a Warning Event: the job's GPUs would
  take its namespace past a ResourceQuota (the message names the quota, its limit, what is in
  use and what the job needs); see :mod:`mpijob.gang.quota`.
* ``GangAdmitted=False``, reason ``PlacementWorkersRefused`` or ``PlacementWorkersUnschedulable``,
  and a Warning Event: the reconciler released the job's placement because its workers could
  not be created or scheduled; the job stays out of the line ``--placement-release-seconds``
  (:func:`mpijob.gang.timeout.held_off_until`, from its PlacementDecision, which the release
  keeps as the record of the hold-off: never from this condition, which its tenant may write).
* ``GangAdmitted=False``, reason ``NoNodeFitsWorker``, and a Warning Event: no node the worker
  template may go to could hold one worker even empty, in a resource it advertises (the message
  names it); the job holds nothing and blocks no one (:mod:`mpijob.gang.fit`).
* On timeout, ``GangAdmitted=False`` and ``Failed=True``, both with reason
  ``GangScheduleTimeout``, and a Warning Event of that reason. The job is then finished like any
  failed job: ``completionTime`` is set and it holds nothing (it never had workers).

The handler passes the :class:`~mpijob.desired.status.AdmissionOutcome` of a job's latest
decision to :func:`mpijob.desired.status.next_status`, which applies it with upstream's
condition rules.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, assert_never

from mpijob import keys
from mpijob.desired import events
from mpijob.desired.status import AdmissionOutcome, ConditionChange
from mpijob.gang.queue import Admit, Decision, TimedOut, Wait


def outcome(decision: Decision[Any], *, now: datetime) -> AdmissionOutcome:
    """The conditions and Event for one admission decision."""
    job = decision.job
    if isinstance(decision, Admit):
        waited = max(int((now - job.created).total_seconds()), 0)
        message = f"MPIJob {job.key} is admitted: the whole gang fits (waited {waited}s)."
        return AdmissionOutcome(
            [ConditionChange(keys.COND_GANG_ADMITTED, "True", keys.REASON_GANG_ADMITTED, message)],
            events.normal(keys.REASON_GANG_ADMITTED, message),
        )
    if isinstance(decision, Wait) and decision.refused:
        reason = keys.REASON_DECISION_REFUSED
        return AdmissionOutcome(
            [ConditionChange(keys.COND_GANG_ADMITTED, "False", reason, decision.message)],
            events.warning(reason, decision.message),
        )
    if isinstance(decision, Wait) and decision.over_quota:
        reason = keys.REASON_GPU_QUOTA_EXCEEDED
        return AdmissionOutcome(
            [ConditionChange(keys.COND_GANG_ADMITTED, "False", reason, decision.message)],
            events.warning(reason, decision.message),
        )
    if isinstance(decision, Wait) and decision.unfit:
        reason = keys.REASON_NO_NODE_FITS
        return AdmissionOutcome(
            [ConditionChange(keys.COND_GANG_ADMITTED, "False", reason, decision.message)],
            events.warning(reason, decision.message),
        )
    if isinstance(decision, Wait):
        return AdmissionOutcome(
            [
                ConditionChange(
                    keys.COND_GANG_ADMITTED, "False", keys.REASON_GANG_WAITING, decision.message
                )
            ]
        )
    if isinstance(decision, TimedOut):
        reason, message = keys.REASON_GANG_SCHEDULE_TIMEOUT, decision.message
        return AdmissionOutcome(
            [
                ConditionChange(keys.COND_GANG_ADMITTED, "False", reason, message),
                ConditionChange(keys.COND_FAILED, "True", reason, message),
            ],
            events.warning(reason, message),
            failed=True,
        )
    assert_never(decision)

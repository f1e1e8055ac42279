"""Where a job stands with Kubernetes' own gang scheduling (``--gang-scheduling=workload-api``).

kube-scheduler binds the pods of a PodGroup all together once ``gang.minCount`` of them fit, and
says why not in the group's ``PodGroupInitiallyScheduled`` condition. The job shows it as the
other backends' gangs show theirs, beside upstream's conditions:

* ``GangScheduled=False``, reason ``GangWaiting``: fewer than the quorum of its pods are bound;
  the message counts them and quotes the scheduler's reason (cut to
  :data:`SCHEDULER_MESSAGE_LIMIT` characters).
* ``GangScheduled=True``, reason ``GangScheduled``, and a Normal Event once: the quorum is bound.
  It stays True for the rest of the job's life (its pods finish and go; the gang was formed).
* ``GangScheduled=False`` and ``Failed=True``, reason ``GangScheduleTimeout``, and a Warning
  Event: still not bound ``schedulingPolicy.scheduleTimeoutSeconds`` after the job's creation,
  the deadline our own admission keeps (:func:`mpijob.gang.timeout.admission_deadline`); the
  Workload API has no such field. The reconciler then removes the job's pods and PodGroup
  (:func:`mpijob.desired.sync.plan`), whatever its ``cleanPodPolicy``: a pod left pending would
  be bound later and run without its gang.

What it believes: which pods are bound (``spec.nodeName``, the scheduler's write, on pods the
job controls) and the PodGroup's condition (kube-scheduler's write; the operator only quotes
it). The job's own ``GangScheduled`` condition is read only to keep a formed gang's True: a
tenant who writes it False gets it back at the next sync, and one who writes it True only
hides their own job's wait.

Pure: ``now`` is passed in; :mod:`mpijob.handlers.reconcile` reads and applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from mpijob import keys
from mpijob.api import JSON
from mpijob.api.models import MPIJob
from mpijob.desired import events, podgroup
from mpijob.desired.status import AdmissionOutcome, ConditionChange
from mpijob.gang.timeout import admission_deadline

#: The most of the scheduler's message a condition quotes: it lists every failed placement.
SCHEDULER_MESSAGE_LIMIT = 400


@dataclass(frozen=True)
class GangState:
    """The job's gang as this sync sees it."""

    outcome: AdmissionOutcome | None
    """The conditions and Event to apply; None when there is nothing to say."""
    requeue_after: float | None = None
    """Seconds until the deadline of a gang still waiting: the sync that fails it."""


def gang_state(
    job: MPIJob, pod_group: JSON | None, pods: Sequence[JSON], now: datetime
) -> GangState:
    """The state of a running job's native gang; ``pods`` are the pods the job controls."""
    status = job.status
    if status.finished or job.spec.suspended:
        return GangState(None)
    current = status.condition(keys.COND_GANG_SCHEDULED)
    if current is not None and current.status == "True":
        return GangState(None)  # formed; it stays so
    quorum = podgroup.min_member(job)
    bound = sum(1 for pod in pods if (pod.get("spec") or {}).get("nodeName"))
    if quorum > 0 and bound >= quorum:
        message = f"MPIJob {job.key}: kube-scheduler bound its gang, {bound} pods together."
        return GangState(
            AdmissionOutcome(
                [
                    ConditionChange(
                        keys.COND_GANG_SCHEDULED, "True", keys.REASON_GANG_SCHEDULED, message
                    )
                ],
                events.normal(keys.REASON_GANG_SCHEDULED, message),
            )
        )
    deadline = admission_deadline(job)
    if deadline is not None and now >= deadline:
        seconds = job.spec.run_policy.scheduling_policy.schedule_timeout_seconds  # type: ignore[union-attr]
        message = (
            f"MPIJob {job.key}'s gang was not bound within scheduleTimeoutSeconds={seconds} "
            f"({bound} of {quorum} pods bound){_scheduler_says(pod_group)}"
        )
        reason = keys.REASON_GANG_SCHEDULE_TIMEOUT
        return GangState(
            AdmissionOutcome(
                [
                    ConditionChange(keys.COND_GANG_SCHEDULED, "False", reason, message),
                    ConditionChange(keys.COND_FAILED, "True", reason, message),
                ],
                events.warning(reason, message),
                failed=True,
            )
        )
    message = (
        f"{bound} of the gang's {quorum} pods bound; waiting for kube-scheduler to bind them "
        f"together{_scheduler_says(pod_group)}"
    )
    waiting = ConditionChange(keys.COND_GANG_SCHEDULED, "False", keys.REASON_GANG_WAITING, message)
    left = (deadline - now).total_seconds() if deadline is not None else None
    return GangState(AdmissionOutcome([waiting]), left)


def _scheduler_says(pod_group: JSON | None) -> str:
    """'; the scheduler: <why>' from the PodGroup's condition, or nothing when it says none."""
    for condition in ((pod_group or {}).get("status") or {}).get("conditions") or []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == keys.POD_GROUP_SCHEDULED_CONDITION
            and condition.get("status") == "False"
        ):
            text = " ".join(str(condition.get("message") or condition.get("reason") or "").split())
            if len(text) > SCHEDULER_MESSAGE_LIMIT:
                text = text[: SCHEDULER_MESSAGE_LIMIT - 1] + "…"
            return f"; the scheduler: {text}" if text else ""
    return ""

"""Where a job stands with Kubernetes' own gang scheduling (``--gang-scheduling=workload-api``).

kube-scheduler binds the pods of a PodGroup all together once ``gang.minCount`` of them fit, and
says why not in the group's ``PodGroupInitiallyScheduled`` condition. The job shows it as the
other backends' gangs show theirs, beside upstream's conditions:

* ``GangScheduled=False``, reason ``GangWaiting``: fewer than the quorum of its pods are bound;
  the message counts them and quotes the scheduler's reason (cut to
  :data:`SCHEDULER_MESSAGE_LIMIT` bytes, as upstream cuts Event messages).
* ``GangScheduled=True``, reason ``GangScheduled``, and a Normal Event once: the quorum is bound,
  or the scheduler's condition says the group was scheduled. It stays True for the rest of the
  job's run (its pods finish and go; the gang was formed).
* ``GangScheduled=False`` and ``Failed=True``, reason ``GangScheduleTimeout``, and a Warning
  Event: still not bound ``schedulingPolicy.scheduleTimeoutSeconds`` after the job's creation,
  the deadline our own admission keeps (:func:`mpijob.gang.timeout.admission_deadline`); the
  Workload API has no such field. While such a gang has not formed (:func:`expired`), the
  reconciler removes the job's pods and PodGroup (:func:`mpijob.desired.sync.plan`), whatever its
  ``cleanPodPolicy``: a pod left pending would be bound later and run without its gang.

What it believes: which pods are bound (``spec.nodeName``, the scheduler's write, on the pods
the job and its launcher Job control: a tenant's look-alike pod counts for nothing) and the
PodGroup's condition (``podgroups/status``, which kube-scheduler writes and Kubernetes' ``edit``
role does not grant). Never the job's own ``GangScheduled``: its status is its tenant's to
write, and whatever is written there is set back to what the scheduler did at the next sync.

Pure: ``now`` is passed in; :mod:`mpijob.handlers.reconcile` reads and applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from mpijob import keys
from mpijob.api import JSON
from mpijob.api.errors import truncate_message
from mpijob.api.fabric import fabric_level
from mpijob.api.models import MPIJob
from mpijob.desired import events, podgroup
from mpijob.desired.status import AdmissionOutcome, ConditionChange
from mpijob.gang.timeout import admission_deadline
from mpijob.placement.fabric import NODE, Fabric
from mpijob.placement.fabric_labels import HOSTNAME_LABEL

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
    if job.status.finished or job.spec.suspended:
        return GangState(None)
    quorum = podgroup.min_member(job)
    bound = _bound(pods)
    if formed(job, pod_group, pods):
        message = f"MPIJob {job.key}: kube-scheduler scheduled its gang of {quorum} pods together."
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


def formed(job: MPIJob, pod_group: JSON | None, pods: Sequence[JSON]) -> bool:
    """Whether the gang was bound: the quorum of ``pods`` (the job's controlled pods) bound, or
    the PodGroup's condition saying kube-scheduler scheduled it."""
    quorum = podgroup.min_member(job)
    return (quorum > 0 and _bound(pods) >= quorum) or _scheduled(pod_group)


def expired(job: MPIJob, pod_group: JSON | None, pods: Sequence[JSON], now: datetime) -> bool:
    """Whether the job's gang is past its ``scheduleTimeoutSeconds`` and never formed, while its
    PodGroup (not being deleted) still gathers its pods: then its pods and PodGroup go
    (:func:`mpijob.desired.sync.plan`). From the job's spec and creation, the scheduler's
    bindings and the PodGroup's condition; never from the job's status, which its tenant may
    write."""
    deadline = admission_deadline(job)
    live = pod_group is not None and not (pod_group.get("metadata") or {}).get("deletionTimestamp")
    return live and deadline is not None and now >= deadline and not formed(job, pod_group, pods)


def _bound(pods: Sequence[JSON]) -> int:
    return sum(1 for pod in pods if (pod.get("spec") or {}).get("nodeName"))


def topology_key(job: MPIJob, fabric: Fabric | None) -> str:
    """The node label kube-scheduler's topology-aware workload scheduling keeps a job without
    our placement inside (the PodGroup's ``schedulingConstraints.topology``): the label of the
    level ``mpijob.io/fabric-required-level`` names in the operator's ``--fabric``. Empty for a
    job that names none, or only a preferred level (the constraint is a requirement), and
    without a fabric (the names mean nothing then)."""
    if fabric is None:
        return ""
    level, errors = fabric_level(job.metadata.annotations or {}, fabric.level_names)
    if level is None or errors or not level.required:
        return ""
    if level.level == NODE:
        return HOSTNAME_LABEL  # the node level: every node its own domain
    return next(lv.label for lv in fabric.levels if lv.name == level.level)


def _condition(pod_group: JSON | None) -> JSON:
    """The PodGroup's ``PodGroupInitiallyScheduled`` condition; empty when it has none."""
    for condition in ((pod_group or {}).get("status") or {}).get("conditions") or []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == keys.POD_GROUP_SCHEDULED_CONDITION
        ):
            return condition
    return {}


def _scheduled(pod_group: JSON | None) -> bool:
    return _condition(pod_group).get("status") == "True"


def _scheduler_says(pod_group: JSON | None) -> str:
    """'; the scheduler: <why>' from the PodGroup's condition, or nothing when it says none."""
    condition = _condition(pod_group)
    if condition.get("status") != "False":
        return ""
    text = " ".join(str(condition.get("message") or condition.get("reason") or "").split())
    text = truncate_message(text, SCHEDULER_MESSAGE_LIMIT)
    return f"; the scheduler: {text}" if text else ""

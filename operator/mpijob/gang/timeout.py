"""The admission deadline of a job waiting for our own gang admission.

``schedulingPolicy.scheduleTimeoutSeconds`` goes to scheduler-plugins' PodGroup as upstream
passes it. With our own admission it bounds the wait instead: a job still not admitted that
many seconds after its creation fails with reason ``GangScheduleTimeout``. Unset, 0 or negative
means no deadline, as 0 means "the scheduler's default" to scheduler-plugins, not "fail at once".

Pure: ``now`` is passed in. Used by :mod:`mpijob.gang.queue` and by the handler, which
requeues a waiting job for its deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mpijob import keys
from mpijob.api.models import MPIJob

#: ``GangAdmitted=False`` reasons of a job whose placement was released because its workers
#: could not be created or scheduled.
RELEASED = frozenset({keys.REASON_WORKERS_REFUSED, keys.REASON_WORKERS_UNSCHEDULABLE})


def admission_deadline(job: MPIJob) -> datetime | None:
    """When a waiting job times out, or None when it may wait forever."""
    policy = job.spec.run_policy.scheduling_policy
    created = job.metadata.creation_timestamp
    seconds = policy.schedule_timeout_seconds if policy is not None else None
    if seconds is None or seconds <= 0 or created is None:
        return None
    return created + timedelta(seconds=seconds)


def timed_out(job: MPIJob, now: datetime) -> bool:
    """Whether a job that is still waiting at ``now`` has passed its deadline."""
    deadline = admission_deadline(job)
    return deadline is not None and now >= deadline


def held_off_until(job: MPIJob, seconds: float) -> datetime | None:
    """Until when a job whose placement was released (its workers refused or unschedulable)
    stays out of the line; None when it is not held off. Read from its ``GangAdmitted``
    condition, which only the operator writes (the status subresource), so a restarted
    operator holds it off as long."""
    condition = job.status.condition(keys.COND_GANG_ADMITTED)
    if condition is None or condition.status != "False" or condition.reason not in RELEASED:
        return None
    since = condition.last_update_time or condition.last_transition_time
    return since + timedelta(seconds=seconds) if since is not None else None

"""The admission deadline of a job waiting for our own gang admission.

``schedulingPolicy.scheduleTimeoutSeconds`` goes to scheduler-plugins' PodGroup as upstream
passes it. With our own admission it bounds the wait instead: a job still not admitted that
many seconds after its creation fails with reason ``GangScheduleTimeout``. Unset, 0 or negative
means no deadline, as 0 means "the scheduler's default" to scheduler-plugins, not "fail at once".

Pure: ``now`` is passed in. Used by :mod:`mpijob.admission.queue` and by the handler, which
requeues a waiting job for its deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mpijob.api.models import MPIJob


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

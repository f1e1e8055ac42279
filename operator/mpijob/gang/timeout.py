"""The admission deadline of a job waiting for our own gang admission.

``schedulingPolicy.scheduleTimeoutSeconds`` goes to scheduler-plugins' PodGroup as upstream
passes it. With our own admission it bounds the wait instead: a job still not admitted that
many seconds after its creation fails with reason ``GangScheduleTimeout``. Unset, 0 or negative
means no deadline, as 0 means "the scheduler's default" to scheduler-plugins, not "fail at once".

Also the hold-off of a job whose placement was released (:func:`held_off_until`), read from
its PlacementDecision.

Pure: ``now`` is passed in. Used by :mod:`mpijob.gang.queue` and by the handler, which
requeues a waiting job for its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from mpijob import keys
from mpijob.api.models import MPIJob

#: ``GangAdmitted=False`` reasons of a job whose placement was released because its workers
#: could not be created or scheduled.
RELEASED = frozenset({keys.REASON_WORKERS_REFUSED, keys.REASON_WORKERS_UNSCHEDULABLE})


@dataclass(frozen=True)
class Released:
    """Why and when a job's placement was given back, as its PlacementDecision records it
    (:func:`mpijob.gang.topology.released_object`): what holds the job out of the line, in an
    object only the operator writes (never the job's status, which its tenant may write)."""

    reason: str
    at: datetime


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


def held_off_until(
    job: MPIJob, released: Released | None, uid: str, seconds: float
) -> datetime | None:
    """Until when a job whose placement was released (its workers refused or unschedulable)
    stays out of the line; None when it is not held off.

    Read from the job's PlacementDecision as the release left it (``released``, recorded for
    the job of ``uid``), which only the operator writes, so a restarted operator holds the job
    off as long. Never from the job's ``GangAdmitted`` condition: the status is the tenant's to
    write (``mpijobs/status``), and clearing it must not put the job back in the line."""
    if released is None or uid != job.metadata.uid or released.reason not in RELEASED:
        return None
    return released.at + timedelta(seconds=seconds)

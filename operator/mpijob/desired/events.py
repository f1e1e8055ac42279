"""Events that pure code asks its caller to emit, as data.

Builders and status rules never talk to the API; they return :class:`Event` values that the
handlers post with source component ``mpi-job-controller`` (on the MPIJob; GPU-share Events on
the pod). :func:`implied_by` reads back from a job's status the Events that matter which its
transitions posted, for the recorder to post again those the API lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from mpijob import keys
from mpijob.api import MPIJob

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """One Kubernetes Event to record (on an MPIJob, or on a pod waiting for a GPU share)."""

    type: EventType
    """Normal or Warning."""
    reason: str
    """Upstream's reason string, e.g. ``MPIJobCreated``."""
    message: str
    """Upstream's message text."""


def normal(reason: str, message: str) -> Event:
    """A Normal event."""
    return Event("Normal", reason, message)


def warning(reason: str, message: str) -> Event:
    """A Warning event."""
    return Event("Warning", reason, message)


@dataclass(frozen=True)
class Implied:
    """An Event the job's status says was posted, and since when it has been so."""

    event: Event
    since: datetime | None
    """The condition's ``lastTransitionTime``."""


#: ``GangAdmitted=False`` reasons whose Warning must reach the user (not the waiting message,
#: which is no Event).
_ADMISSION_WARNINGS = frozenset(
    {
        keys.REASON_DECISION_REFUSED,
        keys.REASON_NODE_LOST,
        keys.REASON_GPUS_TAKEN,
        keys.REASON_WORKERS_REFUSED,
        keys.REASON_WORKERS_UNSCHEDULABLE,
    }
)


def implied_by(job: MPIJob) -> list[Implied]:
    """The Events that matter which the job's status implies were posted: Created, Running,
    Succeeded or Failed, admitted or refused, placed anew, workers left running. Each is the
    Event the transition to that condition posted (same type, reason and message), so that an
    operator that restarted can post the ones the API does not have (lost to a kill between
    the status write and the post, or to an outage)."""
    status = job.status
    out = []
    for c in status.conditions:
        event: Event | None = None
        if c.status == "True" and c.type == keys.COND_CREATED:
            event = normal(keys.REASON_CREATED, c.message)
        elif c.status == "True" and c.type == keys.COND_RUNNING:
            event = normal(keys.REASON_RUNNING, f"MPIJob {job.key} is running")
        elif c.status == "True" and c.type == keys.COND_SUCCEEDED:
            event = normal(keys.REASON_SUCCEEDED, c.message)
        elif c.status == "True" and c.type == keys.COND_FAILED:
            event = warning(c.reason, c.message)
        elif c.status == "True" and c.type == keys.COND_WORKERS_LEFT_RUNNING:
            event = warning(keys.REASON_WORKERS_LEFT_RUNNING, c.message)
        elif c.type == keys.COND_GANG_ADMITTED and c.status == "True":
            event = normal(keys.REASON_GANG_ADMITTED, c.message)
        elif c.type == keys.COND_GANG_ADMITTED and c.reason in _ADMISSION_WARNINGS:
            event = warning(c.reason, c.message)
        if event is not None:
            out.append(Implied(event, c.last_transition_time))
    return out

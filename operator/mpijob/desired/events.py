"""Events that pure code asks its caller to emit, as data.

Builders and status rules never talk to the API; they return :class:`Event` values that the
handlers post with source component ``mpi-job-controller`` (on the MPIJob; GPU-share Events on
the pod).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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

"""Events that pure code asks its caller to emit, as data.

Builders and status rules never talk to the API; they return :class:`Event` values that the
handlers post on the MPIJob with source component ``mpi-job-controller``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """One Kubernetes Event to record on the MPIJob."""

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

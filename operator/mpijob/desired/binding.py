"""When a gang was fully bound: the figure behind the creation-to-bound histogram.

A pod is bound when the scheduler assigns it a node; the API server then records a
``PodScheduled=True`` condition whose ``lastTransitionTime`` is the binding time. A gang is fully
bound when every pod it should have exists and is bound, and the time it took is measured from
the MPIJob's creation, so it includes any wait for admission or for the gang scheduler.

Used by the handler, which observes the histogram once per job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from mpijob.api.models import parse_time


def bound_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod was bound to its node, or None while it is not (or the time is unknown)."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return parse_time(condition.get("lastTransitionTime"))
    return None


def seconds_to_bind(
    created: datetime, pods: Iterable[Mapping[str, Any]], expected: int
) -> float | None:
    """Seconds from the job's creation until the last of its ``expected`` pods was bound.

    None until ``expected`` pods exist and all of them are bound.
    """
    times = [bound_at(pod) for pod in pods]
    if len(times) < expected or not times:
        return None
    if any(time is None for time in times):
        return None
    last = max(time for time in times if time is not None)
    return max((last - created).total_seconds(), 0.0)

"""When a gang was fully bound, its workers all Ready, its launcher running: the figures
behind the creation-to-bound, creation-to-workers-Ready and creation-to-launcher-running
histograms.

A pod is bound when the scheduler assigns it a node; the API server then records a
``PodScheduled=True`` condition whose ``lastTransitionTime`` is the binding time. A gang is fully
bound when every pod it should have exists and is bound, and the time it took is measured from
the MPIJob's creation, so it includes any wait for admission or for the gang scheduler.

Workers are Ready when their ``Ready`` condition is True, at its ``lastTransitionTime``; the
launcher runs when a container of a launcher pod has started (``state.running.startedAt``, as
the kubelet writes it). Times come from the pods, not from the clock of the sync that saw them,
so an operator that restarted reports the same figures.

Used by the handler, which observes each histogram once per job.
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


def ready_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod last became Ready, or None while it is not."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return parse_time(condition.get("lastTransitionTime"))
    return None


def seconds_to_workers_ready(
    created: datetime, workers: Iterable[Mapping[str, Any]], expected: int
) -> float | None:
    """Seconds from the job's creation until the last of its ``expected`` workers was Ready;
    None until that many are Ready (and for a job with no workers)."""
    times = [ready_at(pod) for pod in workers]
    known = [t for t in times if t is not None]
    if expected <= 0 or len(known) < expected or len(known) != len(times):
        return None
    return max((max(known) - created).total_seconds(), 0.0)


def seconds_to_launcher_running(
    created: datetime, launcher_pods: Iterable[Mapping[str, Any]]
) -> float | None:
    """Seconds from the job's creation until a launcher pod's container first ran; None
    while none has."""
    starts = []
    for pod in launcher_pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            running = (container.get("state") or {}).get("running") or {}
            terminated = (container.get("state") or {}).get("terminated") or {}
            started = parse_time(running.get("startedAt") or terminated.get("startedAt"))
            if started is not None:
                starts.append(started)
    if not starts:
        return None
    return max((min(starts) - created).total_seconds(), 0.0)

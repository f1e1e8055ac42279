"""Readers of raw child objects (Pods, batch Jobs) as the status rules need them.

Children arrive as plain dicts from the API; these accessors tolerate missing fields so that
a half-written object never raises. Used by :mod:`mpijob.desired.status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from mpijob.api.models import utc_seconds


def name_of(obj: Mapping[str, Any]) -> str:
    """``metadata.name``, or an empty string."""
    return str((obj.get("metadata") or {}).get("name") or "")


def phase_of(pod: Mapping[str, Any]) -> str:
    """``status.phase`` of a pod, or an empty string."""
    return str((pod.get("status") or {}).get("phase") or "")


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def job_condition(launcher_job: Mapping[str, Any], condition_type: str) -> dict[str, Any] | None:
    """The batch Job's condition of that type when its status is True, else None."""
    for cond in (launcher_job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == condition_type and cond.get("status") == "True":
            return dict(cond)
    return None


def controlled_by(
    pods: Sequence[Mapping[str, Any]], owner: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The pods whose controller is ``owner``; all of them when the owner has no UID yet."""
    uid = (owner.get("metadata") or {}).get("uid")
    if not uid:
        return list(pods)
    return [
        pod
        for pod in pods
        if any(
            ref.get("controller") and ref.get("uid") == uid
            for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
        )
    ]


def parse_time(value: object) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339 string or datetime) in UTC, or None."""
    if isinstance(value, datetime):
        return utc_seconds(value)
    if isinstance(value, str) and value:
        try:
            return utc_seconds(datetime.fromisoformat(value))
        except ValueError:
            return None
    return None

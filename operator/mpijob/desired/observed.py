"""What the caches saw of a job's children, and readers of raw child objects.

:class:`Observed` is the input of one sync: every child the job controls, as the watches (and
the creations not yet seen on them) show it. Children arrive as plain dicts from the API; the
accessors here tolerate missing fields, so a half-written object never raises. Read by
:mod:`mpijob.desired.sync` and :mod:`mpijob.desired.status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mpijob import keys
from mpijob.api import JSON, MPIJob
from mpijob.desired import names


@dataclass(frozen=True)
class Observed:
    """The job's children as the caches see them; only objects the job controls.

    ``None`` means the child does not exist (or is not controlled by the job), so a sync
    creates it: a child deleted by hand comes back on the next sync.
    """

    launcher_job: JSON | None = None
    """The launcher batch/v1 Job."""
    pods: Sequence[JSON] = ()
    """Pods labelled with the job's name: workers and launcher pods."""
    pod_group: JSON | None = None
    """The job's PodGroup, in gang mode."""
    service: JSON | None = None
    """The headless Service (its selector and ``publishNotReadyAddresses`` at least)."""
    config_map: JSON | None = None
    """The hostfile ConfigMap, with its data."""
    secret: JSON | None = None
    """The SSH Secret: its metadata and the names of its keys (never the key material)."""
    claims: Mapping[str, JSON] = field(default_factory=dict)
    """The workers' ResourceClaims (DRA binding), by name."""


def name_of(obj: Mapping[str, Any]) -> str:
    """``metadata.name``, or an empty string."""
    return str((obj.get("metadata") or {}).get("name") or "")


def phase_of(pod: Mapping[str, Any]) -> str:
    """``status.phase`` of a pod, or an empty string."""
    return str((pod.get("status") or {}).get("phase") or "")


def role_of(pod: Mapping[str, Any]) -> str:
    """The pod's ``training.kubeflow.org/job-role`` label: worker or launcher."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(keys.LABEL_JOB_ROLE, ""))


def workers_of(job: MPIJob, pods: Sequence[JSON]) -> list[JSON]:
    """The job's worker pods among ``pods``: the role label, and controlled by the job."""
    uid = job.metadata.uid
    return [p for p in pods if role_of(p) == keys.ROLE_WORKER and names.is_controlled_by(p, uid)]


def launcher_pods_of(pods: Sequence[JSON]) -> list[JSON]:
    """Pods with the launcher role label (the launcher Job's, and any leftovers)."""
    return [p for p in pods if role_of(p) == keys.ROLE_LAUNCHER]


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
    return [pod for pod in pods if names.is_controlled_by(pod, uid)]

"""What ``mpijob get`` and ``mpijob list`` show of a job and its pods, as plain data.

Pure: MPIJob and Pod bodies (dicts, as the API returns them) and ``now`` in, frozen views out;
:mod:`mpijob.console.render` turns them into tables. The status words are arena's (PENDING,
RUNNING, SUCCEEDED, FAILED) plus upstream's SUSPENDED and RESTARTING.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from mpijob import keys

JSON = Mapping[str, Any]

TRAINER: Final = "MPIJOB"
NONE: Final = "N/A"

#: Condition types in the order they decide the status: a finished job stays finished even
#: though its Running condition may still read True for a moment.
_STATUS_BY_CONDITION: Final = (
    (keys.COND_SUCCEEDED, "SUCCEEDED"),
    (keys.COND_FAILED, "FAILED"),
    (keys.COND_SUSPENDED, "SUSPENDED"),
    (keys.COND_RESTARTING, "RESTARTING"),
    (keys.COND_RUNNING, "RUNNING"),
)
FINAL_STATUSES: Final = frozenset({"SUCCEEDED", "FAILED"})


@dataclass(frozen=True)
class Instance:
    """One pod of a job: a row of the instance table."""

    name: str
    status: str
    age: str
    is_chief: bool
    """The launcher (arena calls it the chief)."""
    gpus: int
    """GPUs the pod requests."""
    gpu_ids: str
    """GPU indices on its node that placement chose (``mpijob.io/gpu-ids``), else N/A."""
    node: str


@dataclass(frozen=True)
class JobView:
    """One job as ``mpijob get`` prints it."""

    name: str
    namespace: str
    status: str
    priority: str
    duration: str
    trainer: str
    placement: str | None
    """The operator's one-line placement summary (``mpijob.io/placement``), if any."""
    instances: tuple[Instance, ...]

    @property
    def gpus(self) -> int:
        return sum(i.gpus for i in self.instances)

    @property
    def launcher_node(self) -> str:
        return next((i.node for i in self.instances if i.is_chief), NONE)


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API (or a datetime from the client), else None."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def human_duration(seconds: float) -> str:
    """kubectl's short age: 45s, 3m12s under 10 minutes, 4h, 2d3h, 12d."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    minutes, s = divmod(s, 60)
    if minutes < 10:
        return f"{minutes}m{s}s" if s else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours == 0:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    if days == 0:
        return f"{hours}h"
    return f"{days}d{hours}h" if hours and days < 8 else f"{days}d"


def job_status(job: JSON) -> str:
    """Arena's status word for a job, from its True conditions."""
    true = {
        c.get("type")
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    return next((word for type_, word in _STATUS_BY_CONDITION if type_ in true), "PENDING")


def job_duration(job: JSON, now: datetime) -> str:
    """From start (else creation) to completion (else now)."""
    status = job.get("status") or {}
    start = parse_time(status.get("startTime")) or parse_time(
        (job.get("metadata") or {}).get("creationTimestamp")
    )
    if start is None:
        return NONE
    end = parse_time(status.get("completionTime")) or now
    return human_duration((end - start).total_seconds())


def job_priority(job: JSON) -> str:
    """The gang's priority class, else the launcher's, else N/A."""
    spec = job.get("spec") or {}
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy") or {}
    if policy.get("priorityClass"):
        return str(policy["priorityClass"])
    launcher = (spec.get("mpiReplicaSpecs") or {}).get(keys.REPLICA_LAUNCHER) or {}
    pod_spec = (launcher.get("template") or {}).get("spec") or {}
    return str(pod_spec.get("priorityClassName") or NONE)


def pod_status(pod: JSON) -> str:
    """What kubectl's STATUS column would say, near enough: waiting reasons, Completed."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    phase = status.get("phase") or "Pending"
    if phase == "Succeeded":
        return "Completed"
    if phase == "Failed":
        return str(status.get("reason") or "Failed")
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    return str(phase)


def pod_gpus(pod: JSON) -> int:
    """GPUs the pod's containers request (limits, else requests)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(keys.GPU_RESOURCE) or (
            resources.get("requests") or {}
        ).get(keys.GPU_RESOURCE)
        total += int(amount or 0)
    return total


def instance(pod: JSON, now: datetime) -> Instance:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    created = parse_time(meta.get("creationTimestamp"))
    return Instance(
        name=str(meta.get("name")),
        status=pod_status(pod),
        age=human_duration((now - created).total_seconds()) if created else NONE,
        is_chief=labels.get(keys.LABEL_JOB_ROLE) == keys.ROLE_LAUNCHER,
        gpus=pod_gpus(pod),
        gpu_ids=str((meta.get("annotations") or {}).get(keys.GPU_IDS) or NONE),
        node=str((pod.get("spec") or {}).get("nodeName") or NONE),
    )


def job_view(job: JSON, pods: Iterable[JSON], now: datetime) -> JobView:
    """The job and its pods (launcher first, then workers by index)."""
    meta = job.get("metadata") or {}
    rows = sorted((instance(p, now) for p in pods), key=_instance_order)
    return JobView(
        name=str(meta.get("name")),
        namespace=str(meta.get("namespace") or ""),
        status=job_status(job),
        priority=job_priority(job),
        duration=job_duration(job, now),
        trainer=TRAINER,
        placement=(meta.get("annotations") or {}).get(keys.PLACEMENT),
        instances=tuple(rows),
    )


def _instance_order(row: Instance) -> tuple[bool, int, str]:
    _, _, index = row.name.rpartition("-")
    return (not row.is_chief, int(index) if index.isdigit() else -1, row.name)


def pods_by_job(pods: Iterable[JSON]) -> dict[str, list[JSON]]:
    """Pods grouped by their job-name label (pods without it are left out)."""
    groups: dict[str, list[JSON]] = {}
    for pod in pods:
        job = ((pod.get("metadata") or {}).get("labels") or {}).get(keys.LABEL_JOB_NAME)
        if job:
            groups.setdefault(str(job), []).append(pod)
    return groups


def job_views(jobs: Sequence[JSON], pods: Iterable[JSON], now: datetime) -> list[JobView]:
    """Every job with its own pods, by name."""
    groups = pods_by_job(pods)
    views = [job_view(j, groups.get(_name(j), []), now) for j in jobs]
    return sorted(views, key=lambda v: v.name)


def _name(body: JSON) -> str:
    return str((body.get("metadata") or {}).get("name"))

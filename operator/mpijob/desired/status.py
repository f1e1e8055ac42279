"""Upstream's status rules for an MPIJob: conditions, replica counts, times, events, counters.

Everything here is pure: callers pass the observed children and ``now``, and get back the new
status, the Events to post and the metric counters to increment. The reconcile loop calls
:func:`mark_invalid` for a job that fails validation (and :func:`clear_invalid` otherwise),
:func:`mark_created` first, then checks :func:`finished_with_completion` (upstream's
short-circuit, with :func:`worker_pods_to_delete` and :func:`finished_cleanup_status`), and
otherwise calls :func:`compute_status` at the end of the sync; it writes the status only when
:attr:`StatusResult.changed` is true.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from mpijob import keys
from mpijob.api import JobCondition, MPIJob, MPIJobStatus, ReplicaStatus
from mpijob.api.errors import truncate_message
from mpijob.api.models import utc_seconds
from mpijob.desired import events, names, observed
from mpijob.desired.conditions import set_condition
from mpijob.desired.events import Event

BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
EVICTED = "Evicted"
UPSTREAM_CONDITIONS = frozenset(
    {
        keys.COND_CREATED,
        keys.COND_RUNNING,
        keys.COND_RESTARTING,
        keys.COND_SUCCEEDED,
        keys.COND_SUSPENDED,
        keys.COND_FAILED,
    }
)


class Counter(StrEnum):
    """The upstream counters a status computation can ask to increment."""

    CREATED = "created"
    """``mpi_operator_jobs_created_total``."""
    SUCCESSFUL = "successful"
    """``mpi_operator_jobs_successful_total``."""
    FAILED = "failed"
    """``mpi_operator_jobs_failed_total``."""


@dataclass
class StatusResult:
    """The outcome of one status computation."""

    status: MPIJobStatus
    """The new status."""
    changed: bool
    """Whether it differs from the job's current status (write it only then)."""
    events: list[Event] = field(default_factory=list)
    """Events to post on the MPIJob, in order."""
    counters: list[Counter] = field(default_factory=list)
    """Counters to increment, one entry per increment."""
    launcher_seen: bool = False
    """The launcher Job exists: set ``mpi_operator_job_info{launcher,namespace}`` to 1."""


# --- sync steps before the children ----------------------------------------------------------


def mark_invalid(job: MPIJob, message: str, now: datetime) -> StatusResult:
    """An invalid job: upstream's Warning ``ValidationError``, and ``Invalid=True`` in status.

    ``message`` is :attr:`mpijob.api.InvalidMPIJob.message`. Upstream posts the Event on every
    sync of an invalid job and writes no status; the condition is ours, so that the problem
    also shows in ``kubectl describe``.
    """
    status = job.status.model_copy(deep=True)
    reason = keys.REASON_VALIDATION_ERROR
    changed = set_condition(status, keys.COND_INVALID, "True", reason, message, now)
    current = status.condition(keys.COND_INVALID)
    if not changed and current is not None and current.message != message:
        # A different error keeps the reason; upstream's rule would hide the new message.
        current.message = message
        current.last_update_time = utc_seconds(now)
        changed = True
    return StatusResult(status, changed=changed, events=[events.warning(reason, message)])


def clear_invalid(status: MPIJobStatus) -> bool:
    """Drop the ``Invalid`` condition once the spec is valid again; True if there was one."""
    kept = [c for c in status.conditions if c.type != keys.COND_INVALID]
    dropped = len(kept) != len(status.conditions)
    status.conditions = kept
    return dropped


def mark_created(job: MPIJob, now: datetime) -> StatusResult:
    """Upstream's step 5: a job with no conditions gets ``Created=True``, an Event and a count.

    Conditions of our own (``Invalid``, ``GangAdmitted``) do not count as conditions here.
    """
    status = job.status.model_copy(deep=True)
    if any(c.type in UPSTREAM_CONDITIONS for c in status.conditions):
        return StatusResult(status, changed=False)
    message = f"MPIJob {job.key} is created."
    set_condition(status, keys.COND_CREATED, "True", keys.REASON_CREATED, message, now)
    return StatusResult(
        status,
        changed=True,
        events=[events.normal(keys.REASON_CREATED, message)],
        counters=[Counter.CREATED],
    )


def finished_with_completion(status: MPIJobStatus) -> bool:
    """Upstream's short-circuit: Succeeded or Failed is True and ``completionTime`` is set.

    Such a job is not reconciled further; :func:`cleans_up_at_finish` says whether its workers
    are deleted first.
    """
    return status.finished and status.completion_time is not None


def cleans_up_at_finish(job: MPIJob) -> bool:
    """Whether ``cleanPodPolicy`` deletes workers when the job finishes (Running or All)."""
    return job.spec.run_policy.clean_pod_policy in (keys.CLEAN_POD_RUNNING, keys.CLEAN_POD_ALL)


def worker_pods_to_delete(job: MPIJob, worker_pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the worker pods to delete, at finish or on suspend, in index order.

    Only indices below ``replicas`` are considered. With cleanPodPolicy Running, pods that are
    not Running or Pending are kept; any other policy deletes them all.
    """
    by_name = {observed.name_of(pod): pod for pod in worker_pods}
    keep_finished = job.spec.run_policy.clean_pod_policy == keys.CLEAN_POD_RUNNING
    doomed = []
    for name in names.worker_names(job):
        pod = by_name.get(name)
        if pod is None:
            continue
        if keep_finished and observed.phase_of(pod) not in ("Running", "Pending"):
            continue
        doomed.append(name)
    return doomed


def finished_cleanup_status(job: MPIJob) -> MPIJobStatus:
    """The status written after the finish-time cleanup: worker counts reset to zero.

    Upstream writes it unconditionally, changed or not.
    """
    status = job.status.model_copy(deep=True)
    status.replica_statuses[keys.REPLICA_WORKER] = ReplicaStatus()
    return status


def launcher_done(launcher_job: Mapping[str, Any] | None) -> bool:
    """Whether the launcher Job exists and has ``Complete=True`` or ``Failed=True``."""
    return launcher_job is not None and (
        observed.job_condition(launcher_job, "Complete") is not None
        or observed.job_condition(launcher_job, "Failed") is not None
    )


def launcher_may_start(job: MPIJob, worker_pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a missing launcher may be created now (``launcherCreationPolicy``).

    AtStartup: always. Anything else waits until every desired worker is Ready, which is
    trivially so with no workers (also when suspended: the launcher is then created suspended).
    """
    if job.spec.launcher_creation_policy == keys.LAUNCHER_AT_STARTUP:
        return True
    if job.spec.suspended:
        return True
    by_name = {observed.name_of(pod): pod for pod in worker_pods}
    return all(
        name in by_name and observed.pod_ready(by_name[name]) for name in names.worker_names(job)
    )


# --- the status of a sync --------------------------------------------------------------------


def compute_status(
    job: MPIJob,
    *,
    launcher_job: Mapping[str, Any] | None,
    launcher_pods: Sequence[Mapping[str, Any]],
    worker_pods: Sequence[Mapping[str, Any]],
    now: datetime,
) -> StatusResult:
    """The job's status after a sync that did not short-circuit (upstream's §4.2).

    ``job`` carries the status so far (after :func:`mark_created`). ``launcher_pods`` may be
    every pod selected by the launcher labels; only those the Job controls count.
    ``worker_pods`` are the job's worker pods; they are ignored while the launcher is done or
    the job is suspended, when upstream lists none.
    """
    now = utc_seconds(now)
    status = job.status.model_copy(deep=True)
    result = StatusResult(status, changed=False)
    suspended = job.spec.suspended
    if status.start_time is None and not suspended:
        status.start_time = now
    _suspension(job, status, result, now)

    running_launchers = 0
    if launcher_job is not None:
        pods = observed.controlled_by(launcher_pods, launcher_job)
        running_launchers = sum(1 for pod in pods if observed.phase_of(pod) == "Running")
        _launcher(
            job,
            status,
            result,
            launcher_job=launcher_job,
            pods=pods,
            running=running_launchers,
            now=now,
        )
        result.launcher_seen = True

    # Upstream lists no workers once the launcher is done or while suspended.
    listed = not suspended and not launcher_done(launcher_job)
    all_running = _workers(job, status, result, worker_pods if listed else None, now)

    if suspended:
        message = f"MPIJob {job.key} is suspended."
        set_condition(status, keys.COND_RUNNING, "False", keys.REASON_SUSPENDED, message, now)
    elif status.finished:
        if status.condition(keys.COND_RUNNING) is None:
            at = status.completion_time or now
            status.conditions.append(
                JobCondition(
                    type=keys.COND_RUNNING,
                    status="False",
                    reason=keys.REASON_RUNNING,
                    message=f"MPIJob {job.key} is finished but Running condition was never set.",
                    last_update_time=at,
                    last_transition_time=at,
                )
            )
    elif launcher_job is not None and running_launchers >= 1 and all_running:
        message = f"MPIJob {job.key} is running."
        set_condition(status, keys.COND_RUNNING, "True", keys.REASON_RUNNING, message, now)
        # Upstream posts this on every such sync, not only on the transition.
        result.events.append(events.normal(keys.REASON_RUNNING, f"MPIJob {job.key} is running"))

    result.changed = status.to_body() != job.status.to_body()
    return result


def _suspension(job: MPIJob, status: MPIJobStatus, result: StatusResult, now: datetime) -> None:
    if job.spec.suspended:
        if set_condition(
            status, keys.COND_SUSPENDED, "True", keys.REASON_SUSPENDED, "MPIJob suspended", now
        ):
            result.events.append(events.normal(keys.REASON_SUSPENDED, "MPIJob suspended"))
    elif status.condition(keys.COND_SUSPENDED) is not None and set_condition(
        status, keys.COND_SUSPENDED, "False", keys.REASON_RESUMED, "MPIJob resumed", now
    ):
        result.events.append(events.normal(keys.REASON_RESUMED, "MPIJob resumed"))
        status.start_time = now


def _launcher(
    job: MPIJob,
    status: MPIJobStatus,
    result: StatusResult,
    *,
    launcher_job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    running: int,
    now: datetime,
) -> None:
    job_status = launcher_job.get("status") or {}
    launcher = ReplicaStatus(failed=job_status.get("failed") or 0)
    status.replica_statuses[keys.REPLICA_LAUNCHER] = launcher
    failed = observed.job_condition(launcher_job, "Failed")
    if observed.job_condition(launcher_job, "Complete") is not None:
        launcher.succeeded = 1
        message = f"MPIJob {job.key} successfully completed."
        result.events.append(events.normal(keys.REASON_SUCCEEDED, message))
        if status.completion_time is None:
            status.completion_time = observed.parse_time(job_status.get("completionTime"))
        set_condition(status, keys.COND_SUCCEEDED, "True", keys.REASON_SUCCEEDED, message, now)
        result.counters.append(Counter.SUCCESSFUL)
    elif failed is not None:
        reason = failed.get("reason") or keys.REASON_FAILED
        message = failed.get("message") or f"MPIJob {job.key} has failed"
        if reason == BACKOFF_LIMIT_EXCEEDED:
            last = _last_failed(pods)
            if last is not None:
                pod_status = last.get("status") or {}
                reason += "/" + (pod_status.get("reason") or "")
                message = truncate_message(f"{message}: {pod_status.get('message') or ''}")
        result.events.append(events.warning(reason, message))
        if status.completion_time is None:
            status.completion_time = now
        set_condition(status, keys.COND_FAILED, "True", reason, message, now)
        result.counters.append(Counter.FAILED)
    else:
        launcher.active = running


def _workers(
    job: MPIJob,
    status: MPIJobStatus,
    result: StatusResult,
    worker_pods: Sequence[Mapping[str, Any]] | None,
    now: datetime,
) -> bool:
    """Count the desired workers by phase; True when every one of them is Running."""
    wanted = set(names.worker_names(job)) if worker_pods is not None else set()
    pods = [pod for pod in worker_pods or () if observed.name_of(pod) in wanted]
    counts = ReplicaStatus()
    evicted = 0
    for pod in pods:
        phase = observed.phase_of(pod)
        if phase == "Failed":
            counts.failed += 1
            if (pod.get("status") or {}).get("reason") == EVICTED:
                evicted += 1
        elif phase == "Succeeded":
            counts.succeeded += 1
        elif phase == "Running":
            counts.active += 1
    status.replica_statuses[keys.REPLICA_WORKER] = counts
    if evicted:
        message = f"{evicted}/{len(wanted)} workers are evicted"
        set_condition(status, keys.COND_FAILED, "True", keys.REASON_EVICTED, message, now)
        result.events.append(events.warning(keys.REASON_EVICTED, message))
    return counts.active == len(wanted)


def _last_failed(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The most recently created Failed pod; the first listed wins a tie, as upstream."""
    last: Mapping[str, Any] | None = None
    last_created = datetime.min
    for pod in pods:
        if observed.phase_of(pod) != "Failed":
            continue
        created = observed.parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
        stamp = created.replace(tzinfo=None) if created else datetime.min
        if last is None or stamp > last_created:
            last, last_created = pod, stamp
    return last

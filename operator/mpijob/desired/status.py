"""The status of an MPIJob after one sync: upstream's rules, plus our admission conditions.

:func:`next_status` is the one place a job's status is composed. It takes the job, its children
as the sync leaves them (the plan's :attr:`~mpijob.desired.sync.Plan.projected` observation) and
the admission outcome, and returns the new status with the Events to post, the steps of the
job's life it saw the children take and the workers it saw fail while the job runs; the handler
only writes it, when :attr:`StatusResult.changed`. The steps and worker failures
(:mod:`mpijob.desired.life`) are counted and announced once per job, whatever the status says:
a status the tenant rewrote is rewritten from the children, but counts nothing again.
:func:`mark_invalid` is its counterpart for a job that fails validation (no model of the spec
exists then, only of the status). Everything here is pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mpijob import keys
from mpijob.api import JobCondition, MPIJob, MPIJobStatus, ReplicaStatus
from mpijob.api.errors import truncate_message
from mpijob.api.models import parse_time, utc_seconds
from mpijob.desired import events, names, observed, template
from mpijob.desired.conditions import set_condition
from mpijob.desired.events import Event
from mpijob.desired.life import Step, Transition, WorkerFailure
from mpijob.desired.observed import EVICTED, Observed, PodFailure
from mpijob.pods.predicates import template_gpus

BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
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


@dataclass
class StatusResult:
    """The outcome of one status computation."""

    status: MPIJobStatus
    """The new status."""
    changed: bool
    """Whether it differs from the job's current status (write it only then)."""
    events: list[Event] = field(default_factory=list)
    """Events to post on the MPIJob whenever computed, in order (upstream's ``MPIJobRunning``
    on every running sync, suspension, admission, workers left running)."""
    steps: list[Step] = field(default_factory=list)
    """Steps of the job's life this computation saw (created, first running, succeeded,
    failed), with their Events: counted and posted once per job (:mod:`mpijob.desired.life`)."""
    worker_failures: list[WorkerFailure] = field(default_factory=list)
    """Every failure its wanted workers' pods show while the job runs, each with its Warning
    (posted once per failure); none when the workers are not read (the job is done, suspended,
    ends in this computation, or its status says it finished)."""
    launcher_seen: bool = False
    """The launcher Job exists: set ``mpi_operator_job_info{launcher,namespace}`` to 1."""
    gpus_held: int = 0
    """GPUs that the Running or Pending workers of a finished job hold (cleanPodPolicy None
    left them): ``mpi_operator_finished_jobs_gpus_held``."""

    @property
    def transitions(self) -> list[Transition]:
        """The transitions of :attr:`steps`, in order."""
        return [step.transition for step in self.steps]

    @property
    def failure_reason(self) -> str | None:
        """The reason of the job's failure in this computation, if it failed: the kubelet's for
        its first pod failure, else the launcher Job's (``mpi_operator_job_failures_total``)."""
        return next((s.reason for s in self.steps if s.transition is Transition.FAILED), None)

    def every_event(self) -> list[Event]:
        """Every Event of this computation as if nothing had been announced before: its
        steps', its worker failures', then the rest."""
        failures = [f.event for f in self.worker_failures]
        return [*(s.event for s in self.steps if s.event is not None), *failures, *self.events]


@dataclass(frozen=True)
class ConditionChange:
    """One condition to set: the arguments of upstream's ``setCondition``."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class AdmissionOutcome:
    """What our gang admission's latest decision means for the status (see
    :mod:`mpijob.gang.outcome`, which builds it)."""

    conditions: Sequence[ConditionChange] = ()
    """Conditions to set, in order."""
    event: Event | None = None
    """An Event to post on the MPIJob when the conditions change."""
    failed: bool = False
    """The job is now Failed: set ``completionTime`` and count it as failed."""


# --- the one status function -----------------------------------------------------------------


def next_status(
    job: MPIJob,
    seen: Observed,
    now: datetime,
    *,
    admission: AdmissionOutcome | None = None,
    gang: AdmissionOutcome | None = None,
) -> StatusResult:
    """The job's status after this sync, with its Events, steps and worker failures.

    Upstream's order: ``Created`` first; a job already finished with a completion time is only
    cleaned up (worker counts reset when cleanPodPolicy deletes its workers); otherwise the
    status follows from the launcher and worker pods (§4.2). Then our own conditions: a job
    that validates again sheds ``Invalid``, the admission outcome sets ``GangAdmitted``, and
    ``gang``, Kubernetes' own gang's state, ``GangScheduled`` (each ``Failed`` on timeout).
    """
    current = job.status.model_copy(deep=True)
    was_invalid = clear_invalid(current)
    job = job.model_copy(update={"status": current})
    created = mark_created(job, now)
    job = job.model_copy(update={"status": created.status})
    if finished_with_completion(job.status):
        if cleans_up_at_finish(job):
            # Upstream writes this status after every cleanup, changed or not; it is written
            # only when it changed here: a sync of a finished job (each event of its pods going,
            # a rewrite of its status) costs no write of the same status.
            cleaned = finished_cleanup_status(job)
            result = StatusResult(cleaned, changed=cleaned.to_body() != job.status.to_body())
        else:
            result = created
            _left_running(job, result, observed.workers_of(job, seen.pods), now)
    else:
        result = compute_status(
            job,
            launcher_job=seen.launcher_job,
            launcher_pods=observed.launcher_pods_of(seen.pods),
            worker_pods=observed.workers_of(job, seen.pods),
            now=now,
        )
        result.changed = result.changed or created.changed
        result.events[:0] = created.events
        result.steps[:0] = created.steps
        if finished_with_completion(result.status) and not cleans_up_at_finish(job):
            # What the end leaves running goes in the end's own write, not a second one.
            _left_running(job, result, observed.workers_of(job, seen.pods), now)
    for outcome in (admission, gang):
        if outcome is None:
            continue
        applied = _apply_admission(result.status, outcome, now)
        result.changed = result.changed or applied
        event = outcome.event if applied else None
        if outcome.failed:
            if result.status.completion_time is None:
                result.status.completion_time = utc_seconds(now)
                result.changed = True
            result.steps.append(
                Step(Transition.FAILED, event, now, reason=keys.REASON_GANG_SCHEDULE_TIMEOUT)
            )
            result.worker_failures = []  # it ends here: the Failed Warning says why
        elif event is not None:
            result.events.append(event)
    result.changed = result.changed or was_invalid
    return result


def _apply_admission(status: MPIJobStatus, outcome: AdmissionOutcome, now: datetime) -> bool:
    """Set the outcome's conditions on ``status`` in place; True when anything changed.

    Upstream's rule keeps the message of a condition whose status and reason are unchanged;
    a waiting job's message is the news (what it waits for), so it is refreshed.
    """
    changed = False
    for change in outcome.conditions:
        if set_condition(status, change.type, change.status, change.reason, change.message, now):
            changed = True
            continue
        current = status.condition(change.type)
        if (
            change.reason in (keys.REASON_GANG_WAITING, keys.REASON_GPU_QUOTA_EXCEEDED)
            and current is not None
            and current.message != change.message
        ):
            current.message = change.message
            current.last_update_time = utc_seconds(now)
            changed = True
    return changed


# --- sync steps before the children ----------------------------------------------------------


def mark_invalid(current: MPIJobStatus, message: str, now: datetime) -> StatusResult:
    """An invalid job: upstream's Warning ``ValidationError``, and ``Invalid=True`` in status.

    ``current`` is the job's status as stored (a spec that does not parse has no model, its
    status still does); ``message`` is :attr:`mpijob.api.InvalidMPIJob.message`. Upstream
    posts the Event on every sync of an invalid job and writes no status; the condition is ours,
    so that the problem shows in ``kubectl describe``, and the Event is posted only when the
    message changes, not on every sync of the unchanged job.
    """
    status = current.model_copy(deep=True)
    reason = keys.REASON_VALIDATION_ERROR
    changed = set_condition(status, keys.COND_INVALID, "True", reason, message, now)
    condition = status.condition(keys.COND_INVALID)
    if not changed and condition is not None and condition.message != message:
        # A different error keeps the reason; upstream's rule would hide the new message.
        condition.message = message
        condition.last_update_time = utc_seconds(now)
        changed = True
    posted = [events.warning(reason, message)] if changed else []
    return StatusResult(status, changed=changed, events=posted)


def clear_invalid(status: MPIJobStatus) -> bool:
    """Drop the ``Invalid`` condition once the spec is valid again; True if there was one."""
    kept = [c for c in status.conditions if c.type != keys.COND_INVALID]
    dropped = len(kept) != len(status.conditions)
    status.conditions = kept
    return dropped


def mark_created(job: MPIJob, now: datetime) -> StatusResult:
    """Upstream's step 5: a job with no conditions gets ``Created=True``, and the step that
    counts it and posts its Event (once per job: the status may have been cleared by its
    tenant).

    Conditions of our own (``Invalid``, ``GangAdmitted``) do not count as conditions here.
    """
    status = job.status.model_copy(deep=True)
    if any(c.type in UPSTREAM_CONDITIONS for c in status.conditions):
        return StatusResult(status, changed=False)
    message = f"MPIJob {job.key} is created."
    set_condition(status, keys.COND_CREATED, "True", keys.REASON_CREATED, message, now)
    step = Step(
        Transition.CREATED,
        events.normal(keys.REASON_CREATED, message),
        job.metadata.creation_timestamp or now,
    )
    return StatusResult(status, changed=True, steps=[step])


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

    AtStartup: always. Anything else waits until every desired worker is reachable
    (:func:`workers_reachable`), which is trivially so with no workers (also when suspended:
    the launcher is then created suspended, as upstream, and :func:`launcher_may_resume` holds
    it suspended on resume until the workers are reachable again).
    """
    if job.spec.launcher_creation_policy == keys.LAUNCHER_AT_STARTUP:
        return True
    if job.spec.suspended:
        return True
    return workers_reachable(job, worker_pods)


def launcher_may_resume(job: MPIJob, worker_pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a suspended launcher Job may be resumed now that the job is not suspended.

    AtStartup: at once, as upstream. WaitForWorkersReady: once every worker is reachable, the
    same rule as creating the launcher; upstream resumes it at once (mpi-operator#615), so its
    launcher starts while the workers are still being created again.
    """
    if job.spec.launcher_creation_policy == keys.LAUNCHER_AT_STARTUP:
        return True
    return workers_reachable(job, worker_pods)


def workers_reachable(job: MPIJob, worker_pods: Iterable[Mapping[str, Any]]) -> bool:
    """Every desired worker exists, is Ready, is not terminating and has its IP
    (:func:`mpijob.desired.observed.pod_reachable`)."""
    by_name = {observed.name_of(pod): pod for pod in worker_pods}
    return all(
        name in by_name and observed.pod_reachable(by_name[name])
        for name in names.worker_names(job)
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
    failures = observed.first_failures(
        [*observed.controlled_by(launcher_pods, launcher_job or {}), *worker_pods]
    )
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
            failures=failures,
            now=now,
        )
        result.launcher_seen = True

    # Upstream lists no workers once the launcher is done or while suspended.
    listed = not suspended and not launcher_done(launcher_job)
    all_running = _workers(job, status, result, worker_pods if listed else None, failures, now)
    if listed and not any(step.transition is Transition.FAILED for step in result.steps):
        result.worker_failures = worker_failures(job, worker_pods)

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
        result.steps.append(Step(Transition.RUNNING, at=now))

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
    failures: Sequence[observed.PodFailure],
    now: datetime,
) -> None:
    job_status = launcher_job.get("status") or {}
    launcher = ReplicaStatus(failed=job_status.get("failed") or 0)
    status.replica_statuses[keys.REPLICA_LAUNCHER] = launcher
    failed = observed.job_condition(launcher_job, "Failed")
    if observed.job_condition(launcher_job, "Complete") is not None:
        launcher.succeeded = 1
        message = f"MPIJob {job.key} successfully completed."
        completed = parse_time(job_status.get("completionTime"))
        if status.completion_time is None:
            status.completion_time = completed
        set_condition(status, keys.COND_SUCCEEDED, "True", keys.REASON_SUCCEEDED, message, now)
        event = events.normal(keys.REASON_SUCCEEDED, message)
        result.steps.append(Step(Transition.SUCCEEDED, event, completed or now))
    elif failed is not None:
        reason = failed.get("reason") or keys.REASON_FAILED
        message = failed.get("message") or f"MPIJob {job.key} has failed"
        if reason == BACKOFF_LIMIT_EXCEEDED:
            last = _last_failed(pods)
            if last is not None:
                pod_status = last.get("status") or {}
                reason += "/" + (pod_status.get("reason") or "")
                message = truncate_message(f"{message}: {pod_status.get('message') or ''}")
        message = with_failures(message, failures)
        if status.completion_time is None:
            status.completion_time = now
        set_condition(status, keys.COND_FAILED, "True", reason, message, now)
        result.steps.append(
            _failed(
                events.warning(reason, message),
                parse_time(failed.get("lastTransitionTime")) or now,
                failures,
                failed.get("reason"),
            )
        )
    else:
        launcher.active = running


def _workers(
    job: MPIJob,
    status: MPIJobStatus,
    result: StatusResult,
    worker_pods: Sequence[Mapping[str, Any]] | None,
    failures: Sequence[observed.PodFailure],
    now: datetime,
) -> bool:
    """Count the desired workers by phase; True when every one of them is Running.

    An evicted worker fails the job, as upstream; unlike upstream (mpi-operator#647) the job
    is then finished (``completionTime``), so ``cleanPodPolicy`` cleans up after it and it is
    counted as failed."""
    wanted = len(names.worker_names(job)) if worker_pods is not None else 0
    pods = observed.desired_workers(job, worker_pods or [])
    counts = ReplicaStatus()
    for pod in pods:
        phase = observed.phase_of(pod)
        if phase == "Failed":
            counts.failed += 1
        elif phase == "Succeeded":
            counts.succeeded += 1
        elif phase == "Running":
            counts.active += 1
    status.replica_statuses[keys.REPLICA_WORKER] = counts
    evicted = sum(1 for pod in pods if observed.evicted(pod))
    if evicted:
        message = with_failures(f"{evicted}/{wanted} workers are evicted", failures)
        set_condition(status, keys.COND_FAILED, "True", keys.REASON_EVICTED, message, now)
        if status.completion_time is None:
            status.completion_time = now
        result.steps.append(
            _failed(events.warning(keys.REASON_EVICTED, message), now, failures, EVICTED)
        )
    return counts.active == wanted


def _failed(
    event: Event, at: datetime, failures: Sequence[PodFailure], otherwise: str | None
) -> Step:
    """The job's failure: its Warning, and for ``mpi_operator_job_failures_total`` its first
    pod failure's reason (``otherwise`` when no pod says why)."""
    first = failures[0] if failures else None
    return Step(
        Transition.FAILED, event, at, reason=first.reason if first else otherwise, failure=first
    )


def worker_failures(job: MPIJob, worker_pods: Sequence[Mapping[str, Any]]) -> list[WorkerFailure]:
    """Every failure the job's wanted workers show (:func:`mpijob.desired.observed.failures_of`:
    a container run that ended with a non-zero exit code, the current one's or the last one's,
    or a pod the kubelet stopped), each with the Warning that names it while the job runs.

    The Warning's text is the same each time the same container of the same worker fails the
    same way (no count, no time in it), so the recorder counts a crash loop up on one Event."""
    policy = template.restart_policy(job.spec.worker)
    out = []
    for pod in observed.desired_workers(job, worker_pods):
        for failure in observed.failures_of(pod):
            if failure.container and policy != keys.RESTART_NEVER:
                then = f"the kubelet restarts the container (restartPolicy {policy})"
            else:
                then = "the pod is not restarted"
            message = truncate_message(f"{failure.describe()} while the job runs; {then}")
            out.append(WorkerFailure(failure, events.warning(keys.REASON_WORKER_FAILED, message)))
    return out


#: Reasons ``mpi_operator_job_failures_total`` names as they are; any other is ``Other``, so a
#: reason no one foresaw cannot grow the series without bound.
FAILURE_LABELS = frozenset(
    {
        "OOMKilled",
        "Error",
        "ContainerCannotRun",
        "StartError",
        EVICTED,
        "DeadlineExceeded",
        BACKOFF_LIMIT_EXCEEDED,
        keys.REASON_GANG_SCHEDULE_TIMEOUT,
        *observed.STUCK_WAITING_REASONS,
        *observed.POD_FAILURE_REASONS,
    }
)


def failure_label(reason: str | None) -> str:
    """The ``reason`` label of ``mpi_operator_job_failures_total`` for a failure's reason."""
    return reason if reason in FAILURE_LABELS else "Other"


def with_failures(message: str, failures: Sequence[observed.PodFailure]) -> str:
    """A failed job's message, then the first pod failure the kubelet reported and how many
    other pods failed (``...; first failure: worker pod p container c OOMKilled (exit code
    137); 1 other pod failed``); ``message`` alone when no pod says why."""
    if not failures:
        return message
    text = f"{message}; first failure: {failures[0].describe()}"
    others = len(failures) - 1
    if others:
        text += f"; {others} other pod{'s' if others > 1 else ''} failed"
    return truncate_message(text)


def _left_running(
    job: MPIJob, result: StatusResult, workers: Sequence[Mapping[str, Any]], now: datetime
) -> None:
    """A finished job whose cleanPodPolicy (None) keeps its workers: say so while any of them
    is Running or Pending, with the GPUs they hold (a condition, the gauge, and a Warning once
    per job: the step :attr:`~mpijob.desired.life.Transition.WORKERS_LEFT_RUNNING`)."""
    held = [pod for pod in workers if observed.holds_on(pod)]
    # The GPUs one worker asks for, from the job's template: the watch keeps no container specs.
    per_worker = template_gpus(job.spec.worker.template) if job.spec.worker is not None else 0
    result.gpus_held = per_worker * len(held)
    status = result.status
    if held:
        names_held = ", ".join(sorted(observed.name_of(pod) for pod in held))
        message = (
            f"MPIJob {job.key} finished, and cleanPodPolicy "
            f"{job.spec.run_policy.clean_pod_policy} leaves {len(held)} worker pod(s) running "
            f"({names_held}), holding {result.gpus_held} GPU(s); delete them, or set "
            "spec.runPolicy.cleanPodPolicy: Running"
        )
        if set_condition(
            status,
            keys.COND_WORKERS_LEFT_RUNNING,
            "True",
            keys.REASON_CLEAN_POD_POLICY,
            message,
            now,
        ):
            result.changed = True
        condition = status.condition(keys.COND_WORKERS_LEFT_RUNNING)
        said, since = message, now
        if condition is not None:
            said, since = condition.message, condition.last_transition_time or now
        event = events.warning(keys.REASON_WORKERS_LEFT_RUNNING, said)
        result.steps.append(Step(Transition.WORKERS_LEFT_RUNNING, event, since))
    elif status.is_true(keys.COND_WORKERS_LEFT_RUNNING):
        message = f"No worker pod of MPIJob {job.key} is left running."
        set_condition(
            status, keys.COND_WORKERS_LEFT_RUNNING, "False", keys.REASON_WORKERS_GONE, message, now
        )
        result.changed = True


def _last_failed(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The most recently created Failed pod; the first listed wins a tie, as upstream."""
    last: Mapping[str, Any] | None = None
    last_created = datetime.min
    for pod in pods:
        if observed.phase_of(pod) != "Failed":
            continue
        created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
        stamp = created.replace(tzinfo=None) if created else datetime.min
        if last is None or stamp > last_created:
            last, last_created = pod, stamp
    return last

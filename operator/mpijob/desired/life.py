"""The steps of a job's life that are counted and announced once per job, and the record of them.

Upstream counts a job (``mpi_operator_jobs_created_total``, ``..._successful_total``,
``..._failed_total``) and posts its ``MPIJobCreated``, ``MPIJobSucceeded`` and Failed Events when
the job's *status* changes: a job with no conditions is "created", one whose status lacks
``Succeeded`` while its launcher Job is complete "succeeds". The status is the tenant's to write
(the MPIJob role grants ``mpijobs/status``): a tenant who clears its finished job's conditions
and ``completionTime`` makes the job succeed again, and every dashboard and alert reading those
counters counts it again.

Here the status still says what it says (it is rewritten from the children, as upstream), but the
counters, the Events of these steps and the job-level histograms move on what the operator saw
of the job's children, once per job uid and process:

- :class:`Step`: a step the status computation saw the children take (:class:`Transition`:
  created, first running, succeeded or failed), with its Event; a job ends once, succeeded or
  failed, whichever is seen first.
- :class:`WorkerFailure`: a worker that failed, restarted or was evicted while its job runs, with
  the Warning that names it; once per failure (pod uid, container, when the run ended).
- :class:`Life`: what was announced of one job; :meth:`Life.news` says which of one sync's steps
  and worker failures are new. :class:`Lives` holds one per live job, seeded when this process
  first sees the job from what its children show (:func:`shown_by`): a job first seen with
  children counts no creation, with its launcher done no end, with a worker failed no failure,
  so a restart neither counts them again nor posts their Events as new. The Events of what a
  record took as announced are handed to the recorder's check of lost Events instead
  (:attr:`News.known`), which posts only those the API lacks: a kill between a child's creation
  and the status write loses none. A deleted job is forgotten (:meth:`Lives.forget`): the record
  holds live jobs only.

Everything here is pure (no I/O); the handlers keep the one :class:`Lives` of the process.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from mpijob.api import JobKey, MPIJob
from mpijob.api.models import parse_time
from mpijob.desired import observed
from mpijob.desired.events import Event, Implied
from mpijob.desired.observed import FailureKey, Observed, PodFailure


class Transition(StrEnum):
    """A step of a job's life that is counted and announced once per job."""

    CREATED = "created"
    """The job's first sync: ``mpi_operator_jobs_created_total``, ``MPIJobCreated``."""
    RUNNING = "running"
    """Running for the first time: ``mpi_operator_job_time_to_running_seconds``."""
    SUCCEEDED = "succeeded"
    """``mpi_operator_jobs_successful_total``, ``MPIJobSucceeded``, the job's duration."""
    FAILED = "failed"
    """``mpi_operator_jobs_failed_total``, the Failed Warning, the job's duration, and
    ``mpi_operator_job_failures_total`` unless its first failure was counted already."""
    WORKERS_LEFT_RUNNING = "workers-left-running"
    """Ended with workers that cleanPodPolicy leaves running: the ``WorkersLeftRunning``
    Warning (no operator makes a finished job's workers again, so it happens once)."""


#: A job ends once: whichever of these is seen first is its end.
ENDS = frozenset({Transition.SUCCEEDED, Transition.FAILED})


@dataclass(frozen=True)
class Step:
    """One step the status computation saw the job's children take."""

    transition: Transition
    event: Event | None = None
    """The Event that announces it."""
    at: datetime | None = None
    """When it happened, as the children (or the job's creation) say; the check of lost Events
    posts nothing older than the Events' time to live."""
    reason: str | None = None
    """A failure's reason for ``mpi_operator_job_failures_total``: the kubelet's for the first
    pod failure, else the launcher Job's (or the admission's)."""
    failure: PodFailure | None = None
    """A failure's first pod failure, when a pod says why."""


@dataclass(frozen=True)
class WorkerFailure:
    """A worker's failure while its job runs, and the Warning that names it."""

    failure: PodFailure
    event: Event


@dataclass(frozen=True)
class News:
    """What one sync announces of a job's life (:meth:`Life.news`)."""

    steps: list[Step]
    """The steps not announced before: count them and post their Events."""
    failures: list[WorkerFailure]
    """The worker failures not announced before: post their Warnings."""
    failure_reasons: list[str]
    """Reasons to count in ``mpi_operator_job_failures_total``: each new worker failure's, and
    a new failure of the job's unless its first pod failure was counted as a worker's."""
    known: list[Implied]
    """The Events of the steps and worker failures announced before, for the recorder's check
    after a restart: posted only if the API lacks them (what a record made from the children
    took as announced may never have been posted)."""
    ended: dict[FailureKey, str]
    """When the latest failure this sync saw of each worker container ended."""

    @property
    def events(self) -> list[Event]:
        """The Events to post: the new steps', then the new worker failures'."""
        return [s.event for s in self.steps if s.event is not None] + [
            f.event for f in self.failures
        ]


@dataclass
class Life:
    """What was announced of one job (one uid) in this process."""

    uid: str
    taken: set[Transition] = field(default_factory=set)
    """Steps counted and announced (or shown by the children when the record was made)."""
    failures: dict[FailureKey, str] = field(default_factory=dict)
    """For each worker container that failed (its pod's uid, its name), when the latest of its
    failures announced (or shown when the record was made) ended: one that ended no later is
    not news. Only time tells a container's failures apart: the kubelet shows the ends of its
    current and last runs, not always both, and a status may show the older end again after
    one that showed only the newer."""

    def has(self, transition: Transition) -> bool:
        """Whether ``transition`` was announced; any end counts as the end."""
        return transition in self.taken or (transition in ENDS and bool(self.taken & ENDS))

    def said(self, failure: PodFailure) -> bool:
        """Whether ``failure`` was announced (or one of its container's that ended later)."""
        last = self.failures.get(failure.key)
        return last is not None and failure.at <= last

    def news(self, steps: Sequence[Step], failures: Sequence[WorkerFailure]) -> News:
        """Which of one sync's ``steps`` and worker ``failures`` are new; pure: the record
        changes once they are announced (:meth:`announced`)."""
        new: list[Step] = []
        held: list[Step] = []
        for step in steps:
            again = any(s.transition == step.transition or _both_ends(s, step) for s in new)
            (held if again or self.has(step.transition) else new).append(step)
        fresh = [f for f in failures if not self.said(f.failure)]
        old = [f for f in failures if self.said(f.failure)]
        reasons = [f.failure.reason for f in fresh]
        reasons += [
            step.reason
            for step in new
            if step.transition is Transition.FAILED
            and step.reason is not None
            # The job's first failure, counted already when its worker failed while it ran.
            and (step.failure is None or not self.said(step.failure))
        ]
        known = [Implied(s.event, s.at) for s in held if s.event is not None]
        known += [Implied(f.event, parse_time(f.failure.at)) for f in old]
        return News(
            steps=new,
            failures=fresh,
            failure_reasons=reasons,
            known=known,
            ended=_latest(f.failure for f in failures),
        )

    def announced(self, news: News) -> None:
        """``news`` was counted and posted: its steps and failures are not news again."""
        self.taken.update(step.transition for step in news.steps)
        for key, at in news.ended.items():
            self.failures[key] = max(at, self.failures.get(key, at))

    def keep(self, pods: Collection[str]) -> None:
        """Forget the failures of pods (by uid) that are gone: no pod comes back."""
        for key in [k for k in self.failures if k[0] not in pods]:
            del self.failures[key]


def _latest(failures: Iterable[PodFailure]) -> dict[FailureKey, str]:
    """When the latest of ``failures`` of each container ended."""
    out: dict[FailureKey, str] = {}
    for f in failures:
        out[f.key] = max(f.at, out.get(f.key, f.at))
    return out


def _both_ends(a: Step, b: Step) -> bool:
    return a.transition in ENDS and b.transition in ENDS


def shown_by(job: MPIJob, seen: Observed) -> tuple[set[Transition], dict[FailureKey, str]]:
    """The steps the job's children show it took already, and the worker failures its pods
    show: what a job first seen by this process took before it (or while no operator ran).

    Created: any child exists. Running: its launcher's pod got past Pending, or the launcher
    Job is done. Ended: the launcher Job is complete or failed, or a worker was evicted (the
    status rules' ends; a gang's admission timeout is the admission's, not a child's, and is
    counted when this process decides it). Workers left running: ended, and a wanted worker is
    Running or Pending."""
    launcher = seen.launcher_job
    workers = observed.desired_workers(job, observed.workers_of(job, seen.pods))
    launcher_pods = (
        observed.controlled_by(observed.launcher_pods_of(seen.pods), launcher)
        if launcher is not None
        else []
    )
    children = (seen.service, seen.config_map, seen.secret, seen.pod_group, launcher)
    shown: set[Transition] = set()
    if workers or launcher_pods or seen.claims or any(c is not None for c in children):
        shown.add(Transition.CREATED)
    complete = launcher is not None and observed.job_condition(launcher, "Complete") is not None
    failed = launcher is not None and observed.job_condition(launcher, "Failed") is not None
    if complete:
        shown.add(Transition.SUCCEEDED)
    if failed or any(observed.evicted(pod) for pod in workers):
        shown.add(Transition.FAILED)
    if shown & ENDS and any(observed.holds_on(pod) for pod in workers):
        shown.add(Transition.WORKERS_LEFT_RUNNING)
    if (
        complete
        or failed
        or any(observed.phase_of(p) in ("Running", "Succeeded", "Failed") for p in launcher_pods)
    ):
        shown.add(Transition.RUNNING)
    failures = _latest(f for pod in workers for f in observed.failures_of(pod))
    return shown, failures


class Lives:
    """One :class:`Life` per live job of this process, by key (a job of the same name made
    again is a new life: its uid differs)."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, Life] = {}

    def of(self, key: JobKey, job: MPIJob, seen: Observed) -> Life:
        """The job's record; made from what its children show (:func:`shown_by`) when this
        process first sees the job, and after that rid of the failures of pods that are gone."""
        life = self._jobs.get(key)
        if life is None or life.uid != job.metadata.uid:
            taken, failures = shown_by(job, seen)
            life = self._jobs[key] = Life(job.metadata.uid, taken, failures)
        else:
            life.keep({str((p.get("metadata") or {}).get("uid") or "") for p in seen.pods})
        return life

    def forget(self, key: JobKey) -> None:
        """The job is deleted."""
        self._jobs.pop(key, None)

    def __len__(self) -> int:
        return len(self._jobs)

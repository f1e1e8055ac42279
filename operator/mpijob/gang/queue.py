"""Our own all-or-nothing gang admission, for clusters with no gang scheduler.

When topology-aware placement is on, a job's worker pods are created only once the whole job
fits; until then it waits. This module decides, for every waiting job, whether it is admitted
now, keeps waiting, or has waited past its ``scheduleTimeoutSeconds``. The handler gathers the
waiting jobs, calls :func:`decide`, and applies the decisions (creating pods, writing the
``GangAdmitted`` condition, failing timed-out jobs, posting Events).

**Order.** Waiting jobs are considered by priority (the value of the job's PriorityClass,
higher first), then by submission time (``creationTimestamp``, older first), then by
namespace and name, so the order is total and the same on every pass.

**No starvation: strict head-of-line blocking per pool.** Within a pool, once a job does not
fit, no job behind it in the order is admitted in that pass; they wait "behind" it. Capacity
that running jobs release therefore accumulates for the first job in line until it fits, and a
big job cannot be overtaken forever by a stream of small ones: it is overtaken only by jobs of
higher priority (which is what priority means), never by later or equal-priority ones. What
a blocked job holds is the nodes it may go to (``WaitingJob.nodes``, from its template's
selector and affinity): a job behind it that may go elsewhere is placed on its other nodes, so
a job waiting for one set of nodes never blocks jobs that need others. Pools
(``WaitingJob.pool``) separate jobs that never compete at all; a job whose nodes are unknown
holds its whole pool. Three
exceptions keep a blocked head from holding a pool forever: a job that would not fit even on an
empty pool (``fits_when_empty=False``) waits without blocking anyone, so does a job its
namespace's ResourceQuota has no room for (``try_place`` returns :class:`OverQuota`: one
namespace's quota never stalls another's jobs), and a job past its deadline times out and
leaves the line. We chose this over backfilling small jobs around the
head, because backfilling without knowing when running jobs end cannot promise the head a start.

**Placement stays outside.** The caller passes ``try_place(job, granted)``, which returns a
placement or a no-fit with a ``reason`` message (``mpijob.placement.job``'s ``Placement`` and
``NoFit``; any result with a ``reason`` attribute counts as a no-fit). ``granted`` lists the
placements already admitted earlier in the same pass, which the callback must count as taken
(``placement.job.claim`` does that). ``try_place`` is called only for a job that is admitted if
it fits, in order, at most once per job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Generic, Protocol, TypeVar, runtime_checkable

from mpijob.api.models import MPIJob
from mpijob.gang import timeout

P = TypeVar("P")


@runtime_checkable
class NoFit(Protocol):
    """What ``try_place`` returns when the job does not fit: anything with a ``reason``."""

    @property
    def reason(self) -> str:
        """Human-readable: what is missing, e.g. "needs 4 GPUs on one opted-in node"."""
        ...


@dataclass(frozen=True)
class WaitingJob:
    """A job waiting for admission, with what the order and the deadline need."""

    namespace: str
    name: str
    uid: str
    created: datetime
    """Submission time (``metadata.creationTimestamp``)."""
    priority: int = 0
    """Value of the job's PriorityClass; 0 when it has none."""
    deadline: datetime | None = None
    """When it times out (creation + ``scheduleTimeoutSeconds``); None never."""
    pool: str = ""
    """Jobs in different pools never compete for the same capacity."""
    fits_when_empty: bool = True
    """False when the job would not fit even with nothing running; it then blocks no one."""
    nodes: frozenset[str] | None = None
    """The nodes the job may go to (its template's selector and affinity); None: any node of
    its pool. A job that does not fit holds only these for itself."""
    avoid: frozenset[str] = frozenset()
    """Set by :func:`decide` for ``try_place``: nodes held for jobs ahead of this one that do
    not fit yet. The job may be placed on its other nodes only."""

    @property
    def key(self) -> str:
        """``<namespace>/<name>``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Admit(Generic[P]):
    """The whole job fits: create its pods as placed."""

    job: WaitingJob
    placement: P


@dataclass(frozen=True)
class Wait:
    """The job keeps waiting; ``message`` says why."""

    job: WaitingJob
    message: str
    behind: WaitingJob | None = None
    """The job ahead of it in its pool that does not fit yet, when that is the reason."""
    refused: bool = False
    """It fits, but its decision could not be recorded: only its owner can fix that."""
    over_quota: bool = False
    """Its GPUs would take its namespace past a ResourceQuota: only its namespace's own jobs
    finishing (or an admin) can change that, so it holds no pool."""
    unfit: bool = False
    """No node it may go to could hold one of its workers even empty (a resource the nodes
    lack, or not enough of it): only a changed template or new nodes can change that, so it
    holds no pool."""


@dataclass(frozen=True)
class TimedOut:
    """The job waited past its deadline: fail it and release everything it holds."""

    job: WaitingJob
    message: str


Decision = Admit[P] | Wait | TimedOut


@dataclass(frozen=True)
class OverQuota:
    """What ``try_place`` returns for a job its namespace's quota has no room for: it waits
    without blocking its pool, since the GPUs it cannot use may serve another namespace."""

    reason: str


@dataclass(frozen=True)
class NeverFits:
    """What ``try_place`` returns for a job no node it may go to could hold a worker of, even
    with nothing running there (``reason`` names the resource): it waits, holding no pool."""

    reason: str


def waiting_job(
    job: MPIJob,
    *,
    priority_values: Mapping[str, int],
    pool: str = "",
    fits_when_empty: bool = True,
    nodes: frozenset[str] | None = None,
) -> WaitingJob:
    """The admission view of an MPIJob; PriorityClass values are looked up by the caller.

    The job's priority is the value of the PriorityClass its workers carry (their template's
    ``priorityClassName``): the priority the scheduler gives the pods that take the GPUs, which
    the API server admits only for a class that exists. A name in ``schedulingPolicy`` or the
    launcher that the workers never use ranks nothing, and so does a class ``priority_values``
    (the PriorityClass objects that exist) lacks. Raises ValueError when the job has no creation
    timestamp (it has not been stored).
    """
    created = job.metadata.creation_timestamp
    if created is None:
        raise ValueError(f"MPIJob {job.key} has no creationTimestamp")
    return WaitingJob(
        namespace=job.namespace,
        name=job.name,
        uid=job.metadata.uid,
        created=created,
        priority=priority_values.get(worker_priority_class(job), 0) if priority_values else 0,
        deadline=timeout.admission_deadline(job),
        pool=pool,
        fits_when_empty=fits_when_empty,
        nodes=nodes,
    )


def worker_priority_class(job: MPIJob) -> str:
    """The ``priorityClassName`` of the job's worker template; empty when it names none."""
    worker = job.spec.worker
    name = (worker.template.get("spec") or {}).get("priorityClassName") if worker else None
    return str(name) if name else ""


def admission_order(waiting: Iterable[WaitingJob]) -> list[WaitingJob]:
    """Waiting jobs in admission order: priority, then submission time, then namespace/name."""
    return sorted(waiting, key=_order_key)


def _order_key(job: WaitingJob) -> tuple[int, datetime, str, str]:
    return (-job.priority, job.created, job.namespace, job.name)


def decide(
    waiting: Iterable[WaitingJob],
    try_place: Callable[[WaitingJob, Sequence[P]], P | NoFit | OverQuota | NeverFits],
    *,
    now: datetime,
    fits: Callable[[WaitingJob], bool] | None = None,
) -> list[Decision[P]]:
    """One admission pass: a decision for every waiting job, in admission order.

    A job that does not fit holds the nodes it may go to (:attr:`WaitingJob.nodes`; its whole
    pool when unknown) for itself: no job behind it is placed there. A job behind it that may go
    to other nodes is placed on those (``try_place`` gets it with :attr:`WaitingJob.avoid`
    set); one with no other node waits behind it. ``fits``, when given, says whether a job
    that does not fit now would fit with nothing running (in place of
    :attr:`WaitingJob.fits_when_empty`): asked only of those, which may be few of many.
    """
    decisions: list[Decision[P]] = []
    granted: list[P] = []
    lines: dict[str, _Line] = {}
    for job in admission_order(waiting):
        line = lines.setdefault(job.pool, _Line())
        head = line.blocking(job)
        if head is not None:
            # Another namespace's job is not named: the status is read by this namespace.
            ahead = head.key if head.namespace == job.namespace else "a job of another namespace"
            message = f"queued behind {ahead}, which is ahead in the admission order"
            decisions.append(_unplaced(job, message, now, behind=head))
            continue
        result = try_place(line.avoiding(job), granted)
        if isinstance(result, OverQuota):
            decisions.append(_unplaced(job, result.reason, now, over_quota=True))
            continue
        if isinstance(result, NeverFits):
            decisions.append(_unplaced(job, result.reason, now, unfit=True))
            continue
        if isinstance(result, NoFit):
            decision = _unplaced(job, result.reason, now)
            blocks = fits(job) if fits is not None else job.fits_when_empty
            if isinstance(decision, Wait) and blocks:
                line.hold(job)
            decisions.append(decision)
            continue
        granted.append(result)
        decisions.append(Admit(job, result))
    return decisions


@dataclass
class _Line:
    """One pool's jobs ahead that do not fit yet, and what they hold."""

    anywhere: WaitingJob | None = None
    """The first of them that may go to any node of the pool: it holds the whole pool."""
    holder: dict[str, WaitingJob] = field(default_factory=dict)
    """Node -> the first of them that may go there."""

    def hold(self, job: WaitingJob) -> None:
        if job.nodes is None:
            self.anywhere = self.anywhere or job
            return
        for node in job.nodes:
            self.holder.setdefault(node, job)

    def blocking(self, job: WaitingJob) -> WaitingJob | None:
        """The job ahead that ``job`` waits behind: one that holds the whole pool, or, when
        every node ``job`` may go to is held, the first holding one of them (the earliest in
        the order); None when ``job`` still has a node of its own to try."""
        if self.anywhere is not None:
            return self.anywhere
        if not self.holder or not job.nodes or not job.nodes <= self.holder.keys():
            return None
        ahead = {id(self.holder[n]): self.holder[n] for n in job.nodes}
        return min(ahead.values(), key=_order_key)

    def avoiding(self, job: WaitingJob) -> WaitingJob:
        """``job`` with the nodes it may not take set aside (:attr:`WaitingJob.avoid`)."""
        if not self.holder:
            return job
        nodes = self.holder.keys() if job.nodes is None else job.nodes & self.holder.keys()
        return replace(job, avoid=frozenset(nodes)) if nodes else job


def _unplaced(
    job: WaitingJob,
    message: str,
    now: datetime,
    behind: WaitingJob | None = None,
    *,
    over_quota: bool = False,
    unfit: bool = False,
) -> Wait | TimedOut:
    if job.deadline is not None and now >= job.deadline:
        seconds = int((job.deadline - job.created).total_seconds())
        return TimedOut(
            job,
            f"MPIJob {job.key} was not admitted within scheduleTimeoutSeconds={seconds} "
            f"of its creation: {message}",
        )
    return Wait(job, message, behind, over_quota=over_quota, unfit=unfit)

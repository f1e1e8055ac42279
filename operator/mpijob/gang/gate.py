"""Where a job stands with gang admission, as its reconcile plans it: pure.

The reconcile reads (the job, its PlacementDecision, its pods and claims, the nodes the
decision names, what the admission service knows of the job), then asks here:

- :func:`gate`: whether the job may have pods, where its workers go, the condition and Event
  to show, the deletion of a decision it no longer needs (an action of the plan), and what the
  admission service's line should do with the job (:class:`Line`);
- :func:`check_placement`: whether the placement it holds still holds (a node lost, pinned GPUs
  taken, a worker unschedulable too long), and when time alone may change that; nothing is
  given back while the caches may lack events;
- :func:`place_anew`: the actions that give a placement back: the job's workers and claims
  deleted, the condition saying why, then its decision deleted.

Every write is an action the reconcile applies in order, as :func:`mpijob.desired.sync.plan`'s.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from mpijob import api, keys
from mpijob.api import JSON, JobKey
from mpijob.desired import events, sync
from mpijob.desired.conditions import set_condition
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.desired.status import AdmissionOutcome
from mpijob.gang import kueue, outcome, queue, timeout, topology
from mpijob.placement.job import Placement


class Line(enum.Enum):
    """What the admission service's line does with the job."""

    KEEP = "keep"
    """Nothing changes (the job is not ours to place, or its admission is on its way)."""
    DROP = "drop"
    """It leaves the line: finished, suspended, placed, or held off a while."""
    WANT = "want"
    """It waits in the line for a pass."""


@dataclass(frozen=True)
class Standing:
    """What the admission service knows of a job, read before planning."""

    pending: bool = False
    """Its admission is written and the watch event with the decision is on its way."""
    last: queue.Decision[Placement] | None = None
    """The latest pass's decision about it."""


@dataclass(frozen=True)
class Gate:
    """Where a job stands with our own gang admission, as the plan and the status need it."""

    admitted: bool = True
    placement: list[sync.PodPlacement] | None = None
    decision: topology.Decision | None = None
    """The job's decision, while it holds one."""
    outcome: AdmissionOutcome | None = None
    release: sync.Delete | None = None
    """Deleting the decision the job no longer needs (it finished or was suspended, and its
    pods are gone), after the plan's own actions."""
    recheck: float | None = None
    """Seconds until the job's state changes by time alone (its hold-off ends): sync it then."""
    line: Line = Line.KEEP


def release(
    key: JobKey, job: api.MPIJob | None, body: JSON | None, pods: Sequence[JSON]
) -> sync.Delete | None:
    """The deletion of the job's PlacementDecision ``body``, once :func:`topology.releasable`
    (``job`` None: the job is gone)."""
    if body is None:
        return None
    decision = topology.parse_decision(body)
    if decision is not None and not topology.releasable(decision, key, job, pods):
        return None
    meta = body.get("metadata") or {}
    return sync.Delete(keys.DECISION_API_VERSION, keys.DECISION_KIND, key[1], meta.get("uid"))


def gate(
    key: JobKey,
    job: api.MPIJob,
    *,
    topology_default: bool,
    release_seconds: float,
    decision_body: JSON | None,
    pods: Sequence[JSON],
    nodes: Mapping[str, JSON],
    standing: Standing | None,
    now: datetime,
) -> Gate:
    """A job's admission state. ``standing`` is None when the operator runs no admission of
    its own; ``nodes`` are the nodes the job's decision names, as the cache holds them."""
    gone = release(key, job, decision_body, pods)
    if standing is None or not topology.wants_topology(job, default=topology_default):
        return Gate(release=gone)
    if job.status.finished:
        # Read from the status, which the job's tenant may write: it may only stop the job,
        # never let it have pods without a placement (its workers would bypass the line).
        return Gate(admitted=False, release=gone, line=Line.DROP)
    decision = topology.load_decision(job, decision_body)
    if job.spec.suspended:
        # A suspended job holds no GPUs once its pods are gone; it is placed anew on resume.
        return Gate(admitted=False, release=gone, line=Line.DROP)
    if decision is not None:
        waiting = queue.waiting_job(job, priority_values={})
        states = {n.name: n for n in topology.node_states(nodes.values())}
        return Gate(
            placement=topology.pod_placements(decision, states),
            decision=decision,
            outcome=outcome.outcome(queue.Admit(waiting, decision), now=now),
            line=Line.DROP,
        )
    # A decision under this name that is not this job's (an earlier job of the name, deleted
    # and created again however fast) goes as soon as that job's pods are gone, or this job
    # would wait on it for good: only a deleted job's own sync released it.
    record = topology.parse_decision(decision_body)
    until = timeout.held_off_until(
        job,
        record.released if record is not None else None,
        record.uid if record is not None else "",
        release_seconds,
    )
    if until is not None and now < until:
        # Its placement was released because its workers could not be created or scheduled:
        # it stays out of the line a while, so the jobs behind it get the GPUs. Its condition
        # keeps saying why.
        recheck = (until - now).total_seconds() + 0.5
        return Gate(admitted=False, release=gone, recheck=recheck, line=Line.DROP)
    if standing.pending:
        # Admitted; the watch event with the decision is on its way.
        return Gate(admitted=False, release=gone)
    last = standing.last
    if isinstance(last, queue.TimedOut):
        return Gate(admitted=False, outcome=outcome.outcome(last, now=now), release=gone)
    if last is None:
        waiting = queue.waiting_job(job, priority_values={})
        last = queue.Wait(waiting, "waiting for the next admission pass")
    explained = outcome.outcome(kueue.explain(job, last), now=now)
    return Gate(admitted=False, outcome=explained, release=gone, line=Line.WANT)


@dataclass(frozen=True)
class Replacement:
    """Giving a placement back, as actions: first ``actions`` (the workers and claims), then
    ``status`` written (the condition saying why), then ``release`` (the decision); once the
    decision is deleted, ``event`` is posted."""

    actions: list[sync.Action]
    status: api.MPIJobStatus | None = None
    release: sync.Delete | sync.Replace | None = None
    """The decision deleted, or (workers refused or unschedulable) replaced by the record of
    the job's hold-off (:func:`mpijob.gang.topology.released_object`)."""
    event: events.Event | None = None
    reason: str = ""


def place_anew(
    job: api.MPIJob,
    pods: Sequence[JSON],
    claims: Mapping[str, JSON],
    decision_body: JSON | None,
    why: str,
    reason: str,
    now: datetime,
    gone: Collection[str] = (),
) -> Replacement:
    """The placement no longer holds (a pinned GPU was taken before its claim was allocated, or
    a node under the job was lost): remove the job's workers, their claims and its decision (no
    pod of it runs on GPUs other than those recorded), and let our admission place it again.
    Workers on a deleted node (``gone``) go at once (no kubelet will confirm their end). Said
    once, as a Warning, and as ``GangAdmitted=False`` with the same reason until the job is
    admitted again; the launcher is left to its Job's restart policy and backoff, as upstream
    leaves it.
    """
    actions: list[sync.Action] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(keys.LABEL_JOB_ROLE) == keys.ROLE_WORKER:
            grace = 0 if (pod.get("spec") or {}).get("nodeName") in gone else None
            actions.append(
                sync.Delete("v1", "Pod", str(meta["name"]), meta.get("uid"), grace_seconds=grace)
            )
    for name, claim in claims.items():
        uid = (claim.get("metadata") or {}).get("uid")
        actions.append(sync.Delete(keys.DRA_API_VERSION, "ResourceClaim", name, uid))
    if decision_body is None:
        return Replacement(actions)
    # The condition first: a conflict retries the whole sync while the decision still says why.
    after = job.status.model_copy(deep=True)
    changed = set_condition(after, keys.COND_GANG_ADMITTED, "False", reason, why, now)
    uid = (decision_body.get("metadata") or {}).get("uid")
    give_back: sync.Delete | sync.Replace = sync.Delete(
        keys.DECISION_API_VERSION, keys.DECISION_KIND, job.name, uid
    )
    if reason in timeout.RELEASED:
        # Kept, holding nothing, as the record of the job's hold-off (the status is the
        # tenant's to write and cannot be that record).
        give_back = sync.Replace(topology.released_object(decision_body, reason, why, now))
    return Replacement(
        actions,
        status=after if changed else None,
        release=give_back,
        event=events.warning(reason, why),
        reason=reason,
    )


@dataclass(frozen=True)
class Check:
    """Whether a held placement still holds: the reason and message to give it back with, and
    the seconds after which time alone may change the answer (sync the job then)."""

    reason: str = ""
    why: str = ""
    gone: frozenset[str] = frozenset()
    """Nodes under the job that were deleted."""
    rechecks: list[float] = field(default_factory=list)
    withheld: str = ""
    """Why the placement would be given back, had the caches been complete: nothing is torn
    down on a view that may be partial (see :func:`check_placement`)."""


#: How soon a job whose placement was not given back on a partial view is looked at again: an
#: informer lists again within a second of its API server's return.
CATCH_UP_SECONDS = 1.0


def check_placement(
    key: JobKey,
    job: api.MPIJob,
    g: Gate,
    pods: Sequence[JSON],
    claims: Mapping[str, JSON],
    nodes: Mapping[str, JSON | None],
    binding: GpuBinding,
    release_seconds: float,
    now: datetime,
    health: topology.PoolHealth | None = None,
    complete: bool = True,
) -> Check:
    """Whether the job's placement no longer holds: a node lost (``nodes``: each node the
    decision names, None when deleted; ``health``: the pool's, see
    :func:`~mpijob.gang.topology.lost_nodes`), pinned GPUs taken (dra binding), a worker
    unschedulable too long.

    Giving a placement back deletes the job's running workers, and every answer here rests on
    what the caches lack (a worker, a node, a claim's allocation). While they may lack events
    (``complete`` False: an informer lost its watch and has not listed again since, as after
    the API server's restart) the answer is withheld, and the job looked at again
    :data:`CATCH_UP_SECONDS` later; the plan still creates what is missing."""
    health = health or topology.PoolHealth()
    check = _check(key, job, g, pods, claims, nodes, binding, release_seconds, now, health)
    if check.why and not complete:
        return Check(rechecks=[*check.rechecks, CATCH_UP_SECONDS], withheld=check.why)
    return check


def _check(
    key: JobKey,
    job: api.MPIJob,
    g: Gate,
    pods: Sequence[JSON],
    claims: Mapping[str, JSON],
    nodes: Mapping[str, JSON | None],
    binding: GpuBinding,
    release_seconds: float,
    now: datetime,
    health: topology.PoolHealth,
) -> Check:
    rechecks: list[float] = []
    if g.decision is not None:
        lost = topology.lost_nodes(g.decision, job, nodes, pods, now, health)
        if lost.message:
            gone = frozenset(name for name, node in nodes.items() if node is None)
            return Check(keys.REASON_NODE_LOST, lost.message, gone)
        if lost.recheck is not None:
            rechecks.append(lost.recheck + 0.5)
    if g.placement is not None and binding is GpuBinding.DRA:
        taken = topology.gpus_taken(pods, claims, now)
        if taken.message:
            return Check(keys.REASON_GPUS_TAKEN, taken.message)
        if taken.recheck is not None:
            rechecks.append(taken.recheck + 0.5)
    if g.decision is not None:
        stuck = topology.unschedulable_workers(g.decision, key, pods, now, release_seconds)
        if stuck.message:
            return Check(keys.REASON_WORKERS_UNSCHEDULABLE, stuck.message, rechecks=rechecks)
        if stuck.recheck is not None:
            rechecks.append(stuck.recheck + 0.5)
    if g.recheck is not None:
        rechecks.append(g.recheck)
    return Check(rechecks=rechecks)


def refused_worker(action: sync.Action, status: int) -> str:
    """The worker pod ``action`` created, if the API server refused it for good as it stands
    (``status``): a quota (403), a template it finds invalid (400, 422); empty otherwise. Not a
    conflict, a rate limit or the server's own trouble, which a retry may get past."""
    if not isinstance(action, sync.Create) or action.obj.get("kind") != "Pod":
        return ""
    meta = action.obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(keys.LABEL_JOB_ROLE) != keys.ROLE_WORKER:
        return ""
    return str(meta.get("name") or "") if status in (400, 403, 422) else ""


DEVICE_PLUGIN_PICKS = (
    "GPU binding is annotations: the workers carry the GPUs placement chose "
    f"({keys.GPU_IDS}) and a node affinity, but the device plugin, not the operator, picks "
    "which GPUs of the node each container gets (NVIDIA's DRA driver and --gpu-binding=dra "
    "enforce the choice)"
)


def binding_events(g: Gate, binding: GpuBinding, posted: list[events.Event]) -> list[events.Event]:
    """Once per admission, in the annotations binding: the choice is not enforced."""
    if g.placement is None or binding is not GpuBinding.ANNOTATIONS:
        return []
    if not any(e.reason == keys.REASON_GANG_ADMITTED for e in posted):
        return []
    return [events.normal(keys.REASON_DEVICE_PLUGIN_PICKS, DEVICE_PLUGIN_PICKS)]

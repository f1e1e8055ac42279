"""The level-based reconcile of one MPIJob: observe, plan and compute status (pure), apply, write.

Called by the workers with a job key. The steps before planning mirror upstream's
``syncHandler``: a missing job ends the reconcile; a job managed by another controller is left
alone (checked before validation, as upstream); a terminating job is left to garbage collection;
an invalid job gets upstream's ``ValidationError`` Warning plus an ``Invalid`` condition naming
the fields, and is not retried until it changes. Beyond upstream's rules, a job whose hostfile
could not be stored (the API server's ConfigMap limit) is invalid too, rather than retried
forever against a 413, and so is a topology-placed worker template naming its own node.

Every read happens first (the caches, our admission's latest decision); then
:func:`mpijob.desired.sync.plan` and :func:`mpijob.desired.status.next_status` decide, and
:func:`_apply` dispatches the plan's actions in order, stopping at the first failure. The status
is written last, only when it changed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from mpijob import api, keys, metrics
from mpijob.api import JSON, JobKey
from mpijob.api.errors import FieldError
from mpijob.api.fabric import fabric_level
from mpijob.api.models import format_time
from mpijob.desired import binding, config_map, events, names, podgroup, status, sync
from mpijob.desired.conditions import set_condition
from mpijob.desired.gang_mode import GangMode
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.desired.status import AdmissionOutcome, Counter
from mpijob.gang import kueue, outcome, queue, timeout, topology
from mpijob.handlers.runtime import Runtime
from mpijob.placement.fabric import Fabric
from mpijob.platform.kube import ApiError
from mpijob.platform.workers import OwnershipError
from mpijob.settings import OperatorSettings

log = logging.getLogger(__name__)

COUNTERS = {
    Counter.CREATED: metrics.JOBS_CREATED,
    Counter.SUCCESSFUL: metrics.JOBS_SUCCESSFUL,
    Counter.FAILED: metrics.JOBS_FAILED,
}


async def reconcile(rt: Runtime, key: JobKey) -> None:
    body = rt.cache.job_body(key)
    if body is None:
        rt.forget(key)
        await _release_orphan(rt, key)
        return
    meta = body.get("metadata") or {}
    owner = api.managed_by(body)
    if owner and owner not in rt.settings.controller_names:
        return
    if meta.get("deletionTimestamp"):
        return
    fabric = rt.admission.fabric if rt.admission is not None else None
    job, errors = checked(body, rt.settings, fabric)
    if job is None or errors:
        await _report_invalid(rt, key, body, api.validation_message(errors))
        return

    # Events a kill or an outage lost before this process: posted again, once per job.
    rt.recorder.ensure(body, lambda: events.implied_by(job))
    gang = GangMode.from_flag(rt.settings.gang_scheduling)
    now = datetime.now(UTC)
    gate = _admission(rt, key, job, now)
    seen = rt.cache.observe(key, job)
    if await _placement_gone(rt, key, job, body, seen, gate, now):
        return
    options = sync.Options(
        cluster_domain=rt.settings.cluster_domain,
        gang=gang,
        priority_values=rt.cache.priority_values() if gang.enabled else {},
        admitted=gate.admitted,
        placement=gate.placement,
        gpu_binding=rt.gpu_binding,
    )
    plan = sync.plan(job, seen, now, options)
    if await _read_secret(rt, key, job, plan.actions, seen.pods):
        plan = sync.plan(job, rt.cache.observe(key, job), now, options)
    if gate.release is not None:
        plan.actions.append(gate.release)
    result = status.next_status(job, plan.projected, now, admission=gate.outcome)

    if not await _apply_all(rt, key, job, body, plan.actions, gate):
        return
    if plan.requeue_after is not None:
        rt.workers.enqueue_after(key, plan.requeue_after)
    if result.changed:
        await _write_status(rt, key, body, result.status.to_body())
        if result.status.finished != job.status.finished:
            # The watch event of our own status write asks for no sync (see watches), but a job
            # that has just finished needs one more: its cleanup and release read the status.
            rt.workers.enqueue(key)
    if result.launcher_seen:
        metrics.JOB_INFO.labels(launcher=names.launcher_name(job), namespace=job.namespace).set(1)
    _observe(rt, key, job, result.status, seen, now)
    for event in [*result.events, *plan.events, *_binding_events(rt, gate, result.events)]:
        rt.recorder.post(body, event)
    for counter in result.counters:
        COUNTERS[counter].inc()


async def _placement_gone(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    body: JSON,
    seen: sync.Observed,
    gate: Gate,
    now: datetime,
) -> bool:
    """Whether the job's placement no longer holds (a node lost, pinned GPUs taken, a worker
    unschedulable too long) and was given back; re-queues the job for what time alone changes."""
    if gate.decision is not None:
        lost, gone = await _lost_nodes(rt, key, job, gate.decision)
        if lost:
            await _place_anew(rt, key, job, body, seen, lost, keys.REASON_NODE_LOST, gone)
            return True
    if gate.placement is not None and rt.gpu_binding is GpuBinding.DRA:
        taken = topology.gpus_taken(seen.pods, seen.claims, now)
        if taken.message:
            await _place_anew(rt, key, job, body, seen, taken.message, keys.REASON_GPUS_TAKEN)
            return True
        if taken.recheck is not None:
            rt.workers.enqueue_after(key, taken.recheck + 0.5)
    if gate.decision is not None:
        release_after = rt.settings.placement_release_seconds
        stuck = topology.unschedulable_workers(gate.decision, key[1], seen.pods, now, release_after)
        if stuck.message:
            await _place_anew(
                rt, key, job, body, seen, stuck.message, keys.REASON_WORKERS_UNSCHEDULABLE
            )
            return True
        if stuck.recheck is not None:
            rt.workers.enqueue_after(key, stuck.recheck + 0.5)
    if gate.recheck is not None:
        rt.workers.enqueue_after(key, gate.recheck)
    return False


def checked(
    body: JSON, settings: OperatorSettings, fabric: Fabric | None = None
) -> tuple[api.MPIJob | None, list[FieldError]]:
    """The defaulted job and every reason the operator refuses it: upstream's rules, then ours
    (quantities a PodGroup needs, the hostfile's size, placed workers naming their node, and
    with a ``--fabric`` its fabric level annotations naming levels the fabric has)."""
    try:
        job = api.with_defaults(api.parse(body))
    except api.InvalidMPIJob as exc:
        return None, list(exc.errors)
    return job, [
        *api.validate(job),
        *podgroup.min_resources_errors(job),
        *config_map.size_errors(job, settings.cluster_domain),
        *topology.template_errors(job, default=settings.gpu_topology_default),
        *(fabric_level(job.metadata.annotations or {}, fabric.level_names)[1] if fabric else ()),
    ]


# --- actions -------------------------------------------------------------------------------------


def _needs_secret(action: sync.Action) -> bool:
    """Whether ``action`` writes the SSH Secret or creates what mounts it (a pod, the launcher)."""
    match action:
        case sync.Create(obj=obj) | sync.Replace(obj=obj):
            return obj.get("kind") in ("Secret", "Pod", "Job")
    return False


async def _read_secret(
    rt: Runtime, key: JobKey, job: api.MPIJob, actions: list[sync.Action], pods: Sequence[JSON]
) -> bool:
    """Read the job's SSH Secret from the API server while it is needed; whether it did (then
    the plan is made again from what it read).

    Secrets are not watched (see :mod:`mpijob.handlers.cache`), so the operator's memory of one
    may be stale. It is read before the plan writes it or creates what mounts it, and while a
    pod of the job is Pending (a launcher pod the Job controller made again waits there for a
    Secret deleted by hand), so a deleted Secret is made again when a pod needs it, and one that
    exists is never made twice after a restart. A job whose pods all run reads none."""
    pending = any((p.get("status") or {}).get("phase", "Pending") == "Pending" for p in pods)
    if not pending and not any(_needs_secret(a) for a in actions):
        return False
    secret = await rt.kube.get("v1", "Secret", job.namespace, names.ssh_secret_name(job))
    rt.cache.saw_secret(key, secret)
    return True


async def _apply(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    body: JSON,
    action: sync.Action,
    versions: dict[tuple[str, str], str],
) -> None:
    """Run one action. ``versions`` holds the resourceVersions this plan's own writes returned,
    so a Replace after a Patch of the same object (resume: clear startTime, then unsuspend)
    sends the version the Patch produced, as upstream's UpdateStatus-then-Update does."""
    match action:
        case sync.Create(obj=obj):
            await _create(rt, key, job, body, obj)
        case sync.Patch(deferrable=True, api_version=version, kind=kind, name=name, patch=patch):
            rt.deferred.patch(version, kind, job.namespace, name, patch)
        case sync.Patch(api_version=version, kind=kind, name=name, patch=patch, subresource=sub):
            out = await rt.kube.patch(version, kind, job.namespace, name, patch, subresource=sub)
            versions[(kind, name)] = (out.get("metadata") or {}).get("resourceVersion", "")
        case sync.Replace(obj=obj):
            meta = obj["metadata"]
            fresher = versions.get((obj["kind"], meta["name"]))
            if fresher:
                obj = {**obj, "metadata": {**meta, "resourceVersion": fresher}}
            replaced = await rt.kube.replace(obj)
            if obj["kind"] == "Secret":
                rt.cache.saw_secret(key, replaced)
        case sync.Delete(api_version=version, kind=kind, name=name, uid=uid):
            await rt.kube.delete(version, kind, job.namespace, name, uid=uid)


async def _apply_all(
    rt: Runtime, key: JobKey, job: api.MPIJob, body: JSON, actions: list[sync.Action], gate: Gate
) -> bool:
    """Run the plan's actions in order; False when a refused worker gave the placement back
    (the sync ends there)."""
    versions: dict[tuple[str, str], str] = {}
    for action in actions:
        try:
            await _apply(rt, key, job, body, action, versions)
        except ApiError as e:
            refused = _refused_worker(action, e)
            if gate.decision is None or not refused:
                raise
            # Its GPUs must not stay reserved for pods that cannot exist: give them back, with
            # the workers created so far (observed again: this sync's creations included).
            why = (
                f"the API server refused worker pod {refused}: "
                f"{e.message}; its placement is released and the job is queued again in "
                f"{int(rt.settings.placement_release_seconds)}s"
            )
            again = rt.cache.observe(key, job)
            await _place_anew(rt, key, job, body, again, why, keys.REASON_WORKERS_REFUSED)
            return False
    return True


def _refused_worker(action: sync.Action, e: ApiError) -> str:
    """The worker pod ``action`` created, if the API server refused it for good as it stands: a
    quota (403), a template it finds invalid (400, 422); empty otherwise. Not a conflict, a rate
    limit or the server's own trouble, which a retry may get past."""
    if not isinstance(action, sync.Create) or action.obj.get("kind") != "Pod":
        return ""
    meta = action.obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(keys.LABEL_JOB_ROLE) != keys.ROLE_WORKER:
        return ""
    return str(meta.get("name") or "") if e.status in (400, 403, 422) else ""


async def _create(rt: Runtime, key: JobKey, job: api.MPIJob, body: JSON, obj: JSON) -> None:
    """Create ``obj``; if its name is taken, it must be the job's own (not yet seen) child.

    A same-named object the job does not control is never touched: upstream's
    ``ErrResourceExists`` Warning, and the reconcile fails (and retries).
    """
    try:
        created = await rt.kube.create(obj)
    except ApiError as e:
        if not e.conflict:
            if obj["kind"] in ("Pod", "Job"):
                what = "worker pod" if obj["kind"] == "Pod" else "launcher pod"
                rt.recorder.post(
                    body, events.warning(keys.REASON_FAILED, f"{what} created failed: {e.message}")
                )
            raise
        meta = obj["metadata"]
        live = await rt.kube.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None:
            raise  # deleted meanwhile: retry from a fresh observation
        if not names.is_controlled_by(live, job.metadata.uid):
            message = (
                f'Resource "{meta["name"]}" of Kind "{obj["kind"]}" already exists '
                "and is not managed by MPIJob"
            )
            rt.recorder.post(body, events.warning(keys.REASON_RESOURCE_EXISTS, message))
            raise OwnershipError(message) from None
        created = live
    if obj["kind"] == "Secret":
        rt.cache.saw_secret(key, created)  # not watched: no event will tell the cache
        return
    rt.cache.expect(key, {**created, "apiVersion": obj["apiVersion"], "kind": obj["kind"]})


# --- admission ----------------------------------------------------------------------------------


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


def _release(rt: Runtime, key: JobKey, job: api.MPIJob | None) -> sync.Delete | None:
    """The deletion of the job's PlacementDecision, once :func:`topology.releasable`."""
    body = rt.cache.decision(key)
    decision = topology.parse_decision(body)
    if body is None:
        return None
    if decision is not None and not topology.releasable(decision, key[1], job, rt.cache.pods(key)):
        return None
    meta = body.get("metadata") or {}
    return sync.Delete(keys.DECISION_API_VERSION, keys.DECISION_KIND, key[1], meta.get("uid"))


async def _release_orphan(rt: Runtime, key: JobKey) -> None:
    """A deleted job's decision goes once its pods are gone (each pod event re-queues)."""
    release = _release(rt, key, None)
    if release is not None:
        await rt.kube.delete(
            release.api_version, release.kind, key[0], release.name, uid=release.uid
        )


def _admission(rt: Runtime, key: JobKey, job: api.MPIJob, now: datetime) -> Gate:
    """A topology job's admission state; reads only (the release is a planned action)."""
    if rt.admission is None or not topology.wants_topology(
        job, default=rt.settings.gpu_topology_default
    ):
        return Gate(release=_release(rt, key, job))
    if job.status.finished:
        rt.admission.drop(key)
        return Gate(release=_release(rt, key, job))
    decision = topology.load_decision(job, rt.cache.decision(key))
    if job.spec.suspended:
        rt.admission.drop(key)
        # A suspended job holds no GPUs once its pods are gone; it is placed anew on resume.
        return Gate(admitted=False, release=_release(rt, key, job))
    if decision is not None:
        rt.admission.drop(key)
        waiting = queue.waiting_job(job, priority_values={})
        nodes = rt.cache.nodes({a.node for a in decision.assignments})
        states = {n.name: n for n in topology.node_states(nodes.values())}
        return Gate(
            placement=topology.pod_placements(decision, states),
            decision=decision,
            outcome=outcome.outcome(queue.Admit(waiting, decision), now=now),
        )
    # A decision under this name that is not this job's (an earlier job of the name, deleted
    # and created again however fast) goes as soon as that job's pods are gone, or this job
    # would wait on it for good: only a deleted job's own sync released it.
    release = _release(rt, key, job)
    until = timeout.held_off_until(job, rt.settings.placement_release_seconds)
    if until is not None and now < until:
        # Its placement was released because its workers could not be created or scheduled:
        # it stays out of the line a while, so the jobs behind it get the GPUs. Its condition
        # keeps saying why.
        rt.admission.drop(key)
        return Gate(admitted=False, release=release, recheck=(until - now).total_seconds() + 0.5)
    if rt.admission.pending(key):
        # Admitted; the watch event with the decision is on its way.
        return Gate(admitted=False, release=release)
    last = rt.admission.decision(key)
    if isinstance(last, queue.TimedOut):
        return Gate(admitted=False, outcome=outcome.outcome(last, now=now), release=release)
    rt.admission.want(key, job)
    if last is None:
        waiting = queue.waiting_job(job, priority_values={})
        last = queue.Wait(waiting, "waiting for the next admission pass")
    explained = outcome.outcome(kueue.explain(job, last), now=now)
    return Gate(admitted=False, outcome=explained, release=release)


DEVICE_PLUGIN_PICKS = (
    "GPU binding is annotations: the workers carry the GPUs placement chose "
    f"({keys.GPU_IDS}) and a node affinity, but the device plugin, not the operator, picks "
    "which GPUs of the node each container gets (NVIDIA's DRA driver and --gpu-binding=dra "
    "enforce the choice)"
)


def _binding_events(rt: Runtime, gate: Gate, posted: list[events.Event]) -> list[events.Event]:
    """Once per admission, in the annotations binding: the choice is not enforced."""
    if gate.placement is None or rt.gpu_binding is not GpuBinding.ANNOTATIONS:
        return []
    if not any(e.reason == keys.REASON_GANG_ADMITTED for e in posted):
        return []
    return [events.normal(keys.REASON_DEVICE_PLUGIN_PICKS, DEVICE_PLUGIN_PICKS)]


async def _lost_nodes(
    rt: Runtime, key: JobKey, job: api.MPIJob, decision: topology.Decision
) -> tuple[str, set[str]]:
    """Why the job's nodes make it be placed anew (see :func:`topology.lost_nodes`), and which
    of them were deleted. A node absent from the watched pool is read: deleted, or only no
    longer opted in (one GET, only while a placed job names such a node)."""
    wanted = {a.node for a in decision.assignments}
    nodes: dict[str, JSON | None] = dict(rt.cache.nodes(wanted))
    for name in sorted(wanted - nodes.keys()):
        nodes[name] = await rt.kube.get("v1", "Node", None, name)
    why = topology.lost_nodes(decision, job, nodes, rt.cache.pods(key))
    return why, {name for name, node in nodes.items() if node is None}


async def _place_anew(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    body: JSON,
    seen: sync.Observed,
    why: str,
    reason: str,
    gone: Collection[str] = (),
) -> None:
    """The placement no longer holds (a pinned GPU was taken before its claim was allocated, or
    a node under the job was lost): remove the job's workers, their claims and its decision (no
    pod of it runs on GPUs other than those recorded), and let our admission place it again.
    Workers on a deleted node go at once (no kubelet will confirm their end). Said once, as a
    Warning, and as ``GangAdmitted=False`` with the same reason until the job is admitted
    again; the launcher is left to its Job's restart policy and backoff, as upstream leaves it.
    """
    for pod in seen.pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(keys.LABEL_JOB_ROLE) == keys.ROLE_WORKER:
            grace = 0 if (pod.get("spec") or {}).get("nodeName") in gone else None
            await rt.kube.delete(
                "v1",
                "Pod",
                job.namespace,
                str(meta["name"]),
                uid=meta.get("uid"),
                grace_seconds=grace,
            )
    for name, claim in seen.claims.items():
        uid = (claim.get("metadata") or {}).get("uid")
        await rt.kube.delete(keys.DRA_API_VERSION, "ResourceClaim", job.namespace, name, uid=uid)
    decision = rt.cache.decision(key)
    if decision is None:
        return
    # The condition first: a conflict retries the whole sync while the decision still says why.
    after = job.status.model_copy(deep=True)
    if set_condition(after, keys.COND_GANG_ADMITTED, "False", reason, why, datetime.now(UTC)):
        await _write_status(rt, key, body, after.to_body())
    uid = (decision.get("metadata") or {}).get("uid")
    if not await rt.kube.delete(
        keys.DECISION_API_VERSION, keys.DECISION_KIND, job.namespace, job.name, uid=uid
    ):
        return  # placed anew already: the cache had not seen the decision go
    log.warning("MPIJob %s/%s: %s", *key, why)
    if reason == keys.REASON_GPUS_TAKEN:
        metrics.PLACEMENTS_NOT_HONOURED.labels(binding=GpuBinding.DRA.value).inc()
    rt.recorder.post(body, events.warning(reason, why))


def _observe(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    after: api.MPIJobStatus,
    seen: sync.Observed,
    now: datetime,
) -> None:
    """Job-level histograms and gauges, fed on transitions only."""
    created = job.metadata.creation_timestamp
    running = after.is_true(keys.COND_RUNNING)
    if running and not job.status.is_true(keys.COND_RUNNING) and created is not None:
        metrics.TIME_TO_RUNNING.observe((now - created).total_seconds())
    if after.finished and not job.status.finished and after.start_time and after.completion_time:
        metrics.JOB_DURATION.observe((after.completion_time - after.start_time).total_seconds())
    rt.job_metrics.set_running(key, running)
    if key not in rt.job_metrics.bound and created is not None:
        expected = job.spec.worker_replicas + 1
        seconds = binding.seconds_to_bind(created, seen.pods, expected)
        if seconds is not None:
            metrics.GANG_BIND_SECONDS.observe(seconds)
            rt.job_metrics.bound.add(key)


# --- status --------------------------------------------------------------------------------------


async def _write_status(rt: Runtime, key: JobKey, body: JSON, new_status: JSON) -> None:
    """Replace the status (PUT, with the resourceVersion read: a conflict means re-reconcile).

    ``lastReconcileTime`` (which upstream never sets) is stamped on each write only: the time the
    operator last changed the status, without a write per sync just to move a clock.
    """
    stamp = format_time(datetime.now(UTC))
    update = {**body, "status": {**new_status, "lastReconcileTime": stamp}}
    fresh = await rt.kube.replace_status(update)
    rt.cache.wrote_status(key, body["metadata"]["resourceVersion"], fresh)


async def _report_invalid(rt: Runtime, key: JobKey, body: JSON, message: str) -> None:
    """Upstream's Warning, plus a condition so ``kubectl describe`` shows what to fix.

    A spec that does not parse has no model; its status still does (an unreadable status,
    which only someone else can have written, is replaced).
    """
    try:
        current = api.MPIJobStatus.model_validate(body.get("status") or {})
    except ValueError:
        current = api.MPIJobStatus()
    result = status.mark_invalid(current, message, datetime.now(UTC))
    if not result.changed:
        return  # already reported for this spec
    for event in result.events:
        rt.recorder.post(body, event)
    try:
        await _write_status(rt, key, body, result.status.to_body())
    except ApiError as e:
        log.warning("Could not record the validation error in the status: %s", e)

"""The level-based reconcile of one MPIJob: observe, plan and compute status (pure), apply, write.

Called by the workers with a job key. The steps before planning mirror upstream's
``syncHandler``: a missing job ends the reconcile; a job managed by another controller is left
alone (checked before validation, as upstream); a terminating job is left to garbage collection;
an invalid job gets upstream's ``ValidationError`` Warning plus an ``Invalid`` condition naming
the fields, and is not retried until it changes. Beyond upstream's rules, a job whose hostfile
could not be stored (the API server's ConfigMap limit) is invalid too, rather than retried
forever against a 413, and so is a topology-placed worker template naming its own node.

Every read happens first (the caches, our admission's latest decision, the nodes a placed job's
decision names); then :mod:`mpijob.gang.gate` (where the job stands with gang admission, whether
its placement still holds), :func:`mpijob.desired.sync.plan` and
:func:`mpijob.desired.status.next_status` decide, and :func:`_apply` dispatches the actions in
order, stopping at the first failure: the plan's, with the release of a decision no longer
needed, or the giving back of a placement that no longer holds. The status is written last,
only when it changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from mpijob import api, keys, metrics
from mpijob.api import JSON, JobKey
from mpijob.api.errors import FieldError
from mpijob.api.fabric import fabric_level
from mpijob.api.launch import launch_errors
from mpijob.api.models import format_time
from mpijob.desired import binding, config_map, events, names, observed, podgroup, status, sync
from mpijob.desired.gang_mode import GangKind, GangMode
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.desired.life import ENDS, Life, News, Transition
from mpijob.gang import gate as admission_gate
from mpijob.gang import native as native_gang
from mpijob.gang import topology
from mpijob.handlers.runtime import Runtime
from mpijob.objects import about
from mpijob.placement.fabric import Fabric
from mpijob.platform.kube import ApiError, NameTaken, NotFound, create_or_adopt
from mpijob.platform.workers import OwnershipError
from mpijob.settings import OperatorSettings

log = logging.getLogger(__name__)

#: How often a job's Secret (SSH or launch keys) is read while its pods are Pending and the
#: sync creates nothing that mounts it (see :func:`_read_secret`): a Secret deleted by hand
#: meanwhile is made again at the first sync after this long.
PENDING_SECRET_READ_SECONDS = 15.0

#: Upstream's counters, by the step of a job's life each counts (once per job).
COUNTERS = {
    Transition.CREATED: metrics.JOBS_CREATED,
    Transition.SUCCEEDED: metrics.JOBS_SUCCESSFUL,
    Transition.FAILED: metrics.JOBS_FAILED,
}


async def reconcile(rt: Runtime, key: JobKey) -> None:
    body = rt.cache.job_body(key)
    if body is None:
        rt.forget(key)
        # A deleted job's decision goes once its pods are gone (each pod event re-queues).
        release = admission_gate.release(key, None, rt.cache.decision(key), rt.cache.pods(key))
        if release is not None:
            await _apply(rt, key, None, {}, release, {})
        return
    meta = body.get("metadata") or {}
    owner = api.managed_by(body)
    if owner and owner not in rt.settings.controller_names:
        return
    if meta.get("deletionTimestamp"):
        return
    fabric = rt.admission.fabric if rt.admission is not None else None
    job, errors = rt.cache.check(key, body, lambda b: checked(b, rt.settings, fabric))
    if job is None or errors:
        await _report_invalid(rt, key, body, api.validation_message(errors))
        return

    gang = GangMode.from_flag(rt.settings.gang_scheduling)
    now = rt.cache.clock.now()
    gate = _admission(rt, key, job, now)
    seen = rt.cache.observe(key, job)
    # Made from what the children show when this process first sees the job: a restart counts
    # nothing the job did before it.
    life = rt.lives.of(key, job, seen)
    check = await _check_placement(rt, key, job, gate, seen, now)
    if check.why:
        # The placement no longer holds: given back, as actions, and the sync ends there.
        decision = rt.cache.decision(key)
        replacement = admission_gate.place_anew(
            job, seen.pods, seen.claims, decision, check.why, check.reason, now, check.gone
        )
        await _replace(rt, key, job, body, replacement)
        return
    members = observed.gang_members(job, seen.pods, seen.launcher_job)
    options = sync.Options(
        cluster_domain=rt.settings.cluster_domain,
        gang=gang,
        priority_values=rt.cache.priority_values() if gang.enabled else {},
        gang_topology_key=(
            native_gang.topology_key(job, fabric)
            if gang.kind is GangKind.WORKLOAD_API
            and not topology.wants_topology(job, default=rt.settings.gpu_topology_default)
            else ""  # a topology job's pods are pinned where our placement chose
        ),
        gang_expired=(
            gang.kind is GangKind.WORKLOAD_API
            and native_gang.expired(job, seen.pod_group, members, now)
        ),
        admitted=gate.admitted,
        placement=gate.placement,
        gpu_binding=rt.gpu_binding,
        launch_image=rt.settings.launch_image,
    )
    plan = sync.plan(job, seen, now, options)
    if await _read_secret(rt, key, job, plan.actions, seen.pods):
        plan = sync.plan(job, rt.cache.observe(key, job), now, options)
    if gate.release is not None:
        plan.actions.append(gate.release)
    native = (
        native_gang.gang_state(job, seen.pod_group, members, now)
        if gang.kind is GangKind.WORKLOAD_API and gate.admitted
        else native_gang.GangState(None)  # held back by our admission: its condition says so
    )
    result = status.next_status(
        job, plan.projected, now, admission=gate.outcome, gang=native.outcome
    )
    # Counted and posted once per job, whatever its status says (its tenant may rewrite it).
    news = life.news(result.steps, result.worker_failures)
    # Events a kill or an outage lost before this process, once per job: those its status says
    # were posted, and those of what it did before this process saw it (posted if missing).
    rt.recorder.ensure(body, lambda: [*events.implied_by(job), *news.known])

    if not await _apply_all(rt, key, job, body, plan.actions, gate):
        return
    for after in (plan.requeue_after, native.requeue_after):
        if after is not None:
            rt.workers.enqueue_after(key, after)
    if result.changed:
        try:
            await _write_status(rt, key, body, result.status.to_body())
        except NotFound:
            # Deleted while this sync ran (the cache had not heard yet): nothing is left to
            # report on, and the deletion's own event queues the sync that releases its GPUs.
            log.debug("MPIJob %s/%s was deleted during its sync", *key)
            return
        if result.status.finished != job.status.finished:
            # The watch event of our own status write asks for no sync (see watches), but a job
            # that has just finished needs one more: its cleanup and release read the status.
            rt.workers.enqueue(key)
    if result.launcher_seen:
        metrics.JOB_INFO.labels(launcher=names.launcher_name(job), namespace=job.namespace).set(1)
    _observe(rt, key, job, result.status, seen, now, result.gpus_held, news)
    binding_events = admission_gate.binding_events(gate, rt.gpu_binding, result.events)
    _announce(rt, body, life, news, [*result.events, *plan.events, *binding_events])


def _announce(rt: Runtime, body: JSON, life: Life, news: News, others: list[events.Event]) -> None:
    """Post the sync's Events: the new steps' and worker failures' first, then ``others``;
    count what ``news`` announces, and record it in the job's ``life``."""
    for event in [*news.events, *others]:
        rt.recorder.post(body, event)
    for step in news.steps:
        if step.transition in COUNTERS:
            COUNTERS[step.transition].inc()
    for reason in news.failure_reasons:
        metrics.JOB_FAILURES.labels(reason=status.failure_label(reason)).inc()
    life.announced(news)


def checked(
    body: JSON, settings: OperatorSettings, fabric: Fabric | None = None
) -> tuple[api.MPIJob | None, list[FieldError]]:
    """The defaulted job and every reason the operator refuses it: upstream's rules, then ours
    (quantities a PodGroup needs, the hostfile's size, placed workers naming their node, with a
    ``--fabric`` its fabric level annotations naming levels the fabric has, and its launch)."""
    try:
        job = api.with_defaults(api.parse(body), clean_pod_policy=settings.default_clean_pod_policy)
    except api.InvalidMPIJob as exc:
        return None, list(exc.errors)
    return job, [
        *api.validate(job),
        *podgroup.min_resources_errors(job),
        *config_map.size_errors(job, settings.cluster_domain),
        *topology.template_errors(job, default=settings.gpu_topology_default),
        *(fabric_level(job.metadata.annotations or {}, fabric.level_names)[1] if fabric else ()),
        *launch_errors(job.metadata.annotations or {}, settings.launch_image),
    ]


# --- actions -------------------------------------------------------------------------------------


def _needs_secret(action: sync.Action) -> bool:
    """Whether ``action`` writes the job's Secret or creates what mounts it (a pod, the
    launcher)."""
    match action:
        case sync.Create(obj=obj) | sync.Replace(obj=obj):
            return obj.get("kind") in ("Secret", "Pod", "Job")
    return False


def _creates_secret(action: sync.Action) -> bool:
    return isinstance(action, sync.Create) and action.obj.get("kind") == "Secret"


async def _read_secret(
    rt: Runtime, key: JobKey, job: api.MPIJob, actions: list[sync.Action], pods: Sequence[JSON]
) -> bool:
    """Read the job's Secret (SSH or launch keys) from the API server while it is needed;
    whether it did (then the plan is made again from what it read).

    Secrets are not watched (see :mod:`mpijob.handlers.cache`), so the operator's memory of one
    may be stale. It is read before the plan writes it or creates what mounts it, and while a
    pod of the job is Pending (a launcher pod the Job controller made again waits there for a
    Secret deleted by hand), so a deleted Secret is made again when a pod needs it, and one that
    exists is never made twice after a restart. A job whose pods all run reads none. While
    pods are only Pending, it is read at most every :data:`PENDING_SECRET_READ_SECONDS`: every
    event of a new job's pods asks for a sync while they start, and each read one then found
    what this process had just written.

    Not read when this process has never seen the job's Secret and the plan creates it (a new
    job, or the first sync after a restart): the create is the read then, since a name already
    taken is read and checked for ownership (:func:`_create`). A new job's first sync then
    costs no GET, as it costs upstream none (it reads Secrets from an informer)."""
    if not rt.cache.knows_secret(key) and any(_creates_secret(a) for a in actions):
        return False
    if not any(_needs_secret(a) for a in actions):
        if rt.cache.secret_age(key) < PENDING_SECRET_READ_SECONDS:
            return False
        if not any((p.get("status") or {}).get("phase", "Pending") == "Pending" for p in pods):
            return False
    secret = await rt.kube.get("v1", "Secret", job.namespace, names.secret_name(job))
    rt.cache.saw_secret(key, secret)
    return True


async def _apply(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob | None,
    body: JSON,
    action: sync.Action,
    versions: dict[tuple[str, str], str],
) -> bool:
    """Run one action; whether it changed anything (a Delete of what is gone already did not).
    ``versions`` holds the resourceVersions this plan's own writes returned, so a Replace after
    a Patch of the same object (resume: clear startTime, then unsuspend) sends the version the
    Patch produced, as upstream's UpdateStatus-then-Update does. ``job`` is None only for the
    deletion of a deleted job's decision."""
    namespace = key[0]
    match action:
        case sync.Delete(api_version=version, kind=kind, name=name, uid=uid, grace_seconds=grace):
            return await rt.kube.delete(
                version, kind, namespace, name, uid=uid, grace_seconds=grace
            )
    assert job is not None
    match action:
        case sync.Create(obj=obj):
            await _create(rt, key, job, body, obj)
        case sync.Patch(deferrable=True, api_version=version, kind=kind, name=name, patch=patch):
            rt.deferred.patch(key, version, kind, namespace, name, patch)
        case sync.Patch(api_version=version, kind=kind, name=name, patch=patch, subresource=sub):
            out = await rt.kube.patch(version, kind, namespace, name, patch, subresource=sub)
            versions[(kind, name)] = (out.get("metadata") or {}).get("resourceVersion", "")
        case sync.Replace(obj=obj):
            meta = obj["metadata"]
            fresher = versions.get((obj["kind"], meta["name"]))
            if fresher:
                obj = {**obj, "metadata": {**meta, "resourceVersion": fresher}}
            replaced = await rt.kube.replace(obj)
            if obj["kind"] == "Secret":
                rt.cache.saw_secret(key, replaced)
    return True


async def _apply_all(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    body: JSON,
    actions: list[sync.Action],
    gate: admission_gate.Gate,
) -> bool:
    """Run the plan's actions in order; False when a refused worker gave the placement back
    (the sync ends there). Pod creations next to each other go out together, in batches that
    start at one and double (:func:`_batches`), as the Job controller creates its pods: a job
    of 1,024 workers waits for the client's rate limit, not for 1,024 round trips in a row.
    The first error of a batch (in the plan's order) is handled as one action's error was;
    the batches after it are not sent."""
    versions: dict[tuple[str, str], str] = {}
    for batch in _batches(actions):
        failed = await _attempt(rt, key, job, body, batch, versions)
        if failed is None:
            continue
        action, error = failed
        refused = admission_gate.refused_worker(action, error.status)
        if gate.decision is None or not refused:
            raise error
        # Its GPUs must not stay reserved for pods that cannot exist: give them back, with
        # the workers created so far (observed again: this sync's creations included).
        why = (
            f"the API server refused worker pod {refused}: "
            f"{error.message}; its placement is released and the job is queued again in "
            f"{int(rt.settings.placement_release_seconds)}s"
        )
        again = rt.cache.observe(key, job)
        replacement = admission_gate.place_anew(
            job,
            again.pods,
            again.claims,
            rt.cache.decision(key),
            why,
            keys.REASON_WORKERS_REFUSED,
            rt.cache.clock.now(),
        )
        await _replace(rt, key, job, body, replacement)
        return False
    return True


async def _attempt(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    body: JSON,
    batch: list[sync.Action],
    versions: dict[tuple[str, str], str],
) -> tuple[sync.Action, ApiError] | None:
    """Run one batch (one action, or pod creations together); the first API error in the
    plan's order with its action, or None. Any other error is raised."""
    if len(batch) == 1:
        try:
            await _apply(rt, key, job, body, batch[0], versions)
        except ApiError as e:
            return batch[0], e
        return None
    outcomes = await asyncio.gather(
        *(_apply(rt, key, job, body, action, versions) for action in batch),
        return_exceptions=True,
    )
    for action, outcome in zip(batch, outcomes, strict=True):
        if isinstance(outcome, ApiError):
            return action, outcome
        if isinstance(outcome, BaseException):
            raise outcome
    return None


#: The most pod creations one batch sends at once (the API client's connections are fewer).
MAX_CREATE_BATCH = 64


def _is_pod_create(action: sync.Action) -> bool:
    return isinstance(action, sync.Create) and action.obj.get("kind") == "Pod"


def _batches(actions: Sequence[sync.Action]) -> list[list[sync.Action]]:
    """The actions in order, each alone, except runs of pod creations: those in batches of 1,
    2, 4, ... up to :data:`MAX_CREATE_BATCH`, each batch sent together."""
    out: list[list[sync.Action]] = []
    size = 1
    for action in actions:
        if not _is_pod_create(action):
            out.append([action])
            size = 1
            continue
        if out and _is_pod_create(out[-1][0]) and len(out[-1]) < size:
            out[-1].append(action)
            continue
        if out and _is_pod_create(out[-1][0]):
            size = min(size * 2, MAX_CREATE_BATCH)
        out.append([action])
    return out


async def _create(rt: Runtime, key: JobKey, job: api.MPIJob, body: JSON, obj: JSON) -> None:
    """Create ``obj``; if its name is taken, it must be the job's own (not yet seen) child.

    A same-named object the job does not control is never touched: upstream's
    ``ErrResourceExists`` Warning, and the reconcile fails (and retries).
    """
    try:
        made = await create_or_adopt(
            rt.kube.create,
            obj,
            read=rt.kube.get,
            ours=lambda live: names.is_controlled_by(live, job.metadata.uid),
        )
    except NameTaken:
        message = (
            f'Resource "{obj["metadata"]["name"]}" of Kind "{obj["kind"]}" already exists '
            "and is not managed by MPIJob"
        )
        rt.recorder.post(body, events.warning(keys.REASON_RESOURCE_EXISTS, message))
        raise OwnershipError(message) from None
    except ApiError as e:
        # A 409 here is a name whose holder was deleted meanwhile: retried, with no Warning.
        if not e.conflict and obj["kind"] in ("Pod", "Job"):
            what = "worker pod" if obj["kind"] == "Pod" else "launcher pod"
            rt.recorder.post(
                body, events.warning(keys.REASON_FAILED, f"{what} created failed: {e.message}")
            )
        raise
    created = made.obj
    if obj["kind"] == "Secret":
        rt.cache.saw_secret(key, created)  # not watched: no event will tell the cache
        return
    rt.cache.expect(key, {**created, "apiVersion": obj["apiVersion"], "kind": obj["kind"]})


# --- admission ----------------------------------------------------------------------------------


def _admission(rt: Runtime, key: JobKey, job: api.MPIJob, now: datetime) -> admission_gate.Gate:
    """A topology job's admission state (:func:`mpijob.gang.gate.gate`), from what the caches
    and the admission service hold; the service's line follows it."""
    body = rt.cache.decision(key)
    decision = topology.load_decision(job, body)
    nodes = rt.cache.nodes({a.node for a in decision.assignments}) if decision else {}
    standing = None
    if rt.admission is not None and topology.wants_topology(
        job, default=rt.settings.gpu_topology_default
    ):
        standing = admission_gate.Standing(rt.admission.pending(key), rt.admission.decision(key))
    gate = admission_gate.gate(
        key,
        job,
        topology_default=rt.settings.gpu_topology_default,
        release_seconds=rt.settings.placement_release_seconds,
        decision_body=body,
        pods=rt.cache.pods(key),
        nodes={name: node for name, node in nodes.items() if node is not None},
        standing=standing,
        now=now,
    )
    if rt.admission is not None:
        if gate.line is admission_gate.Line.DROP:
            rt.admission.drop(key)
        elif gate.line is admission_gate.Line.WANT:
            rt.admission.want(key, job)
    return gate


async def _check_placement(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    gate: admission_gate.Gate,
    seen: sync.Observed,
    now: datetime,
) -> admission_gate.Check:
    """Whether the job's placement still holds (:func:`mpijob.gang.gate.check_placement`),
    weighed with the pool's health and the caches' completeness; the job is synced again when
    time alone may change the answer."""
    check = admission_gate.check_placement(
        key,
        job,
        gate,
        seen.pods,
        seen.claims,
        await _decision_nodes(rt, gate),
        rt.gpu_binding,
        rt.settings.placement_release_seconds,
        now,
        rt.cache.pool_health(),
        rt.cache.complete(),
    )
    for seconds in check.rechecks:
        rt.workers.enqueue_after(key, seconds)
    if check.withheld:
        log.info(
            "MPIJob %s/%s: not placed anew while the caches list again after a lost watch: %s",
            *key,
            check.withheld,
            extra=about(keys.KIND, *key),
        )
    return check


async def _decision_nodes(rt: Runtime, gate: admission_gate.Gate) -> dict[str, JSON | None]:
    """The nodes the job's decision names (None: deleted). A node absent from the watched pool
    is read: deleted, or only no longer opted in (one GET, only while a placed job names such a
    node)."""
    if gate.decision is None:
        return {}
    wanted = {a.node for a in gate.decision.assignments}
    nodes: dict[str, JSON | None] = dict(rt.cache.nodes(wanted))
    for name in sorted(wanted - nodes.keys()):
        nodes[name] = await rt.kube.get("v1", "Node", None, name)
    return nodes


async def _replace(
    rt: Runtime, key: JobKey, job: api.MPIJob, body: JSON, plan: admission_gate.Replacement
) -> None:
    """Apply a :class:`~mpijob.gang.gate.Replacement` in its order; the Warning only once the
    decision is gone, or replaced by the record of the job's hold-off (a decision already
    deleted was placed anew by an earlier sync)."""
    versions: dict[tuple[str, str], str] = {}
    for action in plan.actions:
        await _apply(rt, key, job, body, action, versions)
    if plan.release is None:
        return
    if plan.status is not None:
        await _write_status(rt, key, body, plan.status.to_body())
    try:
        if not await _apply(rt, key, job, body, plan.release, versions):
            return  # placed anew already: the cache had not seen the decision go
    except ApiError as e:
        if not e.not_found:
            raise
        return  # the decision to replace by the hold-off's record is gone already
    log.warning(
        "MPIJob %s/%s: %s",
        *key,
        plan.event.message if plan.event else "",
        extra=about(keys.KIND, *key),
    )
    if plan.reason == keys.REASON_GPUS_TAKEN:
        metrics.PLACEMENTS_NOT_HONOURED.labels(binding=GpuBinding.DRA.value).inc()
    if plan.event is not None:
        rt.recorder.post(body, plan.event)


def _observe(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    after: api.MPIJobStatus,
    seen: sync.Observed,
    now: datetime,
    gpus_held: int,
    news: News,
) -> None:
    """Job-level histograms and gauges: histograms once per job (on the steps of its life
    ``news`` announces, or from its pods' own times), gauges on every sync."""
    created = job.metadata.creation_timestamp
    running = after.is_true(keys.COND_RUNNING)
    steps = {step.transition for step in news.steps}
    if Transition.RUNNING in steps and created is not None:
        metrics.TIME_TO_RUNNING.observe((now - created).total_seconds())
    if steps & ENDS and after.start_time and after.completion_time:
        metrics.JOB_DURATION.observe((after.completion_time - after.start_time).total_seconds())
    rt.job_metrics.set_running(key, running)
    rt.job_metrics.set_gpus_held(key, gpus_held)
    if created is None:
        return
    if key not in rt.job_metrics.bound:
        expected = job.spec.worker_replicas + 1
        seconds = binding.seconds_to_bind(created, seen.pods, expected)
        if seconds is not None:
            metrics.GANG_BIND_SECONDS.observe(seconds)
            rt.job_metrics.bound.add(key)
    if key not in rt.job_metrics.workers_ready:
        workers = observed.workers_of(job, seen.pods)
        seconds = binding.seconds_to_workers_ready(created, workers, job.spec.worker_replicas)
        if seconds is not None:
            metrics.TIME_TO_WORKERS_READY.observe(seconds)
            rt.job_metrics.workers_ready.add(key)
    if key not in rt.job_metrics.launcher_running:
        pods = observed.launcher_pods_of(seen.pods)
        seconds = binding.seconds_to_launcher_running(created, pods)
        if seconds is not None:
            metrics.TIME_TO_LAUNCHER_RUNNING.observe(seconds)
            rt.job_metrics.launcher_running.add(key)


# --- status --------------------------------------------------------------------------------------


async def _write_status(rt: Runtime, key: JobKey, body: JSON, new_status: JSON) -> None:
    """Replace the status (PUT, with the resourceVersion read: a conflict means re-reconcile).

    ``lastReconcileTime`` (which upstream never sets) is stamped on each write only: the time the
    operator last changed the status, without a write per sync just to move a clock.
    """
    stamp = format_time(rt.cache.clock.now())
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
    result = status.mark_invalid(current, message, rt.cache.clock.now())
    if not result.changed:
        return  # already reported for this spec
    for event in result.events:
        rt.recorder.post(body, event)
    try:
        await _write_status(rt, key, body, result.status.to_body())
    except ApiError as e:
        log.warning("Could not record the validation error in the status: %s", e)

"""The level-based reconcile of one MPIJob: observe, plan (pure), apply, write status.

Called by the runtime's workers with a job key. The steps before planning mirror upstream's
``syncHandler``: a missing job ends the reconcile; a job managed by another controller is left
alone (checked before validation, as upstream); a terminating job is left to garbage collection;
an invalid job gets upstream's ``ValidationError`` Warning plus an ``Invalid`` condition naming
the fields, and is not retried until it changes.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from mpijob import api, keys, metrics
from mpijob.admission import decision as topology
from mpijob.admission import outcome
from mpijob.admission import queue as admission
from mpijob.desired import binding, events, names, podgroup, service, ssh, status, sync
from mpijob.desired.gang_mode import GangMode
from mpijob.desired.status import Counter
from mpijob.handlers.kube import ApiError
from mpijob.handlers.runtime import JSON, JobKey, Known, OwnershipError, Runtime

log = logging.getLogger(__name__)

COND_INVALID = keys.COND_INVALID
PRIORITY_TTL_SECONDS = 30.0
COUNTERS = {
    Counter.CREATED: metrics.JOBS_CREATED,
    Counter.SUCCESSFUL: metrics.JOBS_SUCCESSFUL,
    Counter.FAILED: metrics.JOBS_FAILED,
}


async def reconcile(rt: Runtime, key: JobKey) -> float | None:
    body = rt.job_body(key)
    if body is None:
        rt.forget(key)
        return None
    meta = body.get("metadata") or {}
    owner = api.managed_by(body)
    if owner and owner not in rt.settings.controller_names:
        return None
    if meta.get("deletionTimestamp"):
        return None
    try:
        job = api.with_defaults(api.parse(body))
        errors = api.validate(job) + podgroup.min_resources_errors(job)
    except api.InvalidMPIJob as exc:
        errors = list(exc.errors)
    if errors:
        await _report_invalid(rt, key, body, api.validation_message(errors))
        return None

    gang = GangMode.from_flag(rt.settings.gang_scheduling)
    now = datetime.now(UTC)
    admitted, placement, admission_changes, timed_out = await _admission(rt, key, job, now)
    options = sync.Options(
        cluster_domain=rt.settings.cluster_domain,
        gang=gang,
        priority_values=await priority_values(rt) if gang.enabled else {},
        admitted=admitted,
        placement=placement,
    )
    seen = sync.Observed(
        launcher_job=rt.launcher_job(key),
        pods=rt.pods(key),
        pod_group=rt.pod_group(key) if gang.enabled else None,
    )
    # A fixed job sheds the condition that said it was invalid.
    was_invalid = status.clear_invalid(job.status)
    before = job.status.model_copy(deep=True)
    plan = sync.plan(job, seen, now, options)
    known = rt.known.setdefault(job.metadata.uid, Known())
    for action in plan.actions:
        await _apply(rt, key, job, body, known, action)

    result = plan.result
    if result is not None:
        if outcome.apply(result.status, admission_changes, now):
            result.changed = True
            if admission_changes.event is not None:
                plan.events.append(admission_changes.event)
        if timed_out and result.status.completion_time is None:
            result.status.completion_time = now
            plan.counters.append(Counter.FAILED)
        if result.changed or plan.force_status or was_invalid:
            await _write_status(rt, key, body, result.status.to_body())
        if result.launcher_seen:
            metrics.JOB_INFO.labels(launcher=names.launcher_name(job), namespace=job.namespace).set(
                1
            )
        _observe(rt, key, job, before, result.status, seen, now)
    for event in plan.events:
        rt.recorder.post(body, event)
    for counter in plan.counters:
        COUNTERS[counter].inc()
    return None


# --- actions -------------------------------------------------------------------------------------


async def _apply(
    rt: Runtime, key: JobKey, job: api.MPIJob, body: JSON, known: Known, action: sync.Action
) -> None:
    match action:
        case sync.Ensure(obj=obj):
            await _create_or_adopt(rt, key, job, body, obj)
        case sync.EnsureService(job=job):
            if known.service:
                return
            live = await _create_or_adopt(rt, key, job, body, service.build_service(job))
            if live is not None and (drift := service.service_drift(job, live)):
                await rt.kube.patch("v1", "Service", job.namespace, job.name, {"spec": drift})
            known.service = True
        case sync.EnsureSecret(job=job):
            if known.secret:
                return
            private, public = ssh.generate_ssh_key_pair()
            secret = ssh.build_ssh_secret(job, private, public)
            live = await _create_or_adopt(rt, key, job, body, secret)
            if live is not None and ssh.secret_needs_regeneration(live):
                await rt.kube.replace(
                    {
                        **secret,
                        "metadata": {
                            **secret["metadata"],
                            "resourceVersion": live["metadata"]["resourceVersion"],
                        },
                    }
                )
            known.secret = True
        case sync.EnsureConfigMap(obj=obj):
            data = obj["data"]
            if known.config_data == data:
                return
            if known.config_data is None:
                live = await _create_or_adopt(rt, key, job, body, obj)
                if live is not None and live.get("data") != data:
                    await _patch_config_data(rt, obj)
            else:
                await _patch_config_data(rt, obj)
            known.config_data = data
        case sync.ApplyPodGroup(obj=obj, update=False):
            await _create_or_adopt(rt, key, job, body, obj)
        case sync.ApplyPodGroup(obj=obj, update=True):
            existing = rt.pod_group(key) or {}
            spec = dict.fromkeys(existing.get("spec") or {}) | obj["spec"]
            await rt.kube.patch(
                obj["apiVersion"], "PodGroup", job.namespace, job.name, {"spec": spec}
            )
        case sync.Delete(api_version=api_version, kind=kind, name=name, uid=uid):
            await rt.kube.delete(api_version, kind, job.namespace, name, uid=uid)
        case sync.UpdateLauncher(patch=patch, replace=replace, clear_start_time=clear):
            name = names.launcher_name(job)
            if clear:
                await rt.kube.patch(
                    "batch/v1",
                    "Job",
                    job.namespace,
                    name,
                    {"status": {"startTime": None}},
                    subresource="status",
                )
            if patch is not None:
                await rt.kube.patch("batch/v1", "Job", job.namespace, name, patch)
            if replace is not None:
                await rt.kube.replace(replace)


async def _patch_config_data(rt: Runtime, obj: JSON) -> None:
    meta = obj["metadata"]
    await rt.kube.patch("v1", "ConfigMap", meta["namespace"], meta["name"], {"data": obj["data"]})


async def _create_or_adopt(
    rt: Runtime, key: JobKey, job: api.MPIJob, body: JSON, obj: JSON
) -> JSON | None:
    """Create ``obj``; on AlreadyExists return the live object if this job controls it.

    Returns None when it was created. A same-named object the job does not control is never
    touched: upstream's ``ErrResourceExists`` Warning, and the reconcile fails (and retries).
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
        if not names.is_controlled_by(live, job):
            message = (
                f'Resource "{meta["name"]}" of Kind "{obj["kind"]}" already exists '
                "and is not managed by MPIJob"
            )
            rt.recorder.post(body, events.warning(keys.REASON_RESOURCE_EXISTS, message))
            raise OwnershipError(message) from None
        if obj["kind"] in ("Pod", "Job"):
            rt.expect(key, live)
        return live
    if obj["kind"] in ("Pod", "Job"):
        rt.expect(key, created)
    return None


# --- admission ----------------------------------------------------------------------------------


async def _admission(
    rt: Runtime, key: JobKey, job: api.MPIJob, now: datetime
) -> tuple[bool, list[sync.PodPlacement] | None, outcome.Outcome, bool]:
    """(admitted, per-worker placement, condition changes, timed out) of a topology job."""
    nothing = outcome.Outcome()
    if rt.admission is None or not topology.wants_topology(
        job, default=rt.settings.gpu_topology_default
    ):
        return True, None, nothing, False
    if job.status.finished:
        rt.admission.drop(key)
        return True, None, nothing, False
    decision = topology.load_decision(job)
    if job.spec.suspended:
        rt.admission.drop(key)
        if decision is not None:  # a suspended job holds no GPUs; it is placed anew on resume
            await rt.kube.patch(keys.API_VERSION, keys.KIND, *key, topology.decision_patch(None))
        return False, None, nothing, False
    if decision is not None:
        rt.admission.drop(key)
        waiting = admission.waiting_job(job, priority_values={})
        placement = topology.pod_placements(decision, _nodes_of(rt, decision))
        admitted = admission.Admit(waiting, decision)
        return True, placement, outcome.outcome(admitted, now=now), False
    last = rt.admission.decision(key)
    if isinstance(last, admission.TimedOut):
        return False, None, outcome.outcome(last, now=now), True
    rt.admission.want(key, job)
    if last is None:
        waiting = admission.waiting_job(job, priority_values={})
        last = admission.Wait(waiting, "waiting for the next admission pass")
    return False, None, outcome.outcome(last, now=now), False


def _nodes_of(rt: Runtime, decision: topology.Decision) -> dict[str, Any]:
    """The decision's own nodes only: on a big cluster, not every node per reconcile."""
    nodes = rt.nodes({a.node for a in decision.assignments})
    return {n.name: n for n in topology.node_states(nodes.values())}


def _observe(
    rt: Runtime,
    key: JobKey,
    job: api.MPIJob,
    before: Any,
    after: Any,
    seen: sync.Observed,
    now: datetime,
) -> None:
    """Job-level histograms and gauges, fed on transitions only."""
    created = job.metadata.creation_timestamp
    was_running = before.is_true(keys.COND_RUNNING)
    running = after.is_true(keys.COND_RUNNING)
    if running and not was_running and created is not None:
        metrics.TIME_TO_RUNNING.observe((now - created).total_seconds())
    if after.finished and not before.finished and after.start_time and after.completion_time:
        metrics.JOB_DURATION.observe((after.completion_time - after.start_time).total_seconds())
    if running:
        rt.running.add(key)
    else:
        rt.running.discard(key)
    metrics.JOBS_RUNNING.set(len(rt.running))
    if key not in rt.bound and created is not None:
        expected = job.spec.worker_replicas + 1
        seconds = binding.seconds_to_bind(created, seen.pods, expected)
        if seconds is not None:
            metrics.GANG_BIND_SECONDS.observe(seconds)
            rt.bound.add(key)


# --- status --------------------------------------------------------------------------------------


async def _write_status(rt: Runtime, key: JobKey, body: JSON, new_status: JSON) -> None:
    """Replace the status (PUT, with the resourceVersion read: a conflict means re-reconcile).

    ``lastReconcileTime`` (which upstream never sets) is stamped on each write only: the time the
    operator last changed the status, without a write per sync just to move a clock.
    """
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    update = {**body, "status": {**new_status, "lastReconcileTime": stamp}}
    fresh = await rt.kube.replace_status(update)
    rt.written[key] = (body["metadata"]["resourceVersion"], fresh)


async def _report_invalid(rt: Runtime, key: JobKey, body: JSON, message: str) -> None:
    """Upstream's Warning, plus a condition so ``kubectl describe`` shows what to fix.

    Works on the raw body, since a job that fails to parse has no model. The Event is posted
    once per distinct message, not on every sync of the unchanged job.
    """
    status = dict(body.get("status") or {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != COND_INVALID]
    current = next(
        (c for c in status.get("conditions") or [] if c.get("type") == COND_INVALID), None
    )
    if current is not None and current.get("message") == message:
        return  # already reported for this generation of the spec
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions.append(
        {
            "type": COND_INVALID,
            "status": "True",
            "reason": keys.REASON_VALIDATION_ERROR,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }
    )
    rt.recorder.post(body, events.warning(keys.REASON_VALIDATION_ERROR, message))
    try:
        await _write_status(rt, key, body, {**status, "conditions": conditions})
    except ApiError as e:
        log.warning("Could not record the validation error in the status: %s", e)


async def priority_values(rt: Runtime) -> dict[str, int]:
    fetched_at, values = rt.priority_values
    if time.monotonic() - fetched_at < PRIORITY_TTL_SECONDS:
        return values
    items = await rt.kube.list("scheduling.k8s.io/v1", "PriorityClass", None)
    values = {i["metadata"]["name"]: int(i.get("value", 0)) for i in items}
    rt.priority_values = (time.monotonic(), values)
    return values

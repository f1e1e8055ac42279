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

from mpijob import api, keys, metrics
from mpijob.build import events, names, service, ssh, status, sync
from mpijob.build.status import Counter
from mpijob.gang.mode import GangMode
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
        errors = api.validate(job)
    except api.InvalidMPIJob as exc:
        errors = list(exc.errors)
    if errors:
        await _report_invalid(rt, key, body, api.validation_message(errors))
        return None

    gang = GangMode.from_flag(rt.settings.gang_scheduling)
    options = sync.Options(
        cluster_domain=rt.settings.cluster_domain,
        gang=gang,
        priority_values=await _priority_values(rt) if gang.enabled else {},
    )
    seen = sync.Observed(
        launcher_job=rt.launcher_job(key),
        pods=rt.pods(key),
        pod_group=rt.pod_group(key) if gang.enabled else None,
    )
    # A fixed job sheds the condition that said it was invalid.
    was_invalid = status.clear_invalid(job.status)
    plan = sync.plan(job, seen, datetime.now(UTC), options)
    known = rt.known.setdefault(job.metadata.uid, Known())
    for action in plan.actions:
        await _apply(rt, key, job, body, known, action)

    if plan.result is not None and (plan.result.changed or plan.force_status or was_invalid):
        await _write_status(rt, key, body, plan.result.status.to_body())
        if plan.result.launcher_seen:
            metrics.JOB_INFO.labels(launcher=names.launcher_name(job), namespace=job.namespace).set(
                1
            )
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


# --- status --------------------------------------------------------------------------------------


async def _write_status(rt: Runtime, key: JobKey, body: JSON, new_status: JSON) -> None:
    """Replace the status (PUT, with the resourceVersion read: a conflict means re-reconcile)."""
    update = {**body, "status": new_status}
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


async def _priority_values(rt: Runtime) -> dict[str, int]:
    fetched_at, values = rt.priority_values
    if time.monotonic() - fetched_at < PRIORITY_TTL_SECONDS:
        return values
    items = await rt.kube.list("scheduling.k8s.io/v1", "PriorityClass", None)
    values = {i["metadata"]["name"]: int(i.get("value", 0)) for i in items}
    rt.priority_values = (time.monotonic(), values)
    return values

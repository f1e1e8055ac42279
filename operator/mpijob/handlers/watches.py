"""Kopf indices (the caches) and event handlers (the triggers), registered per settings.

Every watched kind feeds one index and maps its events to the owning MPIJob's key, as
controller-runtime's ``Owns()`` does: worker and launcher pods by their job-name label, launcher
Jobs and PodGroups by their controller owner reference. Only low-level handlers are used, so
Kopf adds no finalizer, progress annotation or diff-base to anyone's objects. They are async and
never block: Kopf would otherwise run each call in a thread.
"""

from __future__ import annotations

from typing import Any

import kopf

from mpijob import keys
from mpijob.handlers.runtime import JSON, JobKey, Runtime

POD_SUMMARY_METADATA = (
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "creationTimestamp",
    "deletionTimestamp",
    "ownerReferences",
    "resourceVersion",
)


def _key(namespace: str | None, name: str) -> JobKey:
    return (namespace or "", name)


def _runtime(memo: Any) -> Runtime:
    return memo["runtime"]  # type: ignore[no-any-return]


def _owner(body: kopf.Body, kind: str, api_version: str) -> str | None:
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("controller") and (ref.get("kind"), ref.get("apiVersion")) == (
            kind,
            api_version,
        ):
            return str(ref.get("name"))
    return None


def pod_summary(body: kopf.Body) -> JSON:
    """What the reconciler and placement read of a pod: no container specs."""
    meta = {k: body.metadata.get(k) for k in POD_SUMMARY_METADATA if body.metadata.get(k)}
    spec = {k: body.spec.get(k) for k in ("nodeName", "schedulerName") if body.spec.get(k)}
    status = {
        k: body.status.get(k)
        for k in ("phase", "reason", "message", "conditions", "startTime")
        if body.status.get(k)
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


# --- MPIJobs ------------------------------------------------------------------------------------


async def mpijobs_by_key(
    body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> dict[JobKey, JSON]:
    return {_key(namespace, name): dict(body)}


async def mpijob_event(
    namespace: str | None, name: str, type: str | None, body: kopf.Body, memo: Any, **_: Any
) -> None:
    rt = _runtime(memo)
    if type == "DELETED":
        rt.forget(_key(namespace, name), body.metadata.get("uid"))
    rt.enqueue(_key(namespace, name))


# --- pods ---------------------------------------------------------------------------------------


def _pod_job(labels: Any) -> str | None:
    if labels.get(keys.LABEL_OPERATOR_NAME) != keys.OPERATOR_NAME:
        return None
    return labels.get(keys.LABEL_JOB_NAME) or None


async def pods_by_job(
    body: kopf.Body, namespace: str | None, labels: Any, **_: Any
) -> dict[JobKey, JSON]:
    job = _pod_job(labels)
    return {_key(namespace, job): pod_summary(body)} if job else {}


async def pod_event(namespace: str | None, labels: Any, memo: Any, **_: Any) -> None:
    if job := _pod_job(labels):
        _runtime(memo).enqueue(_key(namespace, job))


async def gpu_pods_by_node(body: kopf.Body, **_: Any) -> dict[str, JSON]:
    """Pods holding placed GPUs (ours or not), by node: what placement must not hand out."""
    return {str(body.spec.get("nodeName") or ""): pod_summary(body)}


# --- nodes --------------------------------------------------------------------------------------


async def nodes_by_name(body: kopf.Body, name: str, **_: Any) -> dict[str, JSON]:
    meta = {k: body.metadata.get(k) for k in ("name", "labels", "annotations")}
    return {
        name: {
            "metadata": meta,
            "spec": dict(body.spec),
            "status": {"conditions": body.status.get("conditions") or []},
        }
    }


async def node_event(memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    if rt.admission is not None:
        rt.admission.wake()  # capacity may have appeared


# --- launcher Jobs ------------------------------------------------------------------------------


async def launchers_by_job(body: kopf.Body, namespace: str | None, **_: Any) -> dict[JobKey, JSON]:
    owner = _owner(body, keys.KIND, keys.API_VERSION)
    return {_key(namespace, owner): dict(body)} if owner else {}


async def launcher_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    if owner := _owner(body, keys.KIND, keys.API_VERSION):
        rt = _runtime(memo)
        rt.seen_launcher(_key(namespace, owner))
        rt.enqueue(_key(namespace, owner))


# --- PodGroups ----------------------------------------------------------------------------------


async def podgroups_by_job(body: kopf.Body, namespace: str | None, **_: Any) -> dict[JobKey, JSON]:
    owner = _owner(body, keys.KIND, keys.API_VERSION)
    return {_key(namespace, owner): dict(body)} if owner else {}


async def podgroup_event(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    if owner := _owner(body, keys.KIND, keys.API_VERSION):
        _runtime(memo).enqueue(_key(namespace, owner))


#: Every index registered above, by the name handlers receive it under.
INDICES = (
    "mpijobs_by_key",
    "pods_by_job",
    "gpu_pods_by_node",
    "nodes_by_name",
    "launchers_by_job",
    "podgroups_by_job",
)


def register(registry: kopf.OperatorRegistry, *, gang_api_version: str | None) -> None:
    """Attach the indices and event handlers; PodGroups only in gang mode."""
    mpijobs = (keys.GROUP, keys.VERSION, keys.PLURAL)
    kopf.index(*mpijobs, registry=registry)(mpijobs_by_key)
    kopf.on.event(*mpijobs, registry=registry)(mpijob_event)
    ours = {keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME}
    kopf.index("v1", "pods", labels=ours, registry=registry)(pods_by_job)
    kopf.on.event("v1", "pods", labels=ours, registry=registry)(pod_event)
    placed = {keys.GPU_IDS: kopf.PRESENT}
    kopf.index("v1", "pods", annotations=placed, registry=registry)(gpu_pods_by_node)
    opted_in = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY}
    kopf.index("v1", "nodes", labels=opted_in, registry=registry)(nodes_by_name)
    kopf.on.event("v1", "nodes", labels=opted_in, registry=registry)(node_event)
    kopf.index("batch", "v1", "jobs", registry=registry)(launchers_by_job)
    kopf.on.event("batch", "v1", "jobs", registry=registry)(launcher_event)
    if gang_api_version:
        group, version = gang_api_version.split("/")
        kopf.index(group, version, "podgroups", registry=registry)(podgroups_by_job)
        kopf.on.event(group, version, "podgroups", registry=registry)(podgroup_event)

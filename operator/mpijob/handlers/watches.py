"""The caches and the triggers: what each watched kind's events file and ask for.

Every watched kind feeds one index and maps its events to the owning MPIJob's key, as
controller-runtime's ``Owns()`` does: worker and launcher pods by their job-name label; the
Service, hostfile ConfigMap, launcher Job and PodGroup by their controller owner reference. So
a child deleted or edited by hand triggers the sync that restores it. Secrets are not watched:
a watch would bring every Secret of the cluster to the operator, which needs only its jobs' SSH
Secrets; the reconciler reads a job's by name before it creates a pod that mounts it (see
:mod:`mpijob.handlers.cache`). A child's event asks for the sync
:data:`CHILD_SYNC_DELAY_SECONDS` later, so a burst of them is one sync. Each index keeps only
what the reconciler reads.

Every watched kind is one row of :data:`WATCHED`, from which every watch is registered. The MPIJob
is Kopf's: its index function files it and asks for its sync (:func:`mpijobs_by_key`), and an event
handler filtered to deletions forgets it (:func:`mpijob_deleted`). The kinds with most events and
those with one object per node (pods, Services, ConfigMaps, launcher Jobs, opted-in nodes, and in
the dra binding mode ResourceSlices and ResourceClaims) are listed and watched by the operator's
informers (:class:`mpijob.platform.informer.Informer`, docs/informers.md), which give each event to
one plain function here (:func:`pod_event`, :func:`child_event`, :func:`node_event`,
:func:`slice_event`, :func:`claim_event`): it asks for the syncs and returns what the index files.
A pod is filed under every key a reader looks it up by (:class:`~mpijob.handlers.cache.PodsBy`):
the job it belongs to, the node whose GPUs it holds, the node whose room it takes; a claim under
its job and the node whose GPUs it was given (:class:`~mpijob.handlers.cache.ClaimsBy`). The others
(MPIJobs, decisions, quotas, priorities, DRA's DeviceClasses, PodGroups) are Kopf's indices and
event handlers: a child's index function is also its trigger, since Kopf calls an index for every
event but a deletion, so its event handlers are filtered to deletions, as the MPIJob's is. They are
async and never block: Kopf would otherwise run each call in a thread. Only low-level handlers are
used, so Kopf adds no finalizer, progress annotation or diff-base to anyone's objects.

No sync runs before every index is complete: the work queue holds what the events ask for until
each informer has listed its kind once and Kopf has called :func:`kopf_indexed` (Kopf calls
event handlers only once its indices are complete) (:meth:`~mpijob.platform.workers.Workers.open`).
An event for a child also ends the expectation its creation left (see
:mod:`mpijob.handlers.cache`); an index is written before any other task runs, so no sync sees
the expectation gone and the index without the child.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

import kopf

from mpijob import keys, metrics
from mpijob.api import JSON, JobKey
from mpijob.desired import config_map, gpu_binding, names
from mpijob.gang import quota, topology
from mpijob.handlers.cache import ClaimsBy, Index, PodsBy
from mpijob.handlers.runtime import OperatorMemo, Runtime
from mpijob.platform.kube import ApiError, resource, transient
from mpijob.platform.workers import KOPF_INDICES
from mpijob.pods.predicates import pod_requests, terminal

log = logging.getLogger(__name__)

#: Metadata fields kept of a pod or child, each further cut by :func:`kept_metadata`.
POD_SUMMARY_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "resourceVersion",
)

#: The labels any reader reads of a pod or child: the job's (upstream's keys) and the gang
#: schedulers'. Everything else a tenant puts on its objects is not kept.
KEPT_LABELS = frozenset(
    {
        keys.LABEL_OPERATOR_NAME,
        keys.LABEL_JOB_NAME,
        keys.LABEL_JOB_ROLE,
        keys.LABEL_REPLICA_INDEX,
        keys.LABEL_REPLICA_TYPE,
        keys.LABEL_APP,
        keys.SCHED_PLUGINS_POD_GROUP_LABEL,
    }
)
#: The annotations any reader reads: the operator's own (a closed set), and the longest value
#: kept of one.
KEPT_ANNOTATIONS, MAX_KEPT_VALUE = keys.own_annotations(), keys.MAX_OWN_VALUE


#: The annotations read of an MPIJob: the operator's and Volcano's queue.
JOB_ANNOTATIONS = KEPT_ANNOTATIONS | {keys.VOLCANO_QUEUE_NAME_ANNOTATION}


def kept_metadata(
    metadata: Mapping[str, Any], annotations: frozenset[str] = KEPT_ANNOTATIONS
) -> JSON:
    """What the caches keep of an object's metadata: its identity and times, the labels and
    annotations some reader reads (:data:`KEPT_LABELS`, :data:`KEPT_ANNOTATIONS`), and its
    controller owner reference alone. What a tenant adds to its own objects (annotations, data,
    owner references, labels) then costs the operator nothing: an object's summary has a size
    bound whatever the object carries."""
    out = _picked(metadata, POD_SUMMARY_METADATA)
    labels = metadata.get("labels") or {}
    if kept := {k: labels[k] for k in KEPT_LABELS if k in labels}:
        out["labels"] = kept
    present = metadata.get("annotations") or {}
    kept = {
        k: present[k]
        for k in annotations
        if k in present and len(str(present[k])) <= MAX_KEPT_VALUE
    }
    if kept:
        out["annotations"] = kept
    controller = names.controller_of({"metadata": metadata})
    if controller is not None:
        ref = {k: controller[k] for k in _OWNER_FIELDS if k in controller}
        if all(len(str(v)) <= MAX_KEPT_VALUE for v in ref.values()):
            out["ownerReferences"] = [ref]
    return out


_OWNER_FIELDS = ("apiVersion", "kind", "name", "uid", "controller")


def _key(namespace: str | None, name: str) -> JobKey:
    return (namespace or "", name)


def _runtime(memo: OperatorMemo) -> Runtime:
    return memo.runtime


def _picked(section: Any, fields: tuple[str, ...]) -> JSON:
    """The set ones of ``fields`` of a plain dict (a body's section read through ``body[...]``
    is the decoded dict itself: much cheaper per field than Kopf's views)."""
    section = section or {}
    return {k: section[k] for k in fields if section.get(k)}


def _metadata(body: Mapping[str, Any]) -> JSON:
    return kept_metadata(body.get("metadata") or {})


#: What is kept of a container's state: when it ran, and why and how it ended or cannot start.
_STATE_FIELDS = {
    "running": ("startedAt",),
    "terminated": ("reason", "exitCode", "startedAt", "finishedAt"),
    "waiting": ("reason", "message"),
}


def _container_status(container: Any) -> JSON:
    """A container's name and states, reduced to what says why it failed (see
    :func:`mpijob.desired.observed.pod_failure`) and when it ran; a waiting message is cut to
    200 characters."""
    out: JSON = {"name": container.get("name")}
    for which in ("state", "lastState"):
        state = container.get(which) or {}
        kept = {}
        for kind, fields in _STATE_FIELDS.items():
            if kind in state:
                detail = {f: state[kind][f] for f in fields if state[kind].get(f) is not None}
                if "message" in detail:
                    detail["message"] = str(detail["message"])[:200]
                kept[kind] = detail
        if kept:
            out[which] = kept
    return out


def pod_summary(body: Mapping[str, Any]) -> JSON:
    """What the reconciler and placement read of a pod: no container specs; of the containers'
    statuses, only their states (why a pod failed, when its launcher ran); its IP (a worker is
    reachable by name only once it has one)."""
    spec = _picked(body.get("spec"), ("nodeName", "schedulerName"))
    raw = body.get("status") or {}
    status = _picked(raw, ("phase", "reason", "message", "conditions", "startTime", "podIP"))
    for field in ("initContainerStatuses", "containerStatuses"):
        if raw.get(field):
            status[field] = [_container_status(c) for c in raw[field]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(body),
        "spec": spec,
        "status": status,
    }


# --- MPIJobs ------------------------------------------------------------------------------------


#: How long the first sync of a job created suspended waits (see :func:`mpijobs_by_key`). The
#: e2e suite creates, lists the namespace's pods and updates: three round trips, which a busy
#: API server can stretch past the base delay (50 ms lost that race once in the 8 suite runs
#: since it was set). A suspended job loses nothing by waiting.
SUSPENDED_FIRST_SYNC_SECONDS = 1.0


async def mpijobs_by_key(
    body: kopf.Body, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> dict[JobKey, JSON]:
    """Kopf's index of the MPIJobs, each filed under its key (:func:`job_summary`), and the
    sync each event but a deletion asks for (:func:`mpijob_deleted` has those): none for the
    echo of our own status write, whose sync saw this state. One Kopf handler per event rather
    than an index and an event handler: Kopf's per-handler work (its arguments, its outcome) was
    a third of its CPU per job event (docs/scale.md). The sync reads what this returns: Kopf
    files it before its task next yields to the loop, and the sync runs on another task."""
    rt = _runtime(memo)
    key = _key(namespace, name)
    if rt.cache.is_own_status_write(key, body.metadata.get("resourceVersion")):
        pass
    elif not rt.cache.has_job(key) and (body.spec.get("runPolicy") or {}).get("suspend") is True:
        # Created suspended: nothing runs for it yet, and whoever made it so (Kueue, a queue,
        # upstream's e2e suite) is about to update the object its create returned. Our first
        # status write would make that update fail with 409 Conflict; the client's update (a
        # MODIFIED event) still brings the sync forward.
        rt.workers.enqueue_after(key, SUSPENDED_FIRST_SYNC_SECONDS)
    else:
        rt.workers.enqueue_rate_limited(key)
    return {key: job_summary(dict(body))}


async def mpijob_deleted(namespace: str | None, name: str, memo: OperatorMemo, **_: Any) -> None:
    """An MPIJob deleted (Kopf has already unfiled it): every memory of it goes."""
    _runtime(memo).forget(_key(namespace, name))


def job_summary(body: JSON) -> JSON:
    """What the cache keeps of an MPIJob: spec and status whole (the reconciler reads them);
    of the metadata, its labels and what :func:`kept_metadata` keeps, so neither the
    ``managedFields`` nor annotations no reader reads (``kubectl apply``'s copy of the whole
    object, a tenant's own) are held."""
    metadata = body.get("metadata") or {}
    kept = kept_metadata(metadata, JOB_ANNOTATIONS)
    present = metadata.get("annotations") or {}
    if too_long := {
        k: str(present[k])[: MAX_KEPT_VALUE + 1]
        for k in JOB_ANNOTATIONS
        if len(str(present.get(k, ""))) > MAX_KEPT_VALUE
    }:
        # Cut rather than dropped: validation still refuses the value, naming the annotation.
        kept["annotations"] = {**kept.get("annotations", {}), **too_long}
    if labels := metadata.get("labels"):
        kept["labels"] = labels  # a job's, which its children's selectors and Kueue read
    for field in ("generateName", "generation", "finalizers"):
        if field in metadata:
            kept[field] = metadata[field]
    return {**body, "metadata": kept}


async def kopf_indexed(memo: OperatorMemo, **_: Any) -> None:
    """Kopf calls event handlers only once all its indices are complete: the first call opens
    the workers for them. Its handler is on PriorityClasses, because every cluster has two
    (``system-node-critical`` and ``system-cluster-critical``, made by the API server)."""
    _runtime(memo).workers.open(KOPF_INDICES)


# --- pods ---------------------------------------------------------------------------------------


def _pod_job(labels: Any) -> str | None:
    if labels.get(keys.LABEL_OPERATOR_NAME) != keys.OPERATOR_NAME:
        return None
    return labels.get(keys.LABEL_JOB_NAME) or None


def pod_event(rt: Runtime, type: str | None, body: JSON) -> dict[tuple[str, ...], Any]:
    """One pod's event from the pod informer (``type`` None: listed): our job's sync asked for,
    and every key the pod is filed under (:class:`PodsBy`); none once it is deleted."""
    metadata = body.get("metadata") or {}
    namespace, name = metadata.get("namespace"), str(metadata.get("name") or "")
    job = _pod_job(metadata.get("labels") or {})
    if type == "DELETED":
        if job:
            rt.reported_actual.pop(str(metadata.get("uid") or ""), None)
            _child_changed(rt, _key(namespace, job), "Pod", name)
        return {}
    out: dict[tuple[str, ...], Any] = {}
    spec = body.get("spec") or {}
    gpus = requests_gpus(spec)
    # Most pods of a cluster are neither ours nor GPU pods: of those only the sums are kept,
    # and no summary is built.
    summary = pod_summary(body) if job or gpus else {}
    if job:
        key = _key(namespace, job)
        _count_not_honoured(rt, body)
        _child_changed(rt, key, "Pod", name)
        out[(PodsBy.JOB, *key)] = summary
    node = str(spec.get("nodeName") or "")
    if gpus:
        # Kept with its GPU requests, which is what a pod no decision placed is counted by.
        requested = {
            "containers": _gpu_requests(spec.get("containers")),
            "initContainers": _gpu_requests(spec.get("initContainers")),
        }
        out[(PodsBy.GPUS_ON, node)] = {**summary, "spec": {**summary["spec"], **requested}}
    if node and not terminal(body):
        out[(PodsBy.REQUESTS_ON, node)] = tuple(sorted(pod_requests(spec).items()))
    return out


def _count_not_honoured(rt: Runtime, body: JSON) -> None:
    """Count a placed pod once per set of GPUs the agent found it holds instead of its own."""
    metadata = body.get("metadata") or {}
    actual = (metadata.get("annotations") or {}).get(keys.GPU_ACTUAL)
    if not actual:
        return  # nearly every pod event: the agent reported nothing
    uid = str(metadata.get("uid") or "")
    before = rt.reported_actual.get(uid)
    old = {"metadata": {"annotations": {keys.GPU_ACTUAL: before}}} if before else None
    if binding := gpu_binding.newly_not_honoured(old, body):
        metrics.PLACEMENTS_NOT_HONOURED.labels(binding=binding.value).inc()
    rt.reported_actual[uid] = str(actual)


def _gpu_requests(containers: Any) -> list[JSON]:
    """Of each container, only its ``nvidia.com/gpu`` limit and request, and whether it is a
    sidecar (``restartPolicy: Always``): what its effective GPU request needs."""
    out = []
    for c in containers or []:
        resources = c.get("resources") or {}
        kept = {
            kind: {keys.GPU_RESOURCE: resources[kind][keys.GPU_RESOURCE]}
            for kind in ("limits", "requests")
            if keys.GPU_RESOURCE in (resources.get(kind) or {})
        }
        summary: JSON = {"resources": kept}
        if c.get("restartPolicy"):
            summary["restartPolicy"] = c["restartPolicy"]
        out.append(summary)
    return out


def requests_gpus(spec: Any) -> bool:
    """Whether the pod asks for whole GPUs somewhere (then placement counts it)."""
    return any(
        keys.GPU_RESOURCE in ((c.get("resources") or {}).get(kind) or {})
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        for kind in ("limits", "requests")
    )


# --- placement decisions ------------------------------------------------------------------------


async def decisions_by_job(body: kopf.Body, namespace: str | None, **_: Any) -> dict[JobKey, JSON]:
    """The operator's PlacementDecisions, by the job they belong to."""
    job = str((body.spec.get("job") or {}).get("name") or "")
    return {_key(namespace, job): dict(body)} if job else {}


async def decision_event(
    namespace: str | None, body: kopf.Body, memo: OperatorMemo, **_: Any
) -> None:
    rt = _runtime(memo)
    if job := str((body.spec.get("job") or {}).get("name") or ""):
        rt.workers.enqueue(_key(namespace, job))  # it may be released, or its job may now run
    if rt.admission is not None:
        rt.admission.wake()


# --- nodes --------------------------------------------------------------------------------------


def node_event(rt: Runtime, type: str | None, body: JSON) -> dict[str, JSON]:
    """An opted-in node's event from the node informer (``type`` None: listed; ``DELETED`` also
    when it loses the opt-in label): its readiness noted (since when it is not Ready, how much
    of the pool is not), the syncs of the jobs placed there when it can no longer hold them,
    admission woken, and the node filed under its name."""
    metadata = body.get("metadata") or {}
    name = str(metadata.get("name") or "")
    rt.cache.saw_node(name, None if type == "DELETED" else topology.ready(body))
    if type == "DELETED" or not topology.opted_in(body):
        # Jobs placed there may have lost workers (deleted, NotReady and evicted, drained).
        for key in rt.cache.jobs_placed_on(name):
            rt.workers.enqueue(key)
    if rt.admission is not None:
        rt.admission.wake()  # capacity may have appeared
    if type == "DELETED":
        return {}
    status = body.get("status") or {}
    return {
        name: {
            "metadata": {k: metadata.get(k) for k in ("name", "labels", "annotations")},
            "spec": dict(body.get("spec") or {}),
            "status": {
                "conditions": status.get("conditions") or [],
                # What admission fits a worker's cpu, memory, pods and the rest against.
                "allocatable": dict(status.get("allocatable") or {}),
            },
        }
    }


# --- children found by their controller owner reference -----------------------------------


def _job_of(body: kopf.Body) -> str | None:
    return names.controlling_job({"metadata": dict(body.metadata)})


#: How long a child's event waits before the sync it asks for, so that a job's pods changing
#: together (scheduled, started, finished within moments) cost one sync, one status write and
#: one hostfile update instead of one each. Never longer: the first event's timer wins.
CHILD_SYNC_DELAY_SECONDS = 0.5


def _child_changed(rt: Runtime, key: JobKey, kind: str, name: str) -> None:
    rt.cache.seen(key, kind, name)
    rt.workers.enqueue_after(key, CHILD_SYNC_DELAY_SECONDS)


def deleted(type: str | None, **_: Any) -> bool:
    """Filter of the children's event handlers: their index functions see every other event."""
    return type == "DELETED"


async def child_deleted(
    body: kopf.Body, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> None:
    if job := _job_of(body):
        _child_changed(_runtime(memo), _key(namespace, job), str(body.get("kind")), name)


def _owned(body: kopf.Body, namespace: str | None, name: str, memo: OperatorMemo) -> JobKey | None:
    """The controlling job's key, its sync asked for; None for anyone else's object."""
    if not (job := _job_of(body)):
        return None
    key = _key(namespace, job)
    _child_changed(_runtime(memo), key, str(body.get("kind")), name)
    return key


def _child(body: Mapping[str, Any], **fields: Any) -> JSON:
    summary = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind")}
    return {**summary, "metadata": _metadata(body), **fields}


def _service(body: JSON) -> JSON:
    """The selector and DNS settings the sync corrects when they drift."""
    spec = body.get("spec") or {}
    return _child(
        body, spec={k: spec.get(k) for k in ("selector", "publishNotReadyAddresses", "clusterIP")}
    )


def _config_map(body: JSON) -> JSON:
    """The digests of its data (:func:`mpijob.desired.config_map.digests`), not the data."""
    return _child(body, **{config_map.DIGESTS: config_map.digests(body.get("data") or {})})


def _launcher_job(body: JSON) -> JSON:
    """Its spec (the template a resume replaces the Job with) and status, whole."""
    return _child(body, spec=body.get("spec") or {}, status=body.get("status") or {})


def child_event(rt: Runtime, index: Index, type: str | None, body: JSON) -> dict[JobKey, JSON]:
    """A child's event from its informer (``type`` None: listed): its controlling job's sync
    asked for, and what ``index`` keeps of it under the job's key (nothing once deleted, or
    for anyone else's object)."""
    metadata = body.get("metadata") or {}
    summary, suffix = WATCHED[index].child or (_child, "")
    job = names.controlling_job({"metadata": metadata})
    name = str(metadata.get("name") or "")
    if not job or name != job + suffix:
        return {}
    key = _key(metadata.get("namespace"), job)
    _child_changed(rt, key, str(body.get("kind")), name)
    return {} if type == "DELETED" else {key: summary(body)}


async def podgroups_by_job(
    body: kopf.Body, namespace: str | None, name: str, memo: OperatorMemo, **_: Any
) -> dict[JobKey, JSON]:
    if name != _job_of(body) or not (key := _owned(body, namespace, name, memo)):
        return {}  # a gang's PodGroup is named after its job (see child_event)
    return {key: {**dict(body), "metadata": kept_metadata(body.metadata)}}


# --- DRA (the dra binding mode): claims and the NVIDIA driver's ResourceSlices -------------------


def _allocated(body: JSON) -> list[tuple[str, str]]:
    """The NVIDIA GPUs allocated to a claim: (pool, device) each; the driver's pool is the
    node's name."""
    allocation = (body.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        (str(r.get("pool")), str(r.get("device")))
        for r in results
        if r.get("driver") == keys.NVIDIA_GPU_DRIVER
    ]


def claim_event(rt: Runtime, type: str | None, body: JSON) -> dict[tuple[str, ...], JSON]:
    """A ResourceClaim's event from its informer (``type`` None: listed): the sync of the job
    that controls it asked for, admission woken (an allocation came or went), and every key the
    claim is filed under (:class:`ClaimsBy`); none once it is deleted."""
    metadata = body.get("metadata") or {}
    namespace, name = metadata.get("namespace"), str(metadata.get("name") or "")
    job = names.controlling_job({"metadata": metadata})
    if job:
        _child_changed(rt, _key(namespace, job), "ResourceClaim", name)
    if rt.admission is not None:
        rt.admission.wake()
    if type == "DELETED":
        return {}
    allocated = _allocated(body)
    out: dict[tuple[str, ...], JSON] = {}
    if job:
        status = {"allocated": [[pool, device] for pool, device in allocated]}
        spec = dict(body.get("spec") or {})
        out[(ClaimsBy.JOB, *_key(namespace, job))] = _child(body, spec=spec, status=status)
    for pool, device in allocated:
        entry = out.setdefault(
            (ClaimsBy.ALLOCATED_ON, pool), {"namespace": namespace, "name": name, "devices": []}
        )
        entry["devices"].append(device)
    return out


def slice_event(type: str | None, body: JSON) -> dict[str, JSON]:
    """A ResourceSlice's event from its informer: of the NVIDIA driver's, each GPU device's
    UUID, and the UUIDs of those whose device taints keep new claims off them
    (:func:`mpijob.gang.topology.keeps_claims_off`), filed under its node (nothing once
    deleted). It asks for no sync: a claim's allocation, not a slice, says where a job's GPUs
    are."""
    spec = body.get("spec") or {}
    if type == "DELETED" or spec.get("driver") != keys.NVIDIA_GPU_DRIVER:
        return {}
    if not (node := spec.get("nodeName")):
        return {}
    devices = {}
    tainted = []
    for device in spec.get("devices") or []:
        uuid = ((device.get("attributes") or {}).get("uuid") or {}).get("string")
        if uuid:
            devices[str(device.get("name"))] = str(uuid)
            if topology.keeps_claims_off(device.get("taints")):
                tainted.append(str(uuid))
    return {str(node): {"devices": devices, "tainted": tainted}}


async def gpu_classes_by_name(body: kopf.Body, name: str, **_: Any) -> dict[str, str]:
    """NVIDIA's GPU DeviceClass, and the extended resource it maps its devices to (empty for
    none): an API server with the DRAExtendedResource gate then charges a claim's devices to
    that resource's quota too."""
    if name != keys.NVIDIA_GPU_DRIVER:
        return {}
    return {name: str(body.spec.get("extendedResourceName") or "")}


# --- ResourceQuotas -----------------------------------------------------------------------------


async def quotas_by_namespace(
    body: kopf.Body, namespace: str | None, name: str, **_: Any
) -> dict[str, JSON]:
    """ResourceQuotas that limit GPUs, by namespace: only their GPU resources and scopes."""
    if not limits_gpus(body.spec):
        return {}
    hard = body.spec.get("hard") or {}
    used = body.status.get("used") or {}
    spec = {
        "hard": {r: hard[r] for r in quota.GPU_RESOURCES if r in hard},
        "scopes": list(body.spec.get("scopes") or []),
        "scopeSelector": dict(body.spec.get("scopeSelector") or {}),
    }
    status = {"used": {r: used[r] for r in quota.GPU_RESOURCES if r in used}}
    meta = {"name": name, "namespace": namespace}
    return {namespace or "": {"metadata": meta, "spec": spec, "status": status}}


def limits_gpus(spec: kopf.Spec, **_: Any) -> bool:
    """Filter of the quota events: the quota limits GPUs."""
    return any(r in (spec.get("hard") or {}) for r in quota.GPU_RESOURCES)


async def gpu_quota_event(memo: OperatorMemo, **_: Any) -> None:
    rt = _runtime(memo)
    if rt.admission is not None:
        rt.admission.wake()  # room may have appeared (a pod finished, the limit was raised)


# --- PriorityClasses ----------------------------------------------------------------------------


async def priorities_by_name(body: kopf.Body, name: str, **_: Any) -> dict[str, int]:
    """Values for a PodGroup's minResources and the admission order."""
    return {name: int(body.get("value") or 0)}


# --- Volcano HyperNodes (a fabric on HyperNode tiers) ---------------------------------------


#: How often Volcano's HyperNodes are listed. They are few, cluster-scoped and change when an
#: admin rewires the fabric, so a list every few seconds costs little.
HYPERNODE_POLL_SECONDS = 10.0


async def follow_hypernodes(rt: Runtime) -> None:
    """Keep the cache's HyperNodes (the tier and the members of each) current, and wake the
    admission when they change.

    Listed rather than watched: Kopf starts a watch the moment Volcano's CRD appears, and the
    API server may answer that first list with a 404 before it serves the new kind, which ends
    Kopf's watch for good. A list that finds no such kind means no HyperNodes."""
    while True:
        try:
            items = await rt.kube.list(keys.HYPERNODE_API_VERSION, "HyperNode", None, urgent=False)
        except Exception as e:
            if isinstance(e, ApiError) and e.not_found:
                items = []
            elif transient(e, refusals=True):  # the next poll tries again; the API may be down
                log.warning("Listing Volcano's HyperNodes failed: %s", e)
                await asyncio.sleep(HYPERNODE_POLL_SECONDS)
                continue
            else:
                raise
        seen = sorted(
            (
                {
                    "metadata": {"name": (h.get("metadata") or {}).get("name")},
                    "spec": h.get("spec") or {},
                }
                for h in items
            ),
            key=lambda h: str(h["metadata"]["name"]),
        )
        if seen != rt.cache.hypernodes:
            rt.cache.hypernodes = seen
            if rt.admission is not None:
                rt.admission.wake()  # a domain appeared, grew or went
        await asyncio.sleep(HYPERNODE_POLL_SECONDS)


class Source(StrEnum):
    """Who lists and watches a kind."""

    KOPF = "Kopf"
    """Kopf's watch, an index function and, where events must do more, an event handler."""
    INFORMER = "informer"
    """The declared extension (:class:`mpijob.platform.informer.Informer`, docs/informers.md):
    an informer of the operator's own that gives each event to one plain function."""


class Mode(StrEnum):
    """When a kind is watched at all: its API may not be served otherwise."""

    ALWAYS = "always"
    DRA = "dra"
    """In the dra GPU binding mode."""
    GANG = "gang"
    """With a PodGroup gang backend (Volcano's or scheduler-plugins' API)."""


@dataclass(frozen=True)
class Watched:
    """Everything about one watched kind, in one row: from these rows every watch is registered
    (Kopf's and the informers') and every cache lookup by job is made."""

    index: Index
    """The index its objects are filed in (:class:`mpijob.handlers.cache.Index`)."""
    kind: str
    api_version: str | None
    """None: the gang backend's PodGroup API, known at start."""
    source: Source
    filed_by: str
    """The index's keys, and what is kept of each object (docs/informers.md's table)."""
    triggers: str
    """Which job's sync an event asks for."""
    labels: str = ""
    """The label selector it is listed and watched by (informers only)."""
    page: int = 500
    """Objects per page of an informer's list."""
    mode: Mode = Mode.ALWAYS
    handle: Callable[[Runtime], Callable[[str | None, JSON], Any]] | None = None
    """An informer's kind: what its informer gives each event to."""
    index_fn: Callable[..., Awaitable[Any]] | None = None
    """A Kopf kind: its index function (also the trigger: Kopf calls it for every event but a
    deletion)."""
    on_event: Callable[..., Awaitable[None]] | None = None
    """A Kopf kind: its event handler, filtered by :attr:`when`."""
    when: Callable[..., bool] | None = None
    child: tuple[Callable[[JSON], JSON], str] | None = None
    """A child the reconciler looks up by its job's key: what is kept of it, and the suffix of
    the job's name that names it (:mod:`mpijob.desired.names`). Only the object of that name is
    the job's child: a tenant may make any number of others controlled by its own job, which
    are not filed."""

    def watched(self, *, dra: bool, gang: bool) -> bool:
        return (
            self.mode is Mode.ALWAYS
            or (self.mode is Mode.DRA and dra)
            or (self.mode is Mode.GANG and gang)
        )


def _informed(handle: Callable[..., Any]) -> Callable[[Runtime], Callable[..., Any]]:
    return lambda rt: partial(handle, rt)


def _informed_child(index: Index) -> Callable[[Runtime], Callable[..., Any]]:
    return lambda rt: partial(child_event, rt, index)


_BY_JOB = "the job's key (namespace, name)"
_OWNER = "the job that controls it (its controller reference)"

#: Every watched kind. The informers take the kinds with most events and those with one object
#: per node: nearly all of the events, and on the kinds per node Kopf spent 1.4 to 2.9 ms of CPU
#: a node at every start (docs/scale.md). Kopf keeps the kinds with few objects and few events.
WATCHED: dict[Index, Watched] = {
    w.index: w
    for w in (
        Watched(
            Index.MPIJOBS_BY_KEY, keys.KIND, keys.API_VERSION, Source.KOPF,
            f"{_BY_JOB}: spec and status whole, the metadata read (job_summary)",
            "its own, rate-limited; none for the echo of its own status write",
            index_fn=mpijobs_by_key, on_event=mpijob_deleted, when=deleted,
        ),
        Watched(
            Index.PODS, "Pod", "v1", Source.INFORMER,
            "(job, namespace, name) for the job's pods; (gpus-on, node) for anyone's GPU pods; "
            "(requests-on, node) for anyone's bound pods (pod_summary)",
            "the job named by its labels, 0.5 s later",
            handle=_informed(pod_event),
        ),
        Watched(
            Index.SERVICES_BY_JOB, "Service", "v1", Source.INFORMER,
            f"{_BY_JOB}: selector and DNS fields", _OWNER,
            handle=_informed_child(Index.SERVICES_BY_JOB), child=(_service, ""),
        ),
        # Every ConfigMap of the cluster is listed, and anyone's may carry a MiB of data: a page
        # of 50 holds at most 50 MiB at once (of 500: half a GiB), at one request per 50 at start.
        Watched(
            Index.CONFIGMAPS_BY_JOB, "ConfigMap", "v1", Source.INFORMER,
            f"{_BY_JOB}: digests of the operator's two keys", _OWNER, page=50,
            handle=_informed_child(Index.CONFIGMAPS_BY_JOB),
            child=(_config_map, keys.CONFIG_SUFFIX),
        ),
        Watched(
            Index.LAUNCHERS_BY_JOB, "Job", "batch/v1", Source.INFORMER,
            f"{_BY_JOB}: spec and status", _OWNER,
            handle=_informed_child(Index.LAUNCHERS_BY_JOB),
            child=(_launcher_job, keys.LAUNCHER_SUFFIX),
        ),
        Watched(
            Index.NODES_BY_NAME, "Node", "v1", Source.INFORMER,
            "node name: labels, annotations (its GPU topology), spec, conditions, allocatable",
            "the jobs placed on it, when it is deleted or leaves the pool; admission woken",
            labels=f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_TOPOLOGY}",
            handle=_informed(node_event),
        ),
        Watched(
            Index.SLICES_BY_NODE, "ResourceSlice", keys.DRA_API_VERSION, Source.INFORMER,
            "node name: the NVIDIA driver's GPU UUIDs", "none", mode=Mode.DRA,
            handle=lambda rt: slice_event,
        ),
        Watched(
            Index.CLAIMS, "ResourceClaim", keys.DRA_API_VERSION, Source.INFORMER,
            "(job, namespace, name) for the job's claims; (allocated-on, node) for anyone's",
            f"{_OWNER}; admission woken", mode=Mode.DRA,
            handle=_informed(claim_event),
        ),
        Watched(
            Index.DECISIONS_BY_JOB, keys.DECISION_KIND, keys.DECISION_API_VERSION, Source.KOPF,
            f"{_BY_JOB}: the operator's own record of a placement", "its job's; admission woken",
            index_fn=decisions_by_job, on_event=decision_event,
        ),
        Watched(
            Index.PODGROUPS_BY_JOB, "PodGroup", None, Source.KOPF,
            f"{_BY_JOB}: the one named after its job", _OWNER, mode=Mode.GANG,
            index_fn=podgroups_by_job, on_event=child_deleted, when=deleted,
        ),
        # Every cluster has two (system-node-critical, system-cluster-critical): their first event
        # says Kopf's indices are all complete, since Kopf calls event handlers only then.
        Watched(
            Index.PRIORITIES_BY_NAME, "PriorityClass", "scheduling.k8s.io/v1", Source.KOPF,
            "name: its value", "none; the first event opens the workers for Kopf's indices",
            index_fn=priorities_by_name, on_event=kopf_indexed,
        ),
        Watched(
            Index.QUOTAS_BY_NAMESPACE, "ResourceQuota", "v1", Source.KOPF,
            "namespace: the GPU resources and scopes of quotas that limit GPUs",
            "none; admission woken",
            index_fn=quotas_by_namespace, on_event=gpu_quota_event, when=limits_gpus,
        ),
        Watched(
            Index.GPU_CLASSES_BY_NAME, "DeviceClass", keys.DRA_API_VERSION, Source.KOPF,
            "name: the extended resource NVIDIA's GPU class maps to", "none", mode=Mode.DRA,
            index_fn=gpu_classes_by_name,
        ),
    )
}  # fmt: skip


def informed(*, dra: bool) -> list[Index]:
    """The indices the operator's informers fill, in its binding mode."""
    return [
        w.index
        for w in WATCHED.values()
        if w.source is Source.INFORMER and w.watched(dra=dra, gang=False)
    ]


def informer_handler(rt: Runtime, index: Index) -> Callable[[str | None, JSON], Any]:
    """What the informer of ``index``'s kind gives each event to."""
    handle = WATCHED[index].handle
    assert handle is not None, f"{index} is not an informer's"
    return handle(rt)


def register(
    registry: kopf.OperatorRegistry,
    *,
    gang_api_version: str | None,
    dra: bool = False,
) -> None:
    """Attach Kopf's indices and event handlers of the Kopf rows of :data:`WATCHED`: PodGroups
    only in gang mode, DRA's kinds only in the dra binding mode. Volcano's HyperNodes are
    listed, not watched (:func:`follow_hypernodes`).

    Index ids are given as plain strings: Kopf formats a handler with ``repr`` of its id at
    every call, and an enum member's took 1 % of a profile's samples in ``make bench``."""
    for w in WATCHED.values():
        if w.source is not Source.KOPF or not w.watched(dra=dra, gang=bool(gang_api_version)):
            continue
        # A PodGroup API installed after the operator started is watched once it is served
        # (Kopf waits for a kind it does not find).
        api_version = w.api_version or gang_api_version
        assert api_version is not None, w
        assert w.index_fn is not None, w
        kind = resource(api_version, w.kind)
        kopf.index(*kind, id=w.index.value, registry=registry)(w.index_fn)
        if w.on_event is not None:
            kopf.on.event(*kind, when=w.when, registry=registry)(w.on_event)

"""What ``mpijob get`` and ``mpijob list`` show of a job and its pods, as plain data.

Pure: MPIJob and Pod bodies (dicts, as the API returns them) and ``now`` in, frozen views out;
:mod:`mpijob.console.render` turns them into tables. The status words are arena's (PENDING,
RUNNING, SUCCEEDED, FAILED) plus upstream's SUSPENDED and RESTARTING.

A job's GPU count is what its spec requests; a pod's is what that pod requests. Pods come and
go (not yet created, suspended, deleted by ``cleanPodPolicy`` or the launcher Job's TTL once the
job finishes), so a count summed over live pods would say 0 for every finished job.

Of a placed worker three GPU sets can be known, all as indices on its node: the GPUs placement
chose (``mpijob.io/gpu-ids``), those the scheduler allocated to its DRA claim (``<pod>-gpus``,
device ``gpu-<i>``), and those the node agent found its containers hold when they differ
(``mpijob.io/gpu-actual``, UUIDs, turned into indices with the pod's own UUIDs and its node's
topology). An allocated or actual set other than the chosen one is a placement not honoured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from mpijob import keys
from mpijob.api.models import parse_time
from mpijob.api.resources import gpu_ids
from mpijob.desired.claims import allocated_devices, claim_name
from mpijob.desired.observed import pod_failure
from mpijob.objects import JSON
from mpijob.pods.predicates import template_gpus

TRAINER: Final = "MPIJOB"
NONE: Final = "N/A"

#: Condition types in the order they decide the status: a finished job stays finished even
#: though its Running condition may still read True for a moment.
_STATUS_BY_CONDITION: Final = (
    (keys.COND_SUCCEEDED, "SUCCEEDED"),
    (keys.COND_FAILED, "FAILED"),
    (keys.COND_SUSPENDED, "SUSPENDED"),
    (keys.COND_RESTARTING, "RESTARTING"),
    (keys.COND_RUNNING, "RUNNING"),
)
FINAL_STATUSES: Final = frozenset({"SUCCEEDED", "FAILED"})

#: Pods of a replica type whose spec leaves ``replicas`` out: upstream's defaults.
_DEFAULT_REPLICAS: Final = {keys.REPLICA_LAUNCHER: 1, keys.REPLICA_WORKER: 0}


@dataclass(frozen=True)
class Instance:
    """One pod of a job: a row of the instance table."""

    name: str
    status: str
    age: str
    is_chief: bool
    """The launcher (arena calls it the chief)."""
    gpus: int
    """GPUs the pod requests."""
    gpu_ids: str
    """GPU indices on its node that placement chose (``mpijob.io/gpu-ids``), else N/A."""
    node: str
    gpu_allocated: str = ""
    """GPU indices the scheduler allocated to the pod's DRA claim; empty when it has none."""
    gpu_actual: str = ""
    """GPUs the node agent found its containers hold (``mpijob.io/gpu-actual``), as indices
    where known, else UUIDs; empty when the agent reported nothing (they match, or unchecked)."""

    @property
    def not_honoured(self) -> bool:
        """The GPUs allocated or held are not those placement chose."""
        chosen = set(self.gpu_ids.split(","))
        return any(
            known and set(known.split(",")) != chosen
            for known in (self.gpu_allocated, self.gpu_actual)
        )


@dataclass(frozen=True)
class JobView:
    """One job as ``mpijob get`` prints it."""

    name: str
    namespace: str
    status: str
    priority: str
    duration: str
    trainer: str
    gpus: int
    """GPUs the job's spec requests (:func:`requested_gpus`), whether or not its pods exist."""
    placement: str | None
    """The one-line summary of the job's PlacementDecision, if it holds one."""
    instances: tuple[Instance, ...]
    why: tuple[str, ...] = ()
    """What the job's status says went wrong or is left over: the True ``Failed`` condition's
    message (which names the first pod failure) and ``WorkersLeftRunning``'s."""

    @property
    def launcher_node(self) -> str:
        return next((i.node for i in self.instances if i.is_chief), NONE)

    @property
    def allocated_known(self) -> bool:
        return any(i.gpu_allocated for i in self.instances)

    @property
    def actual_known(self) -> bool:
        return any(i.gpu_actual for i in self.instances)

    @property
    def not_honoured(self) -> bool:
        return any(i.not_honoured for i in self.instances)


def human_duration(seconds: float) -> str:
    """kubectl's short age: 45s, 3m12s under 10 minutes, 4h, 2d3h, 12d."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    minutes, s = divmod(s, 60)
    if minutes < 10:
        return f"{minutes}m{s}s" if s else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours == 0:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    if days == 0:
        return f"{hours}h"
    return f"{days}d{hours}h" if hours and days < 8 else f"{days}d"


def job_status(job: JSON) -> str:
    """Arena's status word for a job, from its True conditions."""
    true = {
        c.get("type")
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    return next((word for type_, word in _STATUS_BY_CONDITION if type_ in true), "PENDING")


def job_duration(job: JSON, now: datetime) -> str:
    """From start (else creation) to completion (else now)."""
    status = job.get("status") or {}
    start = parse_time(status.get("startTime")) or parse_time(
        (job.get("metadata") or {}).get("creationTimestamp")
    )
    if start is None:
        return NONE
    end = parse_time(status.get("completionTime")) or now
    return human_duration((end - start).total_seconds())


def job_why(job: JSON) -> tuple[str, ...]:
    """The job's True ``Failed`` and ``WorkersLeftRunning`` conditions: type, reason, message."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return tuple(
        f"{c.get('type')} ({c.get('reason')}): {c.get('message')}"
        for c in conditions
        if c.get("status") == "True"
        and c.get("type") in (keys.COND_FAILED, keys.COND_WORKERS_LEFT_RUNNING)
    )


def job_priority(job: JSON) -> str:
    """The gang's priority class, else the launcher's, else N/A."""
    spec = job.get("spec") or {}
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy") or {}
    if policy.get("priorityClass"):
        return str(policy["priorityClass"])
    launcher = (spec.get("mpiReplicaSpecs") or {}).get(keys.REPLICA_LAUNCHER) or {}
    pod_spec = (launcher.get("template") or {}).get("spec") or {}
    return str(pod_spec.get("priorityClassName") or NONE)


def pod_status(pod: JSON) -> str:
    """What kubectl's STATUS column would say, near enough: waiting reasons, Completed."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    phase = status.get("phase") or "Pending"
    if phase == "Succeeded":
        return "Completed"
    if phase == "Failed":
        # The kubelet's reason, as kubectl shows it: Evicted, OOMKilled, Error.
        failure = pod_failure(pod)
        return str(status.get("reason") or (failure.reason if failure else "Failed"))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    return str(phase)


def pod_gpus(pod: JSON) -> int:
    """GPUs a pod, or a pod template, requests (the operator's own reading of them): its
    ``nvidia.com/gpu``, or, for a worker given its GPUs through a claim (dra binding), the
    GPUs the claim pins."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(keys.GPU_CLAIM):
        return len(gpu_ids(annotations.get(keys.GPU_IDS)))
    return template_gpus(pod)


def requested_gpus(job: JSON) -> int:
    """GPUs the job's spec requests: for each replica type, its pods times one pod's GPUs.

    The launcher counts what its own template requests. ``runLauncherAsWorker`` gives it ranks
    but no resources: it holds the GPUs its template asks for, with the flag or without.
    """
    replica_specs = (job.get("spec") or {}).get("mpiReplicaSpecs") or {}
    total = 0
    for replica_type, default in _DEFAULT_REPLICAS.items():
        replica = replica_specs.get(replica_type)
        if not replica:
            continue
        replicas = replica.get("replicas")
        count = default if replicas is None else int(replicas)
        total += count * pod_gpus(replica.get("template") or {})
    return total


def allocated_gpus(claim: JSON | None) -> str:
    """The indices of the GPUs allocated to ``claim`` (devices ``gpu-<i>``), comma-separated."""
    names = [device for _, device in allocated_devices(claim or {})]
    indices = sorted(int(n[4:]) for n in names if n.startswith("gpu-") and n[4:].isdigit())
    others = [n for n in names if not (n.startswith("gpu-") and n[4:].isdigit())]
    return ",".join([*map(str, indices), *others])


def actual_gpus(pod: JSON, uuid_index: Mapping[str, int] | None = None) -> str:
    """``mpijob.io/gpu-actual`` of ``pod`` as indices where known (its own placed UUIDs, then
    ``uuid_index`` of its node), else the UUIDs; empty when absent."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    actual = _uuids(annotations.get(keys.GPU_ACTUAL))
    placed = _uuids(annotations.get(keys.GPU_UUIDS))
    # The pod's own UUIDs and indices are in the same order; a pair missing from one is skipped.
    ids = gpu_ids(annotations.get(keys.GPU_IDS))
    index = {**(uuid_index or {}), **dict(zip(placed, ids, strict=False))}
    known = sorted(index[u] for u in actual if u in index)
    return ",".join([*map(str, known), *(u for u in actual if u not in index)])


def _uuids(text: object) -> list[str]:
    return [u.strip() for u in str(text or "").split(",") if u.strip()]


def instance(
    pod: JSON,
    now: datetime,
    *,
    claim: JSON | None = None,
    uuid_index: Mapping[str, int] | None = None,
) -> Instance:
    """A row for ``pod``; ``claim`` is its DRA claim, ``uuid_index`` its node's UUID -> index."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    created = parse_time(meta.get("creationTimestamp"))
    return Instance(
        name=str(meta.get("name")),
        status=pod_status(pod),
        age=human_duration((now - created).total_seconds()) if created else NONE,
        is_chief=labels.get(keys.LABEL_JOB_ROLE) == keys.ROLE_LAUNCHER,
        gpus=pod_gpus(pod),
        gpu_ids=str((meta.get("annotations") or {}).get(keys.GPU_IDS) or NONE),
        node=str((pod.get("spec") or {}).get("nodeName") or NONE),
        gpu_allocated=allocated_gpus(claim),
        gpu_actual=actual_gpus(pod, uuid_index),
    )


def pod_claim_name(pod: JSON) -> str:
    """The name of the claim that would hold a worker's GPUs (``mpijob.io/gpu-claim``)."""
    meta = pod.get("metadata") or {}
    return str(
        (meta.get("annotations") or {}).get(keys.GPU_CLAIM) or claim_name(str(meta.get("name")))
    )


def job_view(
    job: JSON,
    pods: Iterable[JSON],
    now: datetime,
    *,
    decision: JSON | None = None,
    claims: Iterable[JSON] = (),
    uuid_index: Mapping[str, Mapping[str, int]] | None = None,
) -> JobView:
    """The job and its pods (launcher first, then workers by index); the placement summary
    of ``decision``, the job's PlacementDecision, if it was written for this job.

    ``claims`` are the job's ResourceClaims (each worker's is ``<pod>-gpus``); ``uuid_index``
    maps, per node, GPU UUIDs to indices (from the node's topology annotation).
    """
    by_name = {str((c.get("metadata") or {}).get("name")): c for c in claims}
    meta = job.get("metadata") or {}
    spec = (decision or {}).get("spec") or {}
    placement = (
        spec.get("summary") if (spec.get("job") or {}).get("uid") == meta.get("uid") else None
    )
    rows = sorted(
        (
            instance(
                p,
                now,
                claim=by_name.get(pod_claim_name(p)),
                uuid_index=(uuid_index or {}).get(str((p.get("spec") or {}).get("nodeName"))),
            )
            for p in pods
        ),
        key=_instance_order,
    )
    return JobView(
        name=str(meta.get("name")),
        namespace=str(meta.get("namespace") or ""),
        status=job_status(job),
        priority=job_priority(job),
        duration=job_duration(job, now),
        trainer=TRAINER,
        gpus=requested_gpus(job),
        placement=placement or None,
        instances=tuple(rows),
        why=job_why(job),
    )


def _instance_order(row: Instance) -> tuple[bool, int, str]:
    _, _, index = row.name.rpartition("-")
    return (not row.is_chief, int(index) if index.isdigit() else -1, row.name)


def pods_by_job(pods: Iterable[JSON]) -> dict[tuple[str, str], list[JSON]]:
    """Pods grouped by (namespace, job-name label); pods without the label are left out.

    The namespace is part of the key because jobs of the same name in two namespaces are two
    jobs when every namespace is listed.
    """
    groups: dict[tuple[str, str], list[JSON]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get(keys.LABEL_JOB_NAME)
        if job:
            groups.setdefault((str(meta.get("namespace") or ""), str(job)), []).append(pod)
    return groups


def job_views(jobs: Sequence[JSON], pods: Iterable[JSON], now: datetime) -> list[JobView]:
    """Every job with its own pods, by namespace, then name (as ``kubectl get -A`` orders)."""
    groups = pods_by_job(pods)
    views = [job_view(j, groups.get(_key(j), []), now) for j in jobs]
    return sorted(views, key=lambda v: (v.namespace, v.name))


def _key(body: JSON) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name"))

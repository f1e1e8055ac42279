"""One sync of one MPIJob, as data: upstream's ``syncHandler`` order, without the I/O.

Given the validated, defaulted job and what the caches hold of its children, :func:`plan`
returns the ordered writes that bring the cluster to the desired state and the status that
follows from them. The reconciler applies the actions in order, stops at the first one that
fails (as upstream returns early), and writes the status last.

Differences from upstream, on purpose (see the README's compatibility section):
- scale-down deletes workers by name (``<job>-worker-<i>`` with ``i >= replicas``), not by the
  ``replica-index`` label, so ``runLauncherAsWorker`` no longer deletes and recreates the last
  worker, and a pod missing the label no longer stops the scan;
- workers are not created until the job is admitted when our own gang admission is on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import config_map, launcher, names, observed, podgroup, status, worker
from mpijob.desired.events import Event
from mpijob.desired.gang_mode import OFF, GangMode
from mpijob.desired.status import Counter

JSON = dict[str, Any]


# --- what the caller observed ------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """The job's children as the caches see them; only objects the job controls."""

    launcher_job: JSON | None = None
    """The launcher batch/v1 Job, if it exists."""
    pods: Sequence[JSON] = ()
    """Pods labelled with the job's name: workers and launcher pods."""
    pod_group: JSON | None = None
    """The job's PodGroup, in gang mode, if it exists."""


@dataclass(frozen=True)
class PodPlacement:
    """Where one worker goes, decided by the placement engine: merged into the built pod."""

    node: str
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class Options:
    cluster_domain: str = ""
    gang: GangMode = OFF
    priority_values: Mapping[str, int] = field(default_factory=dict)
    """PriorityClass name -> value, for the PodGroup's minResources."""
    admitted: bool = True
    """False while our own gang admission holds the job back: no workers, no launcher."""
    placement: Sequence[PodPlacement] | None = None
    """Per worker index, when the job is placed topology-aware."""


# --- what the caller must do -------------------------------------------------------------------


@dataclass(frozen=True)
class Ensure:
    """Create ``obj`` if it does not exist; if it exists, keep it (after an ownership check)."""

    obj: JSON


@dataclass(frozen=True)
class EnsureService:
    """Create the Service, or correct its selector and publishNotReadyAddresses if drifted."""

    job: MPIJob


@dataclass(frozen=True)
class EnsureSecret:
    """Create the SSH Secret with a new key pair if missing (or its key set is wrong)."""

    job: MPIJob


@dataclass(frozen=True)
class EnsureConfigMap:
    """Create the ConfigMap, or update its data when it differs."""

    obj: JSON


@dataclass(frozen=True)
class ApplyPodGroup:
    """Create the PodGroup, or replace its spec when :attr:`update` is set."""

    obj: JSON
    update: bool


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    name: str
    uid: str | None = None


@dataclass(frozen=True)
class UpdateLauncher:
    """Suspend the launcher Job (a patch), or resume it: clear ``status.startTime`` if set,
    then replace the Job with the synced scheduling directives and ``suspend: false``."""

    patch: JSON | None = None
    replace: JSON | None = None
    clear_start_time: bool = False


Action = (
    Ensure
    | EnsureService
    | EnsureSecret
    | EnsureConfigMap
    | ApplyPodGroup
    | Delete
    | UpdateLauncher
)


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    result: status.StatusResult | None = None
    """The status to write when ``result.changed`` (or :attr:`force_status`)."""
    force_status: bool = False
    """Upstream writes the finish-time cleanup status unconditionally."""
    events: list[Event] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)


# --- the sync ----------------------------------------------------------------------------------


def workers_of(job: MPIJob, pods: Sequence[JSON]) -> list[JSON]:
    return [p for p in pods if _role(p) == keys.ROLE_WORKER and names.is_controlled_by(p, job)]


def launcher_pods_of(pods: Sequence[JSON]) -> list[JSON]:
    return [p for p in pods if _role(p) == keys.ROLE_LAUNCHER]


def plan(job: MPIJob, seen: Observed, now: datetime, options: Options = Options()) -> Plan:
    """The writes and the status of one sync of a valid, defaulted job."""
    out = Plan()
    created = status.mark_created(job, now)
    out.events += created.events
    out.counters += created.counters
    job = job.model_copy(update={"status": created.status})
    workers = workers_of(job, seen.pods)

    if status.finished_with_completion(job.status):
        if status.cleans_up_at_finish(job):
            out.actions += _delete_workers(job, workers)
            out.actions += _delete_pod_group(job, seen, options)
            out.result = status.StatusResult(status.finished_cleanup_status(job), changed=True)
            out.force_status = True
        else:
            out.result = created
        return out

    launcher_job = seen.launcher_job
    suspended = job.spec.suspended
    if not status.launcher_done(launcher_job):
        out.actions.append(EnsureService(job))
        running = sorted(observed.name_of(p) for p in workers if observed.phase_of(p) == "Running")
        out.actions.append(
            EnsureConfigMap(config_map.build_config_map(job, running, options.cluster_domain))
        )
        out.actions.append(EnsureSecret(job))
        if not suspended and options.admitted:
            out.actions += _pod_group(job, seen, options)
            created_workers, worker_actions = _workers(job, workers, options)
            out.actions += worker_actions
            workers = created_workers
        if launcher_job is None and options.admitted and status.launcher_may_start(job, workers):
            built, template_events = launcher.build_launcher_job(job)
            out.events += template_events
            built["spec"]["template"] = podgroup.decorate_pod(
                built["spec"]["template"], job.name, options.gang
            )
            out.actions.append(Ensure(built))

    if launcher_job is not None:
        out.actions += _suspend_or_resume(job, launcher_job, options)

    if suspended:
        out.actions += _delete_workers(job, workers)
        out.actions += _delete_pod_group(job, seen, options)

    result = status.compute_status(
        job,
        launcher_job=launcher_job,
        launcher_pods=launcher_pods_of(seen.pods),
        worker_pods=workers,
        now=now,
    )
    result.changed = result.changed or created.changed
    out.result = result
    out.events += result.events
    out.counters += result.counters
    return out


def _role(pod: JSON) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(keys.LABEL_JOB_ROLE, ""))


def _pod_group(job: MPIJob, seen: Observed, options: Options) -> list[Action]:
    if not options.gang.enabled:
        return []
    desired = podgroup.build_pod_group(
        job, mode=options.gang, priority_values=options.priority_values
    )
    if seen.pod_group is None:
        return [ApplyPodGroup(desired, update=False)]
    if podgroup.pod_group_needs_update(seen.pod_group, desired):
        return [ApplyPodGroup(desired, update=True)]
    return []


def _delete_pod_group(job: MPIJob, seen: Observed, options: Options) -> list[Action]:
    if not options.gang.enabled or seen.pod_group is None:
        return []
    meta = seen.pod_group.get("metadata") or {}
    return [Delete(seen.pod_group["apiVersion"], "PodGroup", job.name, meta.get("uid"))]


def _workers(job: MPIJob, workers: list[JSON], options: Options) -> tuple[list[JSON], list[Action]]:
    """Scale down by name, create the missing; returns the projected worker list too."""
    wanted = names.worker_names(job)
    wanted_set = set(wanted)
    actions: list[Action] = []
    projected = []
    by_name = {observed.name_of(p): p for p in workers}
    for pod in workers:
        if observed.name_of(pod) not in wanted_set:
            actions.append(_delete_pod(pod))
    for index, name in enumerate(wanted):
        if name in by_name:
            projected.append(by_name[name])
            continue
        pod = podgroup.decorate_pod(
            worker.build_worker(job, index, options.cluster_domain), job.name, options.gang
        )
        if options.placement is not None:
            _place(pod, options.placement[index])
        actions.append(Ensure(pod))
        projected.append(pod)
    return projected, actions


def _place(pod: JSON, where: PodPlacement) -> None:
    meta = pod.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **where.annotations}
    spec = pod.setdefault("spec", {})
    term = {
        "matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [where.node]}
        ]
    }
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    # Node selector terms are ORed: the placement must hold in every one of the user's terms.
    required["nodeSelectorTerms"] = [
        {**t, "matchExpressions": [*(t.get("matchExpressions") or []), *term["matchExpressions"]]}
        for t in terms
    ]


def _delete_pod(pod: JSON) -> Delete:
    meta = pod.get("metadata") or {}
    return Delete("v1", "Pod", str(meta.get("name")), meta.get("uid"))


def _delete_workers(job: MPIJob, workers: list[JSON]) -> list[Action]:
    doomed = set(status.worker_pods_to_delete(job, workers))
    return [_delete_pod(p) for p in workers if observed.name_of(p) in doomed]


def _suspend_or_resume(job: MPIJob, launcher_job: JSON, options: Options) -> list[Action]:
    job_suspended = bool((launcher_job.get("spec") or {}).get("suspend"))
    if job.spec.suspended and not job_suspended:
        return [UpdateLauncher(patch={"spec": {"suspend": True}})]
    if not job.spec.suspended and job_suspended:
        built, _ = launcher.build_launcher_job(job)
        built["spec"]["template"] = podgroup.decorate_pod(
            built["spec"]["template"], job.name, options.gang
        )
        synced = launcher.sync_scheduling_directives(launcher_job, built)
        synced["spec"]["suspend"] = False
        synced.pop("status", None)
        started = (launcher_job.get("status") or {}).get("startTime") is not None
        return [UpdateLauncher(replace=synced, clear_start_time=started)]
    return []

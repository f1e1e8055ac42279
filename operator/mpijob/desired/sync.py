"""One sync of one MPIJob, as data: upstream's ``syncHandler`` order, without the I/O.

Given the validated, defaulted job and what the caches hold of its children, :func:`plan`
returns the ordered writes that bring the cluster to the desired state. Each action is complete:
the built object, or the exact patch a drifted child needs, decided here from the observation;
the handler only dispatches them, in order, and stops at the first that fails (as upstream
returns early). The status is :func:`mpijob.desired.status.next_status`'s.

Every sync ensures every child (level-based, as upstream): a child missing from the observation
is created, one that drifted is corrected, so an object deleted or edited by hand comes back.

Differences from upstream, on purpose (see docs/compatibility.md):
- scale-down deletes workers by name (``<job>-worker-<i>`` with ``i >= replicas``), not by the
  ``replica-index`` label, so ``runLauncherAsWorker`` no longer deletes and recreates the last
  worker, and a pod missing the label no longer stops the scan;
- workers are not created until the job is admitted when our own gang admission is on;
- in the DRA GPU binding mode, a placed worker's ResourceClaim is created just before it;
- with ``launcherCreationPolicy: WaitForWorkersReady``, a resumed job's launcher Job stays
  suspended until every worker is Ready again (upstream resumes it at once, mpi-operator#615);
- ``runPolicy.ttlSecondsAfterFinished`` is applied here, not by the Job controller: the launcher
  Job is deleted once the job's status records its end and the TTL has passed since
  ``completionTime`` (upstream copies it onto the Job, whose TTL controller may delete a finished
  launcher before its outcome is read; the next sync then finds no launcher and runs the job
  again), and a job whose status says it finished never gets a launcher again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from mpijob.api import JSON, MPIJob
from mpijob.desired import (
    claims,
    compute_domain,
    config_map,
    launch,
    launcher,
    names,
    observed,
    podgroup,
    service,
    ssh,
    status,
    worker,
)
from mpijob.desired.events import Event
from mpijob.desired.gang_mode import OFF, GangKind, GangMode
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.desired.observed import Observed

__all__ = [
    "Action",
    "Create",
    "Delete",
    "Observed",
    "Options",
    "Patch",
    "Plan",
    "PodPlacement",
    "Replace",
    "plan",
]


@dataclass(frozen=True)
class PodPlacement:
    """Where one worker goes, decided by the placement engine: merged into the built pod."""

    node: str
    annotations: Mapping[str, str]
    channel_template: str | None = None
    """The job's ComputeDomain channel template, when it spans nodes of one NVLink clique."""


@dataclass(frozen=True)
class Options:
    cluster_domain: str = ""
    gang: GangMode = OFF
    priority_values: Mapping[str, int] = field(default_factory=dict)
    """PriorityClass name -> value, for the PodGroup's minResources."""
    gang_topology_key: str = ""
    """With the Workload API, the node label kube-scheduler keeps the gang within."""
    gang_expired: bool = False
    """With the Workload API, the gang is past its ``scheduleTimeoutSeconds`` and never formed
    (:func:`mpijob.gang.native.expired`): once the job is finished, its pods and PodGroup go."""
    admitted: bool = True
    """False while our own gang admission holds the job back: no workers, no launcher."""
    placement: Sequence[PodPlacement] | None = None
    """Per worker index, when the job is placed topology-aware."""
    gpu_binding: GpuBinding = GpuBinding.ANNOTATIONS
    """How a placed worker gets its GPUs; in DRA mode its claim is created just before it."""
    new_key_pair: Callable[[], tuple[bytes, bytes]] = ssh.generate_ssh_key_pair
    """Makes the SSH key pair of a Secret that must be (re)created."""
    new_launch_keys: Callable[[], dict[str, bytes]] = launch.generate_keys
    """Makes the launch keys of a job with ``mpijob.io/launch: agent``."""
    launch_image: str = ""
    """The image holding the launch agent (``--launch-image``, or the operator's own)."""


# --- what the caller must do -------------------------------------------------------------------


@dataclass(frozen=True)
class Create:
    """Create ``obj``. If the name is taken, the object must be controlled by the job: one that
    is not is never touched (upstream's ``ErrResourceExists``)."""

    obj: JSON


@dataclass(frozen=True)
class Patch:
    """A JSON merge patch on a child (or the job) in the job's namespace."""

    api_version: str
    kind: str
    name: str
    patch: JSON
    subresource: str = ""
    deferrable: bool = False
    """Nothing waits on it (``discover_hosts.sh`` following workers that started): it may go out
    after the sync, behind the requests jobs wait for."""


@dataclass(frozen=True)
class Replace:
    """Replace ``obj`` (a PUT; its ``resourceVersion`` makes a concurrent change a conflict)."""

    obj: JSON


@dataclass(frozen=True)
class Delete:
    api_version: str
    kind: str
    name: str
    uid: str | None = None
    """A precondition, so that a same-named successor is never deleted."""
    grace_seconds: int | None = None
    """None: the object's own grace period (a pod's ``terminationGracePeriodSeconds``)."""


Action = Create | Patch | Replace | Delete


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    """Events about the built children (the job's status Events are the status function's)."""
    projected: Observed = field(default_factory=Observed)
    """The children as they will be once the actions succeed: what the status is computed
    from, as upstream computes it from the objects its creates return."""
    requeue_after: float | None = None
    """Seconds until the job needs another sync though nothing it watches changes (its
    launcher Job's TTL runs out then)."""


# --- the sync ----------------------------------------------------------------------------------


def plan(job: MPIJob, seen: Observed, now: datetime, options: Options = Options()) -> Plan:
    """The writes of one sync of a valid, defaulted job."""
    out = Plan(projected=seen)
    job = job.model_copy(update={"status": status.mark_created(job, now).status})
    workers = observed.workers_of(job, seen.pods)

    if status.finished_with_completion(job.status):
        if options.gang_expired:
            # Its pods never ran together; one left pending would be bound later, alone.
            out.actions += [_delete_pod(p) for p in workers]
            out.actions += _delete_claims(seen)
            out.actions += _delete_pod_group(job, seen, options)
            if seen.launcher_job is not None and not (
                (seen.launcher_job.get("spec") or {}).get("suspend")
            ):  # the Job controller removes its pending pod
                suspend = {"spec": {"suspend": True}}
                out.actions.append(
                    Patch("batch/v1", "Job", observed.name_of(seen.launcher_job), suspend)
                )
        elif status.cleans_up_at_finish(job):
            out.actions += _delete_workers(job, workers)
            out.actions += _delete_claims(seen, keep=_kept(job, workers))
            out.actions += _delete_pod_group(job, seen, options)
        expire, out.requeue_after = _launcher_ttl(job, seen.launcher_job, now)
        out.actions += expire
        return out

    launcher_job = seen.launcher_job
    suspended = job.spec.suspended
    if not status.launcher_done(launcher_job):
        out.actions += _service(job, seen)
        running = sorted(observed.name_of(p) for p in workers if observed.phase_of(p) == "Running")
        out.actions += _config_map(
            config_map.build_config_map(job, running, options.cluster_domain), seen
        )
        out.actions += _secret(job, seen, options)
        if not suspended and options.admitted:
            out.actions += _pod_group(job, seen, options)
            created_workers, worker_actions = _workers(job, workers, seen, options)
            out.actions += worker_actions
            new = [
                a.obj for a in worker_actions if isinstance(a, Create) and a.obj["kind"] == "Pod"
            ]
            out.projected = replace(out.projected, pods=[*seen.pods, *new])
            workers = created_workers
        if (
            launcher_job is None
            and not job.status.finished  # its launcher ran; a missing one was not lost, but done
            and options.admitted
            and status.launcher_may_start(job, workers)
        ):
            built, template_events = launcher.build_launcher_job(job, options.launch_image)
            out.events += template_events
            built["spec"]["template"] = podgroup.decorate_pod(
                built["spec"]["template"], job.name, options.gang
            )
            out.actions.append(Create(built))
            out.projected = replace(out.projected, launcher_job=built)

    if launcher_job is not None:
        out.actions += _suspend_or_resume(job, launcher_job, workers, options)
        if (launcher_job.get("spec") or {}).get("ttlSecondsAfterFinished") is not None:
            # Made by an operator that copied the TTL: the Job controller must not delete it
            # before this job's status records its end.
            ttl_off = {"spec": {"ttlSecondsAfterFinished": None}}
            out.actions.append(Patch("batch/v1", "Job", observed.name_of(launcher_job), ttl_off))

    if suspended:
        out.actions += _delete_workers(job, workers)
        out.actions += _delete_claims(seen, keep=_kept(job, workers))
        out.actions += _delete_pod_group(job, seen, options)
    return out


def _launcher_ttl(
    job: MPIJob, launcher_job: JSON | None, now: datetime
) -> tuple[list[Action], float | None]:
    """A finished job's launcher Job goes ``ttlSecondsAfterFinished`` after ``completionTime``
    (with its pods: the deletion propagates); before then, the seconds left."""
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    finished_at = job.status.completion_time
    if ttl is None or launcher_job is None or finished_at is None:
        return [], None
    left = (finished_at - now).total_seconds() + ttl
    if left > 0:
        return [], left
    uid = (launcher_job.get("metadata") or {}).get("uid")
    return [Delete("batch/v1", "Job", observed.name_of(launcher_job), uid)], None


def _kept(job: MPIJob, workers: list[JSON]) -> set[str]:
    """Claims of the workers that stay (cleanPodPolicy keeps finished or all pods)."""
    doomed = set(status.worker_pods_to_delete(job, workers))
    return {
        claims.claim_name(observed.name_of(p)) for p in workers if observed.name_of(p) not in doomed
    }


def _service(job: MPIJob, seen: Observed) -> list[Action]:
    if seen.service is None:
        return [Create(service.build_service(job))]
    drift = service.service_drift(job, seen.service)
    return [Patch("v1", "Service", names.service_name(job), {"spec": drift})] if drift else []


def _config_map(desired: JSON, seen: Observed) -> list[Action]:
    if seen.config_map is None:
        return [Create(desired)]
    live = config_map.data_digests(seen.config_map)
    wanted = config_map.digests(desired["data"])
    if live == wanted:
        return []
    changed = {k for k in {*live, *wanted} if live.get(k) != wanted.get(k)}
    if config_map.OTHER_KEYS in live:
        # Keys of someone else's, whose names the cache does not keep: the whole data replaced.
        version = (seen.config_map.get("metadata") or {}).get("resourceVersion")
        return [
            Replace({**desired, "metadata": {**desired["metadata"], "resourceVersion": version}})
        ]
    deferrable = changed == {config_map.DISCOVER_HOSTS_KEY}
    return [
        Patch(
            "v1",
            "ConfigMap",
            observed.name_of(desired),
            {"data": desired["data"]},
            deferrable=deferrable,
        )
    ]


def _secret(job: MPIJob, seen: Observed, options: Options) -> list[Action]:
    """The job's one Secret: its launch keys with the launch agent, else its SSH keys."""
    live = seen.secret
    if live is not None and observed.name_of(live) != names.secret_name(job):
        live = None  # the other kind's, from before the job's launch annotation changed
    if job.launch_agent:
        stale = live is None or launch.secret_needs_regeneration(live)
        built = launch.build_secret(job, options.new_launch_keys()) if stale else None
    else:
        stale = live is None or ssh.secret_needs_regeneration(live)
        built = ssh.build_ssh_secret(job, *options.new_key_pair()) if stale else None
    if built is None:
        return []
    if live is None:
        return [Create(built)]
    version = (live.get("metadata") or {}).get("resourceVersion")
    return [Replace({**built, "metadata": {**built["metadata"], "resourceVersion": version}})]


def _pod_group(job: MPIJob, seen: Observed, options: Options) -> list[Action]:
    if not options.gang.enabled:
        return []
    desired = podgroup.build_pod_group(
        job,
        mode=options.gang,
        priority_values=options.priority_values,
        topology_key=options.gang_topology_key,
    )
    native = options.gang.kind is GangKind.WORKLOAD_API
    if seen.pod_group is None:
        if not native:
            return [Create(desired)]
        # The Workload goes with its PodGroup; one the job already controls is left as it is.
        return [Create(podgroup.build_workload(job, options.gang_topology_key)), Create(desired)]
    if podgroup.pod_group_needs_update(seen.pod_group, desired):
        if native:
            if (quorum := podgroup.native_patch(seen.pod_group, desired)) is not None:
                return [Patch(desired["apiVersion"], "PodGroup", job.name, quorum)]
            # Otherwise immutable: deleted, and made again once gone. Kubernetes keeps it (a
            # finalizer) until no pod names it: the pods' next creation.
            deleting = (seen.pod_group.get("metadata") or {}).get("deletionTimestamp")
            return [] if deleting else _delete_pod_group(job, seen, options)
        patch = podgroup.update_patch(seen.pod_group, desired)
        return [Patch(desired["apiVersion"], "PodGroup", job.name, patch)]
    return []


def _delete_pod_group(job: MPIJob, seen: Observed, options: Options) -> list[Action]:
    if not options.gang.enabled or seen.pod_group is None:
        return []
    meta = seen.pod_group.get("metadata") or {}
    return [Delete(seen.pod_group["apiVersion"], "PodGroup", job.name, meta.get("uid"))]


def _workers(
    job: MPIJob, workers: list[JSON], seen: Observed, options: Options
) -> tuple[list[JSON], list[Action]]:
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
            worker.build_worker(job, index, options.cluster_domain, options.launch_image),
            job.name,
            options.gang,
        )
        if options.placement is not None:
            _place(pod, options.placement[index])
            bound = claims.bind_worker(job, pod, options.gpu_binding)
            if bound.claim is not None:
                claim_actions, ready = _claim(bound.claim, seen)
                actions += claim_actions
                if not ready:
                    continue  # the pod waits until its claim asks for the right GPUs
            pod = bound.pod
        actions.append(Create(pod))
        projected.append(pod)
    return projected, actions


def _place(pod: JSON, where: PodPlacement) -> None:
    if where.channel_template is not None:
        compute_domain.with_channel(pod, where.channel_template)
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


def _claim(desired: JSON, seen: Observed) -> tuple[list[Action], bool]:
    """The actions for a worker's claim, and whether its pod may be created now.

    A missing claim is created (before its pod); one asking for other GPUs (the job was placed
    anew) is deleted and the pod waits until it is gone, as does the pod of a claim still being
    deleted: a claim cannot be edited, and a pod must never use a stale one."""
    live = seen.claims.get(observed.name_of(desired))
    if live is None:
        return [Create(desired)], True
    if (live.get("metadata") or {}).get("deletionTimestamp"):
        return [], False
    if claims.claim_drifted(live, desired):
        return [_delete_claim(live)], False
    return [], True


def _delete_claim(claim: JSON) -> Delete:
    meta = claim.get("metadata") or {}
    return Delete(
        str(claim.get("apiVersion")), "ResourceClaim", str(meta.get("name")), meta.get("uid")
    )


def _delete_claims(seen: Observed, keep: set[str] | None = None) -> list[Action]:
    """Release the workers' claims (suspension, cleanup), all but those of ``keep`` pods."""
    return [
        _delete_claim(c)
        for name, c in sorted(seen.claims.items())
        if not (c.get("metadata") or {}).get("deletionTimestamp")
        and (keep is None or name not in keep)
    ]


def _delete_pod(pod: JSON) -> Delete:
    meta = pod.get("metadata") or {}
    return Delete("v1", "Pod", str(meta.get("name")), meta.get("uid"))


def _delete_workers(job: MPIJob, workers: list[JSON]) -> list[Action]:
    doomed = set(status.worker_pods_to_delete(job, workers))
    return [_delete_pod(p) for p in workers if observed.name_of(p) in doomed]


def _suspend_or_resume(
    job: MPIJob, launcher_job: JSON, workers: list[JSON], options: Options
) -> list[Action]:
    """Suspend the launcher Job (a patch), or resume it: clear ``status.startTime`` if set,
    then replace the Job with the synced scheduling directives and ``suspend: false``. With
    WaitForWorkersReady a resume waits until every worker is reachable again
    (:func:`~mpijob.desired.status.launcher_may_resume`); each worker's change syncs again."""
    name = observed.name_of(launcher_job)
    job_suspended = bool((launcher_job.get("spec") or {}).get("suspend"))
    if job.spec.suspended and not job_suspended:
        return [Patch("batch/v1", "Job", name, {"spec": {"suspend": True}})]
    if not job.spec.suspended and job_suspended and status.launcher_may_resume(job, workers):
        built, _ = launcher.build_launcher_job(job, options.launch_image)
        built["spec"]["template"] = podgroup.decorate_pod(
            built["spec"]["template"], job.name, options.gang
        )
        synced = launcher.sync_scheduling_directives(launcher_job, built)
        synced["spec"]["suspend"] = False
        synced.pop("status", None)
        actions: list[Action] = []
        if (launcher_job.get("status") or {}).get("startTime") is not None:
            clear = {"status": {"startTime": None}}
            actions.append(Patch("batch/v1", "Job", name, clear, subresource="status"))
        return [*actions, Replace(synced)]
    return []

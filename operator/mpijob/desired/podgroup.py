"""PodGroups for Volcano and scheduler-plugins, and the decoration that ties pods to them.

Built as upstream mpi-operator builds them (``pkg/controller/podgroup.go``): one PodGroup per
MPIJob, named after it, in its namespace, controlled by it, with no labels.

* ``minMember``: ``schedulingPolicy.minAvailable``, else Worker replicas + 1 (the +1 also with
  ``runLauncherAsWorker``).
* Volcano (``scheduling.volcano.sh/v1beta1``): ``queue`` from ``schedulingPolicy.queue``, else the
  MPIJob annotation ``scheduling.volcano.sh/queue-name``; ``priorityClassName`` from
  ``schedulingPolicy.priorityClass``, else the Launcher template's, else the Worker's;
  ``minResources``. Pods get ``schedulerName: volcano`` and the annotation
  ``scheduling.k8s.io/group-name``.
* scheduler-plugins (``scheduling.x-k8s.io/v1alpha1``): ``minResources`` and
  ``scheduleTimeoutSeconds`` (0 when unset). Pods get the flag's ``schedulerName`` and the label
  ``scheduling.x-k8s.io/pod-group``.

* Kubernetes' own (``scheduling.k8s.io/v1beta1``, ``--gang-scheduling=workload-api``): a Workload
  with one PodGroup template, ``gang.minCount`` the same quorum, and a PodGroup made from it.
  The PodGroup's ``minCount`` may change (:func:`native_patch`); the rest of both is immutable,
  so a PodGroup that differs otherwise is deleted and made again (pods find a group by name).
  Pods get ``spec.schedulingGroup.podGroupName``, keep their ``schedulerName``, and are created
  with it (the field is immutable). No ``minResources`` or ``scheduleTimeoutSeconds`` exists
  there: the operator keeps the timeout itself (:mod:`mpijob.gang.native`).

Deliberate difference from upstream, for mpi-operator#608: with
``launcherCreationPolicy: WaitForWorkersReady`` the launcher is created only once every worker is
Ready, but upstream's default quorum (workers + 1) counts it, so the gang scheduler waits for a
pod that will never come while the operator waits for workers that will never be bound. Here,
when that policy is in force, the job has workers and ``minAvailable`` is not set, the launcher
is left out of the quorum: ``minMember`` is the number of workers and ``minResources`` sums the
workers only. The launcher pod still carries the group's label or annotation, so it joins the
already-formed group when it is created (both schedulers admit extra members of a group that
has reached its quorum). An explicit ``minAvailable`` is always used as written.

Called by the reconciler (create, compare and update the PodGroup) and by the builders (decorate
the worker pods and the launcher Job's pod template).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpijob import keys
from mpijob.api.errors import FieldError, invalid
from mpijob.api.models import MPIJob
from mpijob.desired import min_resources, names
from mpijob.desired.gang_mode import GangKind, GangMode
from mpijob.objects import clone
from mpijob.pods.quantity import Quantity


def launcher_in_quorum(job: MPIJob) -> bool:
    """Whether the launcher counts towards the gang's quorum (see the module's note on #608)."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is not None and policy.min_available is not None:
        return True
    waits = job.spec.launcher_creation_policy not in ("", keys.LAUNCHER_AT_STARTUP)
    # Upstream treats any value but AtStartup as WaitForWorkersReady; with no workers there is
    # nothing to wait for and the launcher is created at once.
    return not (waits and job.spec.worker_replicas > 0)


def min_member(job: MPIJob) -> int:
    """The PodGroup's ``minMember``: ``minAvailable``, else the workers plus the launcher."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is not None and policy.min_available is not None:
        return policy.min_available
    return job.spec.worker_replicas + (1 if launcher_in_quorum(job) else 0)


def queue_name(job: MPIJob) -> str:
    """The Volcano queue: the policy's, else the MPIJob's queue-name annotation, else empty."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is not None and policy.queue:
        return policy.queue
    return (job.metadata.annotations or {}).get(keys.VOLCANO_QUEUE_NAME_ANNOTATION, "")


def priority_class_name(job: MPIJob) -> str:
    """The gang's PriorityClass: the policy's, else the Launcher template's, else the Worker's."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is not None and policy.priority_class:
        return policy.priority_class
    for spec in (job.spec.launcher, job.spec.worker):
        name = (spec.template.get("spec") or {}).get("priorityClassName") if spec else None
        if name:
            return str(name)
    return ""


def schedule_timeout_seconds(job: MPIJob) -> int:
    """``schedulingPolicy.scheduleTimeoutSeconds``, or 0 when unset (as upstream passes it)."""
    policy = job.spec.run_policy.scheduling_policy
    if policy is None or policy.schedule_timeout_seconds is None:
        return 0
    return policy.schedule_timeout_seconds


def gang_min_resources(
    job: MPIJob, priority_values: Mapping[str, int]
) -> dict[str, Quantity] | None:
    """The PodGroup's ``minResources`` (see :mod:`mpijob.desired.min_resources`).

    Raises ValueError when a quantity in the job is malformed.
    """
    policy = job.spec.run_policy.scheduling_policy
    if policy is not None and policy.min_resources is not None:
        return {name: Quantity.parse(text) for name, text in policy.min_resources.items()}
    entries = min_resources.replica_priorities(
        job.spec.mpi_replica_specs or {},
        priority_values,
        include_launcher=launcher_in_quorum(job),
    )
    return min_resources.min_resources(entries, min_member(job))


def min_resources_errors(job: MPIJob) -> list[FieldError]:
    """Quantities in ``schedulingPolicy.minResources`` that are not Kubernetes quantities.

    The CRD accepts any string there (as upstream's does); the PodGroup could not be built.
    """
    policy = job.spec.run_policy.scheduling_policy
    errors = []
    for name, text in ((policy.min_resources or {}) if policy else {}).items():
        try:
            Quantity.parse(text)
        except ValueError as e:
            path = f"spec.runPolicy.schedulingPolicy.minResources[{name}]"
            errors.append(invalid(path, text, str(e)))
    return errors


def build_pod_group(
    job: MPIJob, *, mode: GangMode, priority_values: Mapping[str, int], topology_key: str = ""
) -> dict[str, Any]:
    """The PodGroup the job should have in ``mode``.

    ``priority_values`` maps PriorityClass names to their values; classes missing from it count
    as 0. ``topology_key``, with the Workload API, is the node label kube-scheduler must keep
    the whole gang within (:func:`mpijob.gang.native.topology_key`). Raises ValueError when gang
    scheduling is off or a quantity is malformed.
    """
    if not mode.enabled:
        raise ValueError("no PodGroup is built when gang scheduling is off")
    if mode.kind is GangKind.WORKLOAD_API:
        return _child(
            job,
            keys.POD_GROUP_KIND,
            {
                "workloadRef": {"workloadName": job.name, "templateName": keys.WORKLOAD_TEMPLATE},
                "schedulingPolicy": _native_policy(job),
                **_constraints(topology_key),
            },
        )
    members = min_member(job)
    resources = gang_min_resources(job, priority_values)
    spec: dict[str, Any] = {}
    if members:
        spec["minMember"] = members
    if mode.kind is GangKind.VOLCANO:
        api_version = keys.VOLCANO_POD_GROUP_API_VERSION
        if queue := queue_name(job):
            spec["queue"] = queue
        if priority := priority_class_name(job):
            spec["priorityClassName"] = priority
    else:
        api_version = keys.SCHED_PLUGINS_POD_GROUP_API_VERSION
        spec["scheduleTimeoutSeconds"] = schedule_timeout_seconds(job)
    if resources is not None and (resources or mode.kind is GangKind.VOLCANO):
        spec["minResources"] = min_resources.to_manifest(resources)
    return {
        "apiVersion": api_version,
        "kind": keys.POD_GROUP_KIND,
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "ownerReferences": [names.owner_reference(job)],
        },
        "spec": spec,
    }


def build_workload(job: MPIJob, topology_key: str = "") -> dict[str, Any]:
    """The Workload of ``--gang-scheduling=workload-api``: the job as kube-scheduler's workload
    API knows it, its one PodGroup template holding what its PodGroup holds."""
    template = {
        "name": keys.WORKLOAD_TEMPLATE,
        "schedulingPolicy": _native_policy(job),
        **_constraints(topology_key),
    }
    return _child(
        job,
        keys.WORKLOAD_KIND,
        {
            "controllerRef": {"apiGroup": keys.GROUP, "kind": keys.KIND, "name": job.name},
            "podGroupTemplates": [template],
        },
    )


def _constraints(topology_key: str) -> dict[str, Any]:
    return {"schedulingConstraints": {"topology": [{"key": topology_key}]}} if topology_key else {}


def _native_policy(job: MPIJob) -> dict[str, Any]:
    """A gang of ``minMember`` pods; a job whose quorum is 0 (``minAvailable: 0``) has none."""
    members = min_member(job)
    return {"gang": {"minCount": members}} if members > 0 else {"basic": {}}


def _child(job: MPIJob, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": keys.WORKLOAD_API_VERSION,
        "kind": kind,
        "metadata": {
            "name": job.name,
            "namespace": job.namespace,
            "ownerReferences": [names.owner_reference(job)],
        },
        "spec": spec,
    }


def pod_group_needs_update(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the existing PodGroup's spec differs in meaning from the desired one.

    Quantities compare by value, empty fields equal absent ones, and a Volcano queue left empty
    equals the ``default`` the API server fills in. When this is True the caller replaces the
    whole spec, as upstream does.
    """
    if desired.get("apiVersion") == keys.WORKLOAD_API_VERSION:
        # Only what the operator sets: the API server fills in the rest (disruption mode...).
        old_spec, new_spec = existing.get("spec") or {}, desired.get("spec") or {}
        return any(old_spec.get(key) != value for key, value in new_spec.items())
    volcano = desired.get("apiVersion") == keys.VOLCANO_POD_GROUP_API_VERSION
    return _comparable(existing.get("spec"), volcano=volcano) != _comparable(
        desired.get("spec"), volcano=volcano
    )


def native_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that brings a Workload API PodGroup to the desired quorum, when only its
    gang's ``minCount`` differs (the one mutable field it has); None when more differs."""
    old_spec, new_spec = existing.get("spec") or {}, desired.get("spec") or {}
    old_gang = (old_spec.get("schedulingPolicy") or {}).get("gang")
    new_gang = (new_spec.get("schedulingPolicy") or {}).get("gang")
    if not isinstance(old_gang, Mapping) or not isinstance(new_gang, Mapping):
        return None
    others = {k: v for k, v in new_spec.items() if k != "schedulingPolicy"}
    if any(old_spec.get(k) != v for k, v in others.items()):
        return None
    return {"spec": {"schedulingPolicy": {"gang": {"minCount": new_gang["minCount"]}}}}


def update_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that makes the existing PodGroup's spec the desired one.

    As upstream's Update replaces the whole spec, a field the desired spec leaves out is dropped,
    and so is a resource the desired ``minResources`` no longer names: in a merge patch an
    object merges into the existing one, so only a null removes a key. Without the inner nulls,
    a ``schedulingPolicy.minResources`` removed from the MPIJob (recomputed as ``{}`` from
    pods that request nothing) would leave the old, perhaps unschedulable, minimum in place.
    """
    old_spec = existing.get("spec") or {}
    spec: dict[str, Any] = {**dict.fromkeys(old_spec), **desired.get("spec", {})}
    old_resources = old_spec.get("minResources")
    if isinstance(old_resources, Mapping) and isinstance(spec.get("minResources"), Mapping):
        spec["minResources"] = {**dict.fromkeys(old_resources), **spec["minResources"]}
    return {"spec": spec}


def decorate_pod(pod: Mapping[str, Any], job_name: str, mode: GangMode) -> dict[str, Any]:
    """A copy of a pod or pod template made a member of the job's PodGroup.

    Sets ``spec.schedulerName`` and the annotation (Volcano) or label (scheduler-plugins) naming
    the group, or, with the Workload API, ``spec.schedulingGroup`` alone; with gang scheduling
    off the copy is unchanged. The input is not modified.
    """
    result = clone(dict(pod))
    if not mode.enabled:
        return result
    if mode.kind is GangKind.WORKLOAD_API:
        result.setdefault("spec", {})["schedulingGroup"] = {"podGroupName": job_name}
        return result
    metadata = result.setdefault("metadata", {})
    result.setdefault("spec", {})["schedulerName"] = mode.scheduler_name
    if mode.kind is GangKind.VOLCANO:
        annotations = metadata.get("annotations") or {}
        metadata["annotations"] = {**annotations, keys.VOLCANO_GROUP_NAME_ANNOTATION: job_name}
    else:
        labels = metadata.get("labels") or {}
        metadata["labels"] = {**labels, keys.SCHED_PLUGINS_POD_GROUP_LABEL: job_name}
    return result


def _comparable(spec: Mapping[str, Any] | None, *, volcano: bool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in (spec or {}).items():
        if value in (None, "", {}, []) or (key == "minMember" and value == 0):
            continue
        result[key] = _resource_values(value) if key == "minResources" else value
    if volcano:
        result.setdefault("queue", keys.VOLCANO_DEFAULT_QUEUE)
    return result


def _resource_values(resources: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, text in resources.items():
        try:
            values[name] = Quantity.parse(text)
        except (ValueError, TypeError):
            # Something we cannot read differs from anything we would write.
            values[name] = ("unparsable", text)
    return values

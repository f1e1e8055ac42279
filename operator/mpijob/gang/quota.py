"""Namespaces' GPU quotas, kept by our admission whatever the GPU binding.

A ResourceQuota limits what the API server charges a namespace: a pod's ``nvidia.com/gpu``
requests under ``requests.nvidia.com/gpu``, a ResourceClaim's devices of NVIDIA's GPU class
under ``gpu.nvidia.com.deviceclass.resource.k8s.io/devices``. In the dra binding the operator
turns a placed worker's ``nvidia.com/gpu`` into a claim it creates itself, which the first of
those never sees: Kubernetes 1.34's claim evaluator charges a claim only to the device class;
from 1.35, with the alpha DRAExtendedResource gate on and the DeviceClass naming
``nvidia.com/gpu`` as its ``extendedResourceName``, it charges ``requests.nvidia.com/gpu`` too
(:func:`charges_claims_as_gpus`). So before it admits a
topology-placed job, our admission checks every GPU quota of the job's namespace that would have
charged the job's pods, with what Kubernetes already counts (the quota's ``status.used``) plus
what the operator's own placements in that namespace hold and Kubernetes does not count yet or
at all (:func:`unseen`). A job that would not fit waits, naming the quota.

Every number believed comes from objects a tenant cannot write: the ResourceQuota (spec by an
admin, status by the API server) and the operator's PlacementDecisions. The pods and claims of
a job only ever lower the operator's count of what Kubernetes does not see yet where Kubernetes
counts them instead (so a forged one is charged by Kubernetes itself); in the dra binding
without the mapping, where Kubernetes charges nothing for a placed worker, nothing a tenant
writes lowers it.

Scopes are matched as the API server matches them: a pod quota's scopes against the pod
template (a GPU pod is never ``BestEffort``); a scoped quota never charges a claim, so a scoped
``requests.nvidia.com/gpu`` quota is kept by the operator alone even where claims are mapped.
Pure; called by :mod:`mpijob.gang.service` once per waiting job and pass.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import names
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.pods import quantity
from mpijob.pods.predicates import effective_gpus, template_gpus, terminal

#: The quota resource names that limit GPUs, and what the API server charges under each.
GPU_RESOURCES = (keys.QUOTA_GPU_REQUESTS, keys.QUOTA_GPU_CLAIM_DEVICES)


class Charged(enum.Enum):
    """What the API server charges a placed worker's GPUs to, for one quota resource."""

    PODS = "pods"
    """The worker pods' ``nvidia.com/gpu`` requests (annotations binding)."""
    CLAIMS = "claims"
    """The workers' claims (dra binding: the device class, or a mapped ``nvidia.com/gpu``)."""
    NOTHING = "nothing"
    """Nothing: the dra binding hides them from ``requests.nvidia.com/gpu``; only we count them."""


#: The first Kubernetes minor whose quota charges a claim to its class's extended resource.
FIRST_MINOR_CHARGING_CLAIMS_AS_EXTENDED = 35


def charges_claims_as_gpus(server_minor: int | None, extended_resource: str | None) -> bool:
    """Whether the API server charges our claims to ``requests.nvidia.com/gpu``: it is 1.35 or
    later and NVIDIA's DeviceClass names ``nvidia.com/gpu`` (a field the API server keeps only
    with the DRAExtendedResource gate on). An unknown version counts as no: the operator then
    counts the claims itself, at worst twice (a job waits longer), never not at all."""
    return (
        server_minor is not None
        and server_minor >= FIRST_MINOR_CHARGING_CLAIMS_AS_EXTENDED
        and extended_resource == keys.GPU_RESOURCE
    )


def server_minor(version: Mapping[str, Any]) -> int | None:
    """The minor of an API server's ``/version`` (``"35"``, or ``"35+"`` on some builds)."""
    digits = "".join(c for c in str(version.get("minor") or "") if c.isdigit())
    return int(digits) if digits and str(version.get("major")) == "1" else None


def charged(resource: str, binding: GpuBinding, *, claims_as_gpus: bool) -> Charged | None:
    """What ``resource`` charges for a placed worker's GPUs; None when it never applies to them
    (a device-class quota while the workers keep ``nvidia.com/gpu``)."""
    if resource == keys.QUOTA_GPU_CLAIM_DEVICES:
        return Charged.CLAIMS if binding is GpuBinding.DRA else None
    if binding is GpuBinding.ANNOTATIONS:
        return Charged.PODS
    return Charged.CLAIMS if claims_as_gpus else Charged.NOTHING


@dataclass(frozen=True)
class Limit:
    """One GPU resource of one ResourceQuota."""

    namespace: str
    quota: str
    resource: str
    hard: Decimal
    used: Decimal | None
    """As the API server counted it (``status.used``); None until it has."""
    scopes: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """``(scopeName, operator, values)``: ``spec.scopes`` (operator ``Exists``) and
    ``spec.scopeSelector.matchExpressions``."""

    @property
    def scoped(self) -> bool:
        return bool(self.scopes)


def limits_of(body: Mapping[str, Any]) -> list[Limit]:
    """The GPU limits of a ResourceQuota; a quantity that does not parse limits nothing (the
    API server refuses such a quota)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    used = (body.get("status") or {}).get("used") or {}
    scopes: list[tuple[str, str, tuple[str, ...]]] = [
        (str(s), "Exists", ()) for s in spec.get("scopes") or []
    ]
    for e in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        values = tuple(str(v) for v in e.get("values") or ())
        scopes.append((str(e.get("scopeName")), str(e.get("operator")), values))
    out = []
    for resource in GPU_RESOURCES:
        hard = _amount((spec.get("hard") or {}).get(resource))
        if hard is None:
            continue
        out.append(
            Limit(
                str(meta.get("namespace") or ""),
                str(meta.get("name") or ""),
                resource,
                hard,
                _amount(used.get(resource)),
                tuple(scopes),
            )
        )
    return out


def _amount(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return quantity.parse(value).value
    except ValueError:
        return None


def matches(limit: Limit, pod_spec: Mapping[str, Any] | None) -> bool:
    """Whether a pod with ``pod_spec`` (requesting GPUs) is charged to ``limit``, as the API
    server's pod evaluator decides; an unknown spec (None) is charged (the safe side)."""
    if pod_spec is None:
        return True
    return all(_in_scope(scope, op, values, pod_spec) for scope, op, values in limit.scopes)


def _in_scope(scope: str, op: str, values: tuple[str, ...], spec: Mapping[str, Any]) -> bool:
    deadline = spec.get("activeDeadlineSeconds")
    match scope:
        case "Terminating":
            return deadline is not None and int(deadline) >= 0
        case "NotTerminating":
            return deadline is None or int(deadline) < 0
        case "BestEffort":
            return False  # a pod that requests GPUs is never BestEffort
        case "NotBestEffort":
            return True
        case "PriorityClass":
            name = str(spec.get("priorityClassName") or "")
            match op:
                case "In":
                    return name in values
                case "NotIn":
                    return name not in values
                case "Exists":
                    return bool(name)
                case "DoesNotExist":
                    return not name
            return False
        case "CrossNamespacePodAffinity":
            return _cross_namespace_affinity(spec)
    return False  # a scope the pod evaluator does not know charges no pod


def _cross_namespace_affinity(spec: Mapping[str, Any]) -> bool:
    affinity = spec.get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind) or {}
        terms = list(rules.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [
            w.get("podAffinityTerm") or {}
            for w in rules.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        ]
        if any(t.get("namespaces") or t.get("namespaceSelector") is not None for t in terms):
            return True
    return False


# --- what the operator's placements hold ----------------------------------------------------


@dataclass(frozen=True)
class Held:
    """GPUs one admitted job holds through its PlacementDecision, and how many of them the API
    server already charges."""

    gpus: int
    """The decision's GPUs (every worker's)."""
    in_pods: int = 0
    """Requested as ``nvidia.com/gpu`` by the job's live worker pods."""
    in_claims: int = 0
    """Asked by the job's ResourceClaims."""
    worker_spec: Mapping[str, Any] | None = None
    """The job's worker pod spec, for scoped quotas; None when unknown (the job is gone)."""


def unseen(held: Held, how: Charged) -> int:
    """GPUs of ``held`` that a quota charging ``how`` does not count (yet)."""
    match how:
        case Charged.PODS:
            return max(0, held.gpus - held.in_pods)
        case Charged.CLAIMS:
            return max(0, held.gpus - held.in_claims)
    return held.gpus


def held_by(
    uid: str,
    gpus: int,
    pods: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    worker_spec: Mapping[str, Any] | None,
) -> Held:
    """What the decision of the job with ``uid`` holds: ``gpus``, of which its unfinished pods
    (any of ``pods``) request some and its claims (any of ``claims``) ask some."""
    in_pods = sum(_pod_gpus(p) for p in pods if names.is_controlled_by(p, uid) and not terminal(p))
    in_claims = sum(_claim_devices(c) for c in claims if names.is_controlled_by(c, uid))
    return Held(gpus, in_pods, in_claims, worker_spec)


def _pod_gpus(pod: Mapping[str, Any]) -> int:
    return effective_gpus(pod.get("spec") or {})


def _claim_devices(claim: Mapping[str, Any]) -> int:
    """Devices of NVIDIA's GPU class a claim asks for (exact counts), as quota charges them."""
    requests = (((claim.get("spec") or {}).get("devices") or {}).get("requests")) or []
    total = 0
    for r in requests:
        exactly = r.get("exactly") or {}
        if exactly.get("deviceClassName") == keys.NVIDIA_GPU_DRIVER:
            total += int(exactly.get("count") or 1)
    return total


# --- the check ------------------------------------------------------------------------------


def job_need(job: MPIJob) -> tuple[int, int, Mapping[str, Any], Mapping[str, Any]]:
    """``(worker GPUs in all, the launcher's GPUs, worker pod spec, launcher pod spec)``."""
    worker = job.spec.worker
    launcher = job.spec.launcher
    wt = worker.template if worker is not None else {}
    lt = launcher.template if launcher is not None else {}
    workers = job.spec.worker_replicas * template_gpus(wt)
    return workers, template_gpus(lt), wt.get("spec") or {}, lt.get("spec") or {}


def check(
    job: MPIJob,
    limits: Iterable[Limit],
    held: Iterable[Held],
    binding: GpuBinding,
    *,
    claims_as_gpus: bool = False,
) -> str:
    """Why ``job`` (not admitted yet) would take its namespace past a GPU quota, naming the
    first such quota; empty when every quota has room.

    ``limits`` are the namespace's; ``held`` what the operator's admitted jobs of the namespace
    hold. ``claims_as_gpus``: NVIDIA's DeviceClass names ``nvidia.com/gpu`` as its extended
    resource, so the API server charges claims to ``requests.nvidia.com/gpu`` too.
    """
    workers, launcher, worker_spec, launcher_spec = job_need(job)
    held = list(held)
    for limit in limits:
        how = charged(limit.resource, binding, claims_as_gpus=claims_as_gpus)
        if how is Charged.CLAIMS and limit.scoped:
            # The API server charges no claim to a scoped quota. A device-class one never held
            # the pods either; a pod one would have held them, so the operator counts alone.
            how = None if limit.resource == keys.QUOTA_GPU_CLAIM_DEVICES else Charged.NOTHING
        if how is None:
            continue
        if (
            how is Charged.CLAIMS
            and limit.resource == keys.QUOTA_GPU_REQUESTS
            and limit.used is not None
            and limit.used < sum(h.in_claims for h in held)
        ):
            # The mapping is there but the charge is not (the gate was turned off after the
            # class was written, which keeps the field): count the claims ourselves.
            how = Charged.NOTHING
        need = workers if matches(limit, worker_spec) else 0
        if limit.resource == keys.QUOTA_GPU_REQUESTS and matches(limit, launcher_spec):
            need += launcher  # the launcher keeps nvidia.com/gpu in every binding
        if need == 0:
            continue
        where = f"ResourceQuota {limit.quota} in namespace {limit.namespace}"
        if limit.used is None:
            return (
                f"{where} limits {limit.resource} to {_num(limit.hard)}, and the API server has "
                "not counted its usage yet"
            )
        ours = sum(
            unseen(h, how) for h in held if how is Charged.CLAIMS or matches(limit, h.worker_spec)
        )
        if limit.used + ours + need > limit.hard:
            return (
                f"{where} allows {limit.resource}: {_num(limit.hard)}; "
                f"{_num(limit.used + ours)} in use ({_num(limit.used)} counted by the API server, "
                f"{ours} held by this operator's placements) and this job needs {need}"
            )
    return ""


def _num(value: Decimal) -> str:
    return str(int(value)) if value == value.to_integral_value() else str(value)

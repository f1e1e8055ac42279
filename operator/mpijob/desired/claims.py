"""ResourceClaims that pin a topology-placed worker's GPUs, and the worker pod that uses one.

In the DRA binding mode (:mod:`gpu_binding`) each placed worker gets one ResourceClaim
(``resource.k8s.io/v1``) named after its pod, ``<pod>-gpus``, controlled by the MPIJob, asking
NVIDIA's DRA driver (DeviceClass ``gpu.nvidia.com``) for exactly the worker's chosen GPUs: a CEL
selector on the devices' ``uuid`` attribute and ``count`` = that many GPUs. The pod is
translated to use it: its containers' ``nvidia.com/gpu`` requests and limits are replaced by
``resources.claims`` entries, ``spec.resourceClaims`` names the claim, and the annotation
``mpijob.io/gpu-claim`` records that the translation happened. The user's MPIJob keeps
upstream's ``nvidia.com/gpu: N``.

A pod with one GPU container asks for request ``gpus``; one with several GPU containers gets a
request per container, ``gpus-<container index>``, each pinned to its share of the chosen GPUs
in container order, so that no container sees another's GPUs (as with the device plugin).

The scheduler then allocates exactly those devices or leaves the pod Pending (a pinned device
held by another claim is never swapped for another). Only placed workers are bound; the launcher
and the workers of jobs placed by the scheduler alone keep their pods as built. Called by the
reconcile, with the mode chosen at startup, on each worker pod it is about to create.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from mpijob import keys
from mpijob.api import JSON, MPIJob
from mpijob.desired import names
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.objects import clone
from mpijob.pods.predicates import container_gpus, effective_gpus

#: The request of a claim whose pod has one GPU container.
REQUEST: Final = "gpus"
#: The claim's entry in the pod's ``spec.resourceClaims``; prefixed so as not to collide with
#: claims the user's template brings.
POD_CLAIM: Final = "mpijob-gpus"
CLAIM_SUFFIX: Final = "-gpus"
_CEL_ATTRIBUTE: Final = f"device.attributes['{keys.NVIDIA_GPU_DRIVER}'].uuid"


@dataclass(frozen=True)
class BoundWorker:
    """A placed worker pod as it must be created, and the claim to create before it."""

    pod: JSON
    claim: JSON | None = None
    """None when the pod keeps ``nvidia.com/gpu`` (annotations mode, or see ``skipped``)."""
    skipped: str = ""
    """Why a DRA-mode pod was left to the device plugin; empty otherwise."""


def claim_name(pod_name: str) -> str:
    """``<pod>-gpus``: deterministic, so a restarted operator finds the claim it created."""
    return pod_name + CLAIM_SUFFIX


def bind_worker(job: MPIJob, pod: JSON, mode: GpuBinding) -> BoundWorker:
    """The worker ``pod`` (already placed: it carries ``mpijob.io/gpu-uuids``) under ``mode``.

        ``pod`` is not modified. In DRA mode the returned pod uses the returned claim; a pod whose
        chosen GPUs have no known UUIDs, or whose containers ask for another number of GPUs than
        were chosen, or that takes GPUs outside its app containers (an init container, a sidecar:
    :func:`~mpijob.pods.predicates.effective_gpus`), is returned unchanged with the reason in
    ``skipped``.
    """
    if mode is not GpuBinding.DRA:
        return BoundWorker(pod)
    meta = pod.get("metadata") or {}
    uuids = [u.strip() for u in (meta.get("annotations") or {}).get(keys.GPU_UUIDS, "").split(",")]
    uuids = [u for u in uuids if u]
    if not uuids:
        return BoundWorker(pod, skipped=f"no {keys.GPU_UUIDS}: the node's GPU UUIDs are unknown")
    spec = pod.get("spec") or {}
    counts = [container_gpus(c) for c in spec.get("containers") or []]
    if sum(counts) != effective_gpus(spec):
        # The claim replaces the app containers' GPUs; an init container's or a sidecar's (or
        # an overhead's) would still be asked of the device plugin beside it.
        return BoundWorker(
            pod,
            skipped=(
                f"it takes {effective_gpus(spec)} GPUs as the scheduler counts them "
                f"(init containers, sidecars, overhead) but its containers ask for {sum(counts)}"
            ),
        )
    if sum(counts) != len(uuids):
        return BoundWorker(
            pod,
            skipped=f"its containers ask for {sum(counts)} GPUs but {len(uuids)} were chosen",
        )
    claim = build_claim(job, pod, uuids, counts)
    return BoundWorker(use_claim(pod, claim_name(str(meta.get("name"))), counts), claim)


def build_claim(
    job: MPIJob, pod: Mapping[str, Any], uuids: Sequence[str], counts: Sequence[int]
) -> JSON:
    """The claim pinning ``uuids``, split over the pod's containers by ``counts`` (GPUs each)."""
    meta = pod.get("metadata") or {}
    requests = []
    start = 0
    for index, count in _gpu_containers(counts):
        share = uuids[start : start + count]
        start += count
        requests.append(
            {
                "name": _request_name(index, counts),
                "exactly": {
                    "deviceClassName": keys.NVIDIA_GPU_DRIVER,
                    "allocationMode": "ExactCount",
                    "count": count,
                    "selectors": [{"cel": {"expression": uuid_selector(share)}}],
                },
            }
        )
    return {
        "apiVersion": keys.DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": names.child_metadata(
            job, claim_name(str(meta.get("name"))), dict(meta.get("labels") or {})
        ),
        "spec": {"devices": {"requests": requests}},
    }


def use_claim(pod: Mapping[str, Any], claim: str, counts: Sequence[int]) -> JSON:
    """A copy of ``pod`` whose GPU containers get their GPUs from ``claim`` instead."""
    out = clone(dict(pod))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), keys.GPU_CLAIM: claim}
    spec = out.setdefault("spec", {})
    entry = {"name": POD_CLAIM, "resourceClaimName": claim}
    spec["resourceClaims"] = [*(spec.get("resourceClaims") or []), entry]
    containers = spec.get("containers") or []
    for index, _ in _gpu_containers(counts):
        resources = containers[index].setdefault("resources", {})
        for kind in ("limits", "requests"):
            rest = {k: v for k, v in (resources.get(kind) or {}).items() if k != keys.GPU_RESOURCE}
            if rest:
                resources[kind] = rest
            else:
                resources.pop(kind, None)
        ref = {"name": POD_CLAIM, "request": _request_name(index, counts)}
        resources["claims"] = [*(resources.get("claims") or []), ref]
    return out


def uuid_selector(uuids: Sequence[str]) -> str:
    """CEL matching the devices whose ``uuid`` attribute is one of ``uuids``."""
    return f"{_CEL_ATTRIBUTE} in [{', '.join(_cel_string(u) for u in uuids)}]"


def claim_drifted(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether a live claim asks for other devices than ``desired``.

    A claim's spec is immutable: a drifted claim (the job was placed anew) must be deleted and
    created again, before its pod.
    """
    return bool((live.get("spec") or {}).get("devices") != desired["spec"]["devices"])


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(pool, device)`` of every NVIDIA GPU the scheduler allocated to ``claim``.

    The pool of NVIDIA's driver is the node's name; the device is ``gpu-<minor>``. Empty while
    the claim is not allocated.
    """
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        (str(r.get("pool")), str(r.get("device")))
        for r in results
        if r.get("driver") == keys.NVIDIA_GPU_DRIVER
    ]


def _gpu_containers(counts: Sequence[int]) -> list[tuple[int, int]]:
    return [(index, count) for index, count in enumerate(counts) if count > 0]


def _request_name(index: int, counts: Sequence[int]) -> str:
    return REQUEST if len(_gpu_containers(counts)) == 1 else f"{REQUEST}-{index}"


def _cel_string(text: str) -> str:
    """A CEL single-quoted string literal of ``text``."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"

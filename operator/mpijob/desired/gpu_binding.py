"""The ``--gpu-binding`` flag: how a topology-placed worker is made to get its chosen GPUs.

Two modes:

- ``dra``: each placed worker gets a ResourceClaim of NVIDIA's DRA driver pinning its chosen GPUs
  by UUID, and its pod asks for that claim instead of ``nvidia.com/gpu`` (:mod:`claims`). The
  scheduler allocates exactly those devices or leaves the pod Pending: the placement is enforced.
- ``annotations``: the pod keeps ``nvidia.com/gpu`` and carries the choice only as annotations
  and a node affinity; the device plugin, not the operator, picks which GPUs of the node it
  gets.

``auto`` (the default) picks ``dra`` where the API server serves ``resource.k8s.io/v1`` and the
``gpu.nvidia.com`` DeviceClass exists, ``annotations`` otherwise. :func:`choose` is the pure
decision; the handlers gather the facts at startup and log the choice with its reason.

Whatever the mode, the node agent compares what each placed pod's containers really hold with
its ``mpijob.io/gpu-uuids`` and writes ``mpijob.io/gpu-actual`` when they differ;
:func:`newly_not_honoured` tells the operator when that report is new, for its metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mpijob import keys
from mpijob.pods import GpuBinding, pod_binding

__all__ = ["AUTO", "FLAG_VALUES", "GpuBinding", "pod_binding"]


AUTO: Final = "auto"
#: Values of the ``--gpu-binding`` flag, the default first.
FLAG_VALUES: Final = (AUTO, GpuBinding.DRA.value, GpuBinding.ANNOTATIONS.value)


@dataclass(frozen=True)
class ClusterFacts:
    """What the API server says about DRA, read once at startup."""

    dra_served: bool
    """Whether ``resource.k8s.io/v1`` is served."""
    gpu_device_class: bool
    """Whether the DeviceClass ``gpu.nvidia.com`` (installed with NVIDIA's DRA driver) exists."""
    unknown: str = ""
    """Why a fact could not be read (e.g. forbidden), if one could not: it then reads False."""


@dataclass(frozen=True)
class Choice:
    mode: GpuBinding
    reason: str
    """One sentence for the startup log: which mode and why."""
    warning: bool = False
    """The choice works against what the cluster shows; log it as a warning."""


def choose(flag: str, facts: ClusterFacts) -> Choice:
    """The binding mode for ``--gpu-binding=<flag>`` on a cluster with ``facts``.

    ValueError (naming the flag and the fix) when the flag is unknown, or when ``dra`` is forced
    on an API server that cannot store a ResourceClaim: no placed job could ever run there.
    """
    api, device_class = keys.DRA_API_VERSION, keys.NVIDIA_GPU_DRIVER
    missing = _missing(facts)
    if flag == GpuBinding.ANNOTATIONS.value:
        return Choice(
            GpuBinding.ANNOTATIONS,
            "--gpu-binding=annotations: placed workers keep nvidia.com/gpu; the device plugin "
            "picks which GPUs of the chosen node they get",
        )
    if flag == GpuBinding.DRA.value:
        if not facts.dra_served:
            raise ValueError(
                f"--gpu-binding=dra: the API server does not serve {api} (Kubernetes 1.34 or "
                f"later serves it by default){_why(facts)}; use --gpu-binding=annotations or auto"
            )
        if not facts.gpu_device_class:
            return Choice(
                GpuBinding.DRA,
                f"--gpu-binding=dra, but the DeviceClass {device_class} does not exist"
                f"{_why(facts)}: placed workers stay Pending until NVIDIA's DRA driver is "
                "installed",
                warning=True,
            )
        return Choice(
            GpuBinding.DRA, f"--gpu-binding=dra; {api} and DeviceClass {device_class} found"
        )
    if flag != AUTO:
        raise ValueError(
            f"--gpu-binding={flag!r} is not a binding mode; use one of {', '.join(FLAG_VALUES)}"
        )
    if not missing:
        return Choice(
            GpuBinding.DRA,
            f"--gpu-binding=auto: {api} is served and DeviceClass {device_class} exists, so "
            "placed workers get their GPUs through ResourceClaims pinned by UUID",
        )
    return Choice(
        GpuBinding.ANNOTATIONS,
        f"--gpu-binding=auto: {missing}{_why(facts)}, so placed workers keep nvidia.com/gpu "
        "and the device plugin picks which GPUs of the chosen node they get",
        warning=bool(facts.unknown),
    )


def _missing(facts: ClusterFacts) -> str:
    if not facts.dra_served:
        return f"the API server does not serve {keys.DRA_API_VERSION}"
    if not facts.gpu_device_class:
        return f"no DeviceClass {keys.NVIDIA_GPU_DRIVER} (NVIDIA's DRA driver is not installed)"
    return ""


def _why(facts: ClusterFacts) -> str:
    return f" ({facts.unknown})" if facts.unknown else ""


def newly_not_honoured(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> GpuBinding | None:
    """``new``'s binding when its ``mpijob.io/gpu-actual`` appeared or changed since ``old``.

    None when ``new`` carries none, or the same as ``old`` (the agent reports each pod and set of
    GPUs once; a watch replays the same pod many times).
    """

    def actual(pod: Mapping[str, Any] | None) -> str:
        annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(keys.GPU_ACTUAL) or "")

    now = actual(new)
    return pod_binding(new) if now and now != actual(old) else None

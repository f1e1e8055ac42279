"""Pure: what a pod is and asks, read alike by the operator and the node agent.

:mod:`predicates` (the scheduler's predicates: effective requests, node selectors and affinity,
taints, terminal pod phases), :mod:`quantity` (Kubernetes quantities), and here how a pod's GPUs
were bound (:class:`GpuBinding`, :func:`pod_binding`). Below :mod:`mpijob.desired`, so the node
agent reads pods as the operator does without importing the reconcile's builders.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from mpijob import keys


class GpuBinding(enum.Enum):
    """How the GPUs chosen for a worker are bound to its pod."""

    DRA = "dra"
    ANNOTATIONS = "annotations"


def pod_binding(pod: Mapping[str, Any]) -> GpuBinding:
    """How a placed pod got its GPUs: through a claim (``mpijob.io/gpu-claim``) or not."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return GpuBinding.DRA if annotations.get(keys.GPU_CLAIM) else GpuBinding.ANNOTATIONS

"""What a pod asks for and holds, read one way for the operator and the console.

One reading of ``nvidia.com/gpu`` (placement requests; what a job asked for) and of our
``mpijob.io/gpu-ids`` annotation, so the two never disagree about a job's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mpijob import keys


def gpu_count(template: Mapping[str, Any] | None) -> int:
    """Whole GPUs one pod of ``template`` asks for: the sum over its containers."""
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    return sum(container_gpus(container) for container in containers)


def container_gpus(container: Mapping[str, Any]) -> int:
    """Whole GPUs one container asks for.

    Its limit, else its request (Kubernetes defaults an extended resource's request to its
    limit). A malformed quantity counts as none: the API server rejects it before any pod exists.
    """
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(keys.GPU_RESOURCE)
    if value is None:
        value = (resources.get("requests") or {}).get(keys.GPU_RESOURCE)
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def gpu_ids(text: str | None) -> tuple[int, ...]:
    """The GPU indices of an ``mpijob.io/gpu-ids`` value (``"1,2,5,6"``); junk is skipped."""
    return tuple(int(part) for part in (text or "").split(",") if part.strip().isdigit())

"""Our ``mpijob.io/gpu-ids`` annotation, read one way for the operator and the console.

How many GPUs a pod or template takes is :func:`mpijob.pods.predicates.effective_gpus`, the
scheduler's effective request, and nowhere else.
"""

from __future__ import annotations


def gpu_ids(text: str | None) -> tuple[int, ...]:
    """The GPU indices of an ``mpijob.io/gpu-ids`` value (``"1,2,5,6"``); junk is skipped."""
    return tuple(int(part) for part in (text or "").split(",") if part.strip().isdigit())

"""MPIJob fixtures for the gang tests, written as the upstream PodGroup tests write theirs."""

from __future__ import annotations

from typing import Any

from mpijob.api import MPIJob
from support.jobs import body, parsed


def template(*requests: dict[str, str], priority_class: str = "", **spec: Any) -> dict[str, Any]:
    """A pod template with one container per ``requests`` mapping."""
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": r}} for r in requests],
        **spec,
    }
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    return {"spec": pod_spec}


def job(
    *,
    launcher: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    workers: int | None = None,
    policy: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "test",
    **spec: Any,
) -> MPIJob:
    """A defaulted MPIJob; ``worker`` or ``workers`` adds a Worker replica spec."""
    if policy is not None:
        spec["runPolicy"] = {"schedulingPolicy": policy}
    return parsed(
        body(
            name,
            "default",
            uid="uid-1",
            launcher=launcher or {},
            worker=worker,
            workers=workers,
            metadata={"annotations": annotations} if annotations else None,
            **spec,
        )
    )

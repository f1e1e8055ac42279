"""A pod's effective requests, as the scheduler computes them: the one place they are summed.

Per resource, the larger of

- what runs together: every app container, plus every sidecar (an init container with
  ``restartPolicy: Always``, which keeps running beside them), and
- each regular init container's request plus the sidecars declared before it (already
  running while it runs),

plus the pod's ``overhead`` (RuntimeClass). A container's limit stands for a missing request,
as the API server defaults it. Quantities are exact; a malformed amount counts as none (the API
server refuses it before any pod exists).

Used wherever a pod's requests are read: the room a node has left for a GPU share
(:mod:`mpijob.shares.node_room`), the GPUs a pod no decision placed holds
(:mod:`mpijob.gang.topology`), and the GPUs a namespace's pods hold against its quota
(:mod:`mpijob.gang.quota`).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from mpijob import keys
from mpijob.desired.quantity import Quantity

Requests = dict[str, Decimal]


def effective_requests(spec: Mapping[str, Any]) -> Requests:
    """What a pod with ``spec`` requests of its node, per resource (no ``pods`` entry)."""
    sidecars: Requests = {}
    init_peak: Requests = {}
    for container in spec.get("initContainers") or []:
        own = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, own)
            own = dict(sidecars)  # while it starts, it and the sidecars before it run
        else:
            own = _sum(own, sidecars)
        for name, amount in own.items():
            init_peak[name] = max(init_peak.get(name, Decimal(0)), amount)
    running = dict(sidecars)
    for container in spec.get("containers") or []:
        _add(running, container_requests(container))
    total = {
        name: max(running.get(name, Decimal(0)), init_peak.get(name, Decimal(0)))
        for name in running.keys() | init_peak.keys()
    }
    _add(total, amounts(spec.get("overhead")))
    return total


def effective_gpus(spec: Mapping[str, Any]) -> int:
    """Whole GPUs (``nvidia.com/gpu``) a pod with ``spec`` holds on its node."""
    return int(effective_requests(spec).get(keys.GPU_RESOURCE, Decimal(0)))


def container_requests(container: Mapping[str, Any]) -> Requests:
    """One container's requests, its limits standing for missing ones."""
    resources = container.get("resources") or {}
    merged = dict(resources.get("limits") or {})
    merged.update(resources.get("requests") or {})
    return amounts(merged)


def amounts(values: Mapping[str, Any] | None) -> Requests:
    """Exact amounts of a resource list; malformed ones left out."""
    out: Requests = {}
    for name, text in (values or {}).items():
        try:
            out[name] = Quantity.parse(text).value
        except (ValueError, TypeError):
            continue
    return out


def _sum(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Requests:
    out = dict(a)
    _add(out, b)
    return out


def _add(total: Requests, more: Mapping[str, Decimal]) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Decimal(0)) + amount

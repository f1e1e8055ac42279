"""Whether a job's workers fit a node in everything else the node advertises: pure.

Placement picks GPUs; the scheduler then binds each worker only where its whole request fits
(NodeResourcesFit): cpu, memory, pods, ephemeral-storage, hugepages, any extended resource, each
against the node's ``status.allocatable`` less what the bound, unfinished pods there request.
A decision on a node that cannot take the worker would hold GPUs for a pod that never runs, so
admission counts the same before it decides:

- :meth:`Room.never`: the resources a worker asks for more of than a node has allocatable at
  all. A job no node it may go to could ever hold waits with the resource named, holding no
  GPUs and blocking no one (:data:`mpijob.keys.REASON_NO_NODE_FITS`);
- :meth:`Room.workers`: how many more workers fit a node now, with what its pods request and
  what this pass admitted there; the GPUs beyond them are not offered to the job.

A worker's request is :func:`mpijob.pods.predicates.pod_requests` of its template (the
scheduler's effective request, its ``pods`` slot included) without ``nvidia.com/gpu``, which
placement counts GPU by GPU (and which a claim replaces in the dra binding). Node selectors,
required node affinity and taints are :mod:`mpijob.pods.predicates`' too (the caller's
eligibility). What this cannot know: the cluster's own scheduler plugins, inter-pod
(anti-)affinity, topology spread, volume limits, and the requests of a decision's workers not
bound yet; a worker those keep Pending is released after ``--placement-release-seconds`` as
before. A node that advertises no allocatable at all is not judged (always fits).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.pods.predicates import Requests, amounts, pod_requests

#: Resources placement counts itself, GPU by GPU.
PLACED = frozenset({keys.GPU_RESOURCE})


def worker_requests(job: MPIJob) -> Requests:
    """What one worker pod takes of its node, but the GPUs placement counts: non-zero only."""
    return {
        name: amount
        for name, amount in worker_pod_requests(job).items()
        if amount > 0 and name not in PLACED
    }


def worker_pod_requests(job: MPIJob) -> Requests:
    """What one worker pod takes of its node, GPUs included
    (:func:`~mpijob.pods.predicates.pod_requests` of the worker template; do not modify).
    Remembered per job version (uid and ``resourceVersion``): each pass weighs thousands of
    waiting jobs whose templates have not changed."""
    version = job.metadata.resource_version
    key = (job.metadata.uid, version or "")
    if version and (known := _REMEMBERED.get(key)) is not None:
        return known
    worker = job.spec.worker
    requests = pod_requests(((worker.template if worker is not None else {}).get("spec")) or {})
    if version:
        if len(_REMEMBERED) >= _REMEMBER_AT_MOST:
            _REMEMBERED.clear()
        _REMEMBERED[key] = requests
    return requests


_REMEMBERED: dict[tuple[str, str], Requests] = {}
_REMEMBER_AT_MOST = 100_000


def describe(amount: Decimal) -> str:
    """A quantity as people write it: ``96``, ``0.5``, ``805306368000``."""
    return format(amount.normalize(), "f")


class Room:
    """Each node's allocatable and what is requested there; :meth:`take` adds this pass's
    admissions. Nodes without ``status.allocatable`` are not judged."""

    def __init__(
        self, nodes: Iterable[Mapping[str, Any]], requested: Mapping[str, Mapping[str, Decimal]]
    ) -> None:
        self.allocatable: dict[str, Requests] = {}
        for node in nodes:
            name = str((node.get("metadata") or {}).get("name"))
            advertised = (node.get("status") or {}).get("allocatable")
            if advertised:
                self.allocatable[name] = amounts(advertised)
        self.used: dict[str, Requests] = {
            node: dict(requests) for node, requests in requested.items()
        }

    def never(self, node: str, request: Mapping[str, Decimal]) -> list[str]:
        """The resources of ``request`` that ``node`` lacks even empty; [] when it could hold
        one worker (or is not judged)."""
        allocatable = self.allocatable.get(node)
        if allocatable is None:
            return []
        return sorted(
            name for name, amount in request.items() if allocatable.get(name, Decimal(0)) < amount
        )

    def workers(self, node: str, request: Mapping[str, Decimal]) -> tuple[int | None, str]:
        """How many more workers of ``request`` fit ``node`` now, and the resource that bounds
        it; ``(None, "")`` when nothing bounds it (no request, or the node is not judged)."""
        allocatable = self.allocatable.get(node)
        if allocatable is None or not request:
            return None, ""
        used = self.used.get(node) or {}
        best: int | None = None
        bound = ""
        for name, amount in request.items():
            left = allocatable.get(name, Decimal(0)) - used.get(name, Decimal(0))
            count = max(int(left // amount), 0)
            if best is None or count < best:
                best, bound = count, name
        return best, bound

    def take(self, node: str, request: Mapping[str, Decimal], count: int) -> None:
        """``count`` workers of ``request`` admitted on ``node`` in this pass."""
        used = self.used.setdefault(node, {})
        for name, amount in request.items():
            used[name] = used.get(name, Decimal(0)) + amount * count


def never_message(
    request: Mapping[str, Decimal], lacking: Mapping[str, list[str]], room: Room
) -> str:
    """Why no node of ``lacking`` (node -> the resources it lacks) could hold one worker: each
    resource named, what a worker asks and the most any of those nodes has allocatable."""
    by_resource: dict[str, list[str]] = {}
    for node, names in lacking.items():
        for name in names:
            by_resource.setdefault(name, []).append(node)
    parts = []
    for name in sorted(by_resource, key=lambda n: (-len(by_resource[n]), n)):
        most = max(
            (room.allocatable.get(n, {}).get(name, Decimal(0)) for n in by_resource[name]),
            default=Decimal(0),
        )
        parts.append(
            f"{name} (a worker requests {describe(request[name])}, the most a node has "
            f"allocatable is {describe(most)}, on {len(by_resource[name])} node(s))"
        )
    return (
        f"no node the worker template may go to can hold one worker, even empty: "
        f"insufficient {'; insufficient '.join(parts)}; the job holds no GPUs and waits "
        "until its template or the nodes change"
    )

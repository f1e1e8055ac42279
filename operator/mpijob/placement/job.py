"""Placing a whole MPIJob at once: which node and GPUs each worker gets, or why none fit.

All or nothing: :func:`place_job` returns a :class:`Placement` for every worker or a
:class:`NoFit`. Fewest nodes first. On one node, the best ring over the union of the job's GPUs
(the node allocator's preference, then the node with the fewest free GPUs, then by name); over
several nodes, the best bound of inter-node bandwidth and each node's share (see
:mod:`~mpijob.placement.spread`). Workers sit along the chosen ring in index order, so a worker
with several GPUs gets neighbours on it.

The caller decides which nodes are eligible (opted in with ``ack.node.gpu.schedule=topology``,
schedulable, with a readable topology annotation) and which GPUs are used, by index where it
knows them and as a count where it does not; to place several jobs in one pass it feeds each
placement back through :func:`claim`, so no GPU is given twice. Called by the handlers and the
benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final

from mpijob.placement.bandwidth import DEFAULT_INTER_NODE_GBPS
from mpijob.placement.model import Topology

if TYPE_CHECKING:
    from mpijob.placement.spread import NodeView

#: Nodes named in a multi-node summary before "+N more".
_SUMMARY_NODES: Final = 4


@dataclass(frozen=True)
class NodeState:
    """An eligible node: its topology and the GPUs already in use. The caller filters opt-in."""

    name: str
    topology: Topology
    used: frozenset[int] = field(default_factory=frozenset)
    """GPUs known to be in use, by index."""
    unplaced: int = 0
    """GPUs in use whose indices are unknown (held by pods placement did not place): they
    lower how many GPUs the node can give, whichever ones they are."""

    def __post_init__(self) -> None:
        outside = sorted(index for index in self.used if not 0 <= index < self.topology.size)
        if outside:
            raise ValueError(
                f"node {self.name!r}: used GPUs {outside} not on its {self.topology.size} GPUs"
            )

    @cached_property
    def free_mask(self) -> int:
        """Bit mask of the free GPUs."""
        used = sum(1 << index for index in self.used)
        return ((1 << self.topology.size) - 1) & ~used

    @property
    def free_count(self) -> int:
        """How many GPUs the node can still give."""
        return max(self.free_mask.bit_count() - self.unplaced, 0)


@dataclass(frozen=True)
class JobRequest:
    """What a job asks for: ``workers`` pods of ``gpus_per_worker`` GPUs each."""

    workers: int
    gpus_per_worker: int

    def __post_init__(self) -> None:
        if self.workers < 1 or self.gpus_per_worker < 1:
            raise ValueError(
                f"a job needs at least one worker and one GPU per worker, "
                f"got {self.workers}x{self.gpus_per_worker}"
            )

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True)
class WorkerAssignment:
    """The node and GPU indices (ascending) of one worker."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Where every worker goes."""

    assignments: tuple[WorkerAssignment, ...]
    """One per worker, in worker-index order."""
    ring_gbps: float
    """The job's ring bottleneck, GB/s per direction; 0.0 for a one-GPU job (no ring)."""
    summary: str
    """One line for the MPIJob's placement annotation."""

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes used, in worker order, each once."""
        return tuple(dict.fromkeys(assignment.node for assignment in self.assignments))


@dataclass(frozen=True)
class NoFit:
    """Why the job does not fit now; shown to users in a condition."""

    reason: str


def place_job(
    request: JobRequest,
    nodes: Sequence[NodeState],
    *,
    inter_node_gbps: float = DEFAULT_INTER_NODE_GBPS,
) -> Placement | NoFit:
    """Place every worker of a job on the given nodes, or say why it cannot be done."""
    from mpijob.placement.spread import NodeView, fewest_nodes, spread
    from mpijob.placement.tables import tables_for

    if inter_node_gbps <= 0:
        raise ValueError(f"inter-node bandwidth must be positive, got {inter_node_gbps}")
    if len({node.name for node in nodes}) != len(nodes):
        raise ValueError("node names must be unique")
    views = [
        NodeView(i, node.name, tables_for(node.topology), node.free_mask, node.free_count)
        for i, node in enumerate(nodes)
    ]
    single = best_single_node(views, request.total_gpus)
    if single is not None:
        return assemble(request, nodes, {single.position: request.workers}, math.inf)
    if fewest_nodes(views, request.workers, request.gpus_per_worker) is None:
        return NoFit(reason(request, views))
    shares = spread(views, request.workers, request.gpus_per_worker, inter_node_gbps)
    if shares is None:  # pragma: no cover - fewest_nodes said the job fits
        return NoFit(reason(request, views))
    return assemble(request, nodes, shares, inter_node_gbps)


def claim(nodes: Sequence[NodeState], placement: Placement) -> tuple[NodeState, ...]:
    """The nodes with the placement's GPUs marked used; ValueError if any is taken already."""
    taken: dict[str, set[int]] = {}
    for assignment in placement.assignments:
        taken.setdefault(assignment.node, set()).update(assignment.gpus)
    by_name = {node.name: node for node in nodes}
    unknown = sorted(set(taken) - set(by_name))
    if unknown:
        raise ValueError(f"placement uses unknown nodes {unknown}")
    for name, gpus in taken.items():
        clash = sorted(gpus & by_name[name].used)
        if clash:
            raise ValueError(f"GPUs {clash} on node {name!r} are already used")
    return tuple(
        replace(node, used=node.used | frozenset(taken[node.name])) if node.name in taken else node
        for node in nodes
    )


def best_single_node(views: Sequence[NodeView], size: int) -> NodeView | None:
    """The node whose best ``size`` GPUs are best; then fewest free GPUs, then name."""
    from mpijob.placement import allocator

    fitting = [view for view in views if view.free_count >= size]
    if not fitting:
        return None
    rings = [float(view.tables.best[size][view.free_mask]) for view in fitting]
    top = max(rings)
    best: tuple[float, float, int, int] | None = None
    chosen = None
    for view in sorted((v for v, r in zip(fitting, rings, strict=True) if r == top), key=_name):
        rank = allocator.rank(view.tables, view.free_mask, size)
        if rank is None:  # pragma: no cover - the node has room
            continue
        key = (rank.ring_gbps, rank.nvlink_gbps, -rank.numa_nodes, -view.free_count)
        if best is None or key > best:
            best, chosen = key, view
    return chosen


def _name(view: NodeView) -> str:
    return view.name


#: (hardware fingerprint, GPU set) -> the set's ring order; bounded (a handful of hardware
#: models with at most 2**16 sets each in practice far fewer).
_RING_ORDERS: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] = {}
_RING_ORDERS_KEPT = 1 << 16


def assemble(
    request: JobRequest,
    nodes: Sequence[NodeState],
    shares: dict[int, int],
    bound: float,
    *,
    layout: Callable[[int], Any] | None = None,
) -> Placement:
    """Workers laid along each node's best ring; nodes in name order, or by ``layout`` (a key
    on node positions) where the caller lays them out otherwise."""
    from mpijob.placement import allocator, scoring
    from mpijob.placement.tables import tables_for

    assignments: list[WorkerAssignment] = []
    parts = []
    ring = bound
    per_worker = request.gpus_per_worker
    for position in sorted(shares, key=layout or (lambda p: nodes[p].name)):
        node = nodes[position]
        choice = allocator.choose(
            tables_for(node.topology), node.free_mask, shares[position] * per_worker
        )
        if choice is None:  # pragma: no cover - shares come from the same tables
            raise AssertionError(f"node {node.name} lost room while placing")
        ring = min(ring, choice.ring_gbps)
        # The ring depends on the hardware alone: nodes of one model with one set share it, in
        # this placement and the next ones (as they share the hardware's tables).
        key = (node.topology.fingerprint, choice.gpus)
        order = _RING_ORDERS.get(key)
        if order is None:
            if len(_RING_ORDERS) >= _RING_ORDERS_KEPT:
                _RING_ORDERS.clear()
            order = _RING_ORDERS[key] = scoring.ring_order(
                node.topology, choice.gpus, known_gbps=choice.ring_gbps
            )
        for start in range(0, len(order), per_worker):
            gpus = tuple(sorted(order[start : start + per_worker]))
            assignments.append(WorkerAssignment(node.name, gpus))
        parts.append(f"{node.name} [{','.join(map(str, choice.gpus))}]")
    ring_gbps = 0.0 if math.isinf(ring) else ring
    shape = f"{request.workers}x{request.gpus_per_worker} GPU"
    where = parts[0] if len(parts) == 1 else f"{len(parts)} nodes: " + _listed(parts)
    tail = "no ring" if ring_gbps == 0.0 else f"ring {ring_gbps:.1f} GB/s"
    return Placement(tuple(assignments), ring_gbps, f"{shape} on {where} {tail}")


def _listed(parts: list[str]) -> str:
    shown = ", ".join(parts[:_SUMMARY_NODES])
    more = len(parts) - _SUMMARY_NODES
    return f"{shown} +{more} more" if more > 0 else shown


def reason(request: JobRequest, views: Sequence[NodeView]) -> str:
    """What is missing, in words for a condition message."""
    return reason_by_kind(request, [(view, 1) for view in views])


def reason_by_kind(request: JobRequest, kinds: Sequence[tuple[NodeView, int]]) -> str:
    """:func:`reason` for nodes given as one view per kind of node and how many there are."""
    if not kinds:
        return "no opted-in node with a GPU topology"
    views = [view for view, _ in kinds]
    per_worker = request.gpus_per_worker
    most_free = max(view.free_count for view in views)
    nvlink_ring = max(int(view.tables.nvlink_ring_size[view.free_mask]) for view in views)
    ring_text = f"largest free NVLink ring: {nvlink_ring or 'none'}"
    if per_worker > most_free:
        each = "" if request.workers == 1 else f" for each of {request.workers} workers"
        return (
            f"needs {per_worker} GPUs on one opted-in node{each}; "
            f"most free on one node: {most_free}; {ring_text}"
        )
    room = sum(view.free_count // per_worker * n for view, n in kinds)
    free = sum(view.free_count * n for view, n in kinds)
    nodes = sum(n for _, n in kinds)
    return (
        f"needs {request.workers} workers x {per_worker} GPUs; opted-in nodes have room for "
        f"{room} ({free} GPUs free on {nodes} nodes); {ring_text}"
    )

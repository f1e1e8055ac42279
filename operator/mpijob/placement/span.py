"""Placing a whole job over the fabric: the best collective bottleneck from GPU pair to spine.

Model. The figure of merit is the bus bandwidth of the job's all-reduce as one flat ring through
all its GPUs (NCCL's ring algorithm, which nccl-tests' busbw measures): every hop carries the
same volume, so the ring runs at its slowest hop. Inside a node the hops are the node share's
best ring (the tables of :mod:`~mpijob.placement.tables`); between nodes the ring is laid out
with every domain contiguous, so it leaves each domain once and its slowest inter-node hop is
the bandwidth of the innermost domain holding all the job's nodes. The job's figure is the
lower of the two. A flat ring is the conservative choice: it is what runs when nothing better
is configured, and a hierarchical all-reduce on the same placement is never slower on these
links, so a placement good for the ring is good for both; what a hierarchical algorithm adds,
fewer bytes over the outer level, is kept by the tie-breaks below (fewest domains, fewest nodes).

Search. Candidate scopes are one node, then each domain from the innermost level out, then the
whole cluster. A scope's best figure is the highest bound ``t`` (at most its hop bandwidth) at
which its nodes can take exactly the job's workers with every node's share ring at ``t`` or
better: per node, the worker counts allowed at ``t`` are a bit set, and an exact-sum search over
them (:func:`~mpijob.placement.spread.exact_counts`) settles it, fewest nodes first. Per bound,
summed room per domain (numpy, all domains of a level at once) discards the domains that cannot
fit before any search runs. Outer scopes are tried only while their hop bandwidth beats the best
found, so an inner scope wins every tie.

Ties, in order: the inner scope; among domains of one level, the one with the fewest free GPUs
(best fit: larger free domains stay whole for the next job); inside it, the fewest nodes, then
the nodes with the fewest free GPUs (whole nodes stay free); on a node, the node allocator's
own order (what the choice leaves behind).

A job may name a level: ``required`` keeps it inside one domain of that level (or one node) or
it does not fit, saying why; ``preferred`` tries that first and otherwise spans, saying which
level it could not keep. Called by the handlers and the benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mpijob.placement import job, spread
from mpijob.placement.fabric import NODE, Fabric, Location, shared_depth
from mpijob.placement.job import JobRequest, NodeState, NoFit, Placement
from mpijob.placement.spread import NodeView
from mpijob.placement.tables import tables_for

#: Node counts tried past the fewest when the exact sum fails at a bound (gaps in allowed counts).
_MORE_NODES = 4


@dataclass(frozen=True)
class FabricPlacement:
    """Where every worker goes, and which domain holds the job."""

    placement: Placement
    level: str
    """Innermost level of which one domain holds all the job's nodes: ``node``, a fabric
    level, or ``cluster``."""
    domain: Location
    """That domain's path (empty for the cluster; the node's location for ``node``)."""
    summary: str
    """One line for the job's placement annotation and condition."""
    preferred_kept: bool = True
    """False when a ``preferred`` level was asked for and the job had to span it."""

    @property
    def ring_gbps(self) -> float:
        """The job's ring bottleneck, GB/s per direction; 0.0 for a one-GPU job."""
        return self.placement.ring_gbps


@dataclass(frozen=True)
class _Found:
    value: float
    depth: int
    shares: dict[int, int]


class _Search:
    """Per-call precomputation: each node's share rings and allowed counts per bound."""

    def __init__(
        self,
        request: JobRequest,
        views: Sequence[NodeView],
        where: Sequence[Location],
        fabric: Fabric,
    ) -> None:
        self.request = request
        self.views = views
        self.where = where
        self.fabric = fabric
        per_worker = request.gpus_per_worker
        kinds: dict[tuple[int, int, int], int] = {}
        self.kind_of = [
            kinds.setdefault((v.tables.key, v.free_mask, v.free_count), len(kinds)) for v in views
        ]
        self.rings: list[tuple[float, ...]] = [()] * len(kinds)
        for view, kind in zip(views, self.kind_of, strict=True):
            if not self.rings[kind]:
                room = view.free_count // per_worker
                best = view.tables.best
                self.rings[kind] = tuple(
                    float(best[w * per_worker][view.free_mask]) for w in range(1, room + 1)
                )
        values = {r for rings in self.rings for r in rings if not math.isinf(r)}
        values |= {fabric.gbps_at(depth) for depth in range(len(fabric.levels) + 1)}
        self.bounds = sorted(values, reverse=True)
        most = np.zeros((len(kinds), len(self.bounds)), dtype=np.int64)
        for kind, rings in enumerate(self.rings):
            for w, ring in enumerate(rings, start=1):
                most[kind, [i for i, t in enumerate(self.bounds) if ring >= t]] = w
        self.most = most[np.array(self.kind_of, dtype=np.int64)]
        self._bits: dict[tuple[int, float], int] = {}
        self._domains: dict[int, tuple[list[Location], npt.NDArray[np.int64]]] = {}

    def allowed(self, position: int, bound: float) -> int:
        """Bit ``w`` set when the node can take ``w`` workers with its share ring >= bound."""
        kind = self.kind_of[position]
        found = self._bits.get((kind, bound))
        if found is None:
            rings = self.rings[kind]
            found = sum(1 << w for w, ring in enumerate(rings, start=1) if ring >= bound)
            self._bits[(kind, bound)] = found
        return found

    def run(self, min_depth: int) -> _Found | None:
        """The best placement in one scope at least ``min_depth`` domains deep, or None."""
        request, views = self.request, self.views
        best: _Found | None = None
        single = job.best_single_node(views, request.total_gpus)
        if single is not None:
            value = float(single.tables.best[request.total_gpus][single.free_mask])
            depth = len(self.fabric.levels) + 1
            best = _Found(value, depth, {single.position: request.workers})
        for depth in range(len(self.fabric.levels), min_depth - 1, -1):
            hop = self.fabric.gbps_at(depth)
            if best is not None and hop <= best.value:
                break
            found = self._best_at(depth, hop, -math.inf if best is None else best.value)
            if found is not None:
                best = found
        return best

    def domains(self, depth: int) -> tuple[list[Location], npt.NDArray[np.int64]]:
        """The domains ``depth`` deep (paths) and each node's domain id (-1: in none)."""
        found = self._domains.get(depth)
        if found is None:
            ids: dict[Location, int] = {}
            of = [-1] * len(self.views)
            for position, location in enumerate(self.where):
                if len(location) >= depth:
                    of[position] = ids.setdefault(location[:depth], len(ids))
            found = self._domains[depth] = (list(ids), np.array(of, dtype=np.int64))
        return found

    def _best_at(self, depth: int, hop: float, beat: float) -> _Found | None:
        workers = self.request.workers
        paths, of = self.domains(depth)
        if not paths:
            return None
        inside = of >= 0
        room = np.zeros((len(paths), len(self.bounds)), dtype=np.int64)
        np.add.at(room, of[inside], self.most[inside])
        free = np.zeros(len(paths), dtype=np.int64)
        counts = np.array([view.free_count for view in self.views], dtype=np.int64)
        np.add.at(free, of[inside], counts[inside])
        # Nodes grouped by domain: domain d's nodes are grouped[start[d]:start[d + 1]].
        grouped = np.flatnonzero(inside)
        grouped = grouped[np.argsort(of[grouped], kind="stable")]
        start = np.searchsorted(of[grouped], np.arange(len(paths) + 1))
        for index, bound in enumerate(self.bounds):
            if bound > hop:
                continue
            if bound <= beat:
                break
            fitting = np.flatnonzero(room[:, index] >= workers)
            for domain in sorted(fitting, key=lambda d: (free[d], paths[d])):
                members = grouped[start[domain] : start[domain + 1]].tolist()
                shares = self._fit(members, bound)
                if shares is not None:
                    return _Found(bound, depth, shares)
        return None

    def _fit(self, positions: list[int], bound: float) -> dict[int, int] | None:
        """Fewest nodes among ``positions`` taking exactly the job at ``bound``, or None."""
        views, workers = self.views, self.request.workers
        # exact_counts prefers later nodes: the fewest free GPUs come last.
        ordered = sorted(
            positions, key=lambda p: (views[p].free_count, views[p].name), reverse=True
        )
        allowed = [self.allowed(position, bound) for position in ordered]
        hosted, fewest = 0, 0
        for count in sorted((bits.bit_length() - 1 for bits in allowed), reverse=True):
            hosted, fewest = hosted + count, fewest + 1
            if hosted >= workers:
                break
        if hosted < workers:
            return None
        for m in range(fewest, min(fewest + _MORE_NODES, len(ordered)) + 1):
            chosen = spread.exact_counts(allowed, workers, m)
            if chosen is not None:
                return {ordered[i]: count for i, count in chosen.items()}
        return None


def place_on_fabric(
    request: JobRequest,
    nodes: Sequence[NodeState],
    fabric: Fabric,
    locations: Mapping[str, Location],
    *,
    required: str | None = None,
    preferred: str | None = None,
) -> FabricPlacement | NoFit:
    """Place every worker of a job over the fabric, or say why it cannot be done.

    ``locations`` maps node names to their :data:`~mpijob.placement.fabric.Location` (a node
    missing from it is in no domain). At most one of ``required`` and ``preferred`` names a
    level of the fabric (or ``node``).
    """
    if required is not None and preferred is not None:
        raise ValueError("a job names a required or a preferred fabric level, not both")
    if len({node.name for node in nodes}) != len(nodes):
        raise ValueError("node names must be unique")
    asked = required or preferred
    min_depth = fabric.depth_of(asked) if asked is not None else 0
    views = [_view(position, node) for position, node in enumerate(nodes)]
    where = [locations.get(node.name, ()) for node in nodes]
    search = _Search(request, views, where, fabric)
    found = search.run(min_depth)
    kept = True
    if found is None and preferred is not None:
        found, kept = search.run(0), False
    if found is None:
        fits_somewhere = spread.fewest_nodes(views, request.workers, request.gpus_per_worker)
        if required is not None and fits_somewhere is not None:
            return NoFit(_not_within(request, search, required))
        return NoFit(job.reason(request, views))
    return _result(request, nodes, search, found, asked, kept)


def _view(position: int, node: NodeState) -> NodeView:
    # NodeState.free_mask, computed here without its cached_property: one per node per call.
    size = node.topology.size
    used = 0
    for index in node.used:
        used |= 1 << index
    free = ((1 << size) - 1) & ~used
    count = max(free.bit_count() - node.unplaced, 0)
    return NodeView(position, node.name, tables_for(node.topology), free, count)


def _result(
    request: JobRequest,
    nodes: Sequence[NodeState],
    search: _Search,
    found: _Found,
    asked: str | None,
    kept: bool,
) -> FabricPlacement:
    fabric, where = search.fabric, search.where
    used = [where[position] for position in found.shares]
    if len(found.shares) == 1:
        depth, hop = len(fabric.levels) + 1, math.inf
        domain = used[0]
    else:
        depth = shared_depth(used)
        hop, domain = fabric.gbps_at(depth), used[0][:depth]
    placement = job.assemble(
        request, nodes, found.shares, hop, layout=lambda p: (where[p], nodes[p].name)
    )
    level = NODE if math.isinf(hop) else fabric.level_at(depth)
    summary = placement.summary
    if level != NODE:
        spans = len({location[: depth + 1] for location in used})
        inner = fabric.level_at(depth + 1) if depth < len(fabric.levels) else NODE
        where_text = "the cluster" if depth == 0 else f"{level} {domain[-1]}"
        summary += f"; in {where_text}"
        if inner != NODE and spans > 1:
            summary += f" across {spans} {inner} domains"
    if not kept and asked is not None:
        summary += f"; preferred {asked} not kept: {_not_within(request, search, asked)}"
    return FabricPlacement(placement, level, domain, summary, preferred_kept=kept)


def _not_within(request: JobRequest, search: _Search, level: str) -> str:
    """Why no single domain of ``level`` takes the job, for a condition message."""
    fabric = search.fabric
    per_worker = request.gpus_per_worker
    shape = f"{request.workers}x{per_worker} GPUs"
    if level == NODE:
        most = max((v.free_count for v in search.views), default=0)
        return f"needs {shape} on one node; most free on one node: {most} GPUs"
    depth = fabric.depth_of(level)
    label = fabric.levels[depth - 1].label
    paths, of = search.domains(depth)
    if not paths:
        return f"needs {shape} within one {level}; no eligible node has the label {label}"
    room = [0] * len(paths)
    for view, domain in zip(search.views, of, strict=True):
        if domain >= 0:
            room[int(domain)] += view.free_count // per_worker
    top = max(range(len(paths)), key=lambda d: (room[d], paths[d]))
    return (
        f"needs {shape} within one {level} ({label}); most room in one {level}: "
        f"{room[top]} workers ({paths[top][-1]})"
    )

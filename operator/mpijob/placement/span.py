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

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mpijob.placement import allocator, fabric_labels, job, spread
from mpijob.placement.fabric import NODE, Fabric, Location, shared_depth
from mpijob.placement.job import JobRequest, NodeState, NoFit, Placement
from mpijob.placement.spread import NodeView
from mpijob.placement.tables import Tables, tables_for

#: Node counts tried past the fewest when the exact sum fails at a bound (gaps in allowed counts).
_MORE_NODES = 4
#: Domains with more nodes than this are cut to what the search can use before it sorts them.
_FEW = 64


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
    """Per-call precomputation over kinds of node: nodes of one hardware with the same GPUs in
    use are one kind, so share rings, allowed counts and room are worked out once per kind (a
    few hundred) rather than once per node (thousands), and summed per domain in numpy."""

    def __init__(
        self,
        request: JobRequest,
        nodes: Sequence[NodeState],
        locations: Mapping[str, Location],
        fabric: Fabric,
    ) -> None:
        self.request = request
        self.nodes = nodes
        self.fabric = fabric
        per_worker = request.gpus_per_worker
        self.tables: list[Tables] = []
        self.free_mask: list[int] = []
        self.free_count: list[int] = []
        self.rings: list[tuple[float, ...]] = []
        kinds: dict[tuple[str, frozenset[int], int], int] = {}
        places: dict[Location, int] = {}
        kind_of: list[int] = []
        place_of: list[int] = []
        # The one loop over every node: everything else works on kinds and places.
        for node in nodes:
            key = (node.topology.fingerprint, node.used, node.unplaced)
            kind = kinds.get(key)
            if kind is None:
                kind = kinds[key] = self._add_kind(node, per_worker)
            kind_of.append(kind)
            location = locations.get(node.name, ())
            place = places.get(location)
            if place is None:
                place = places[location] = len(places)
            place_of.append(place)
        self.places = list(places)
        self.kind_list = kind_of
        self.kind_of = np.array(kind_of, dtype=np.int64)
        self.place_of = np.array(place_of, dtype=np.int64)
        values = {r for rings in self.rings for r in rings if not math.isinf(r)}
        values |= {fabric.gbps_at(depth) for depth in range(len(fabric.levels) + 1)}
        self.bounds = sorted(values, reverse=True)
        # most[kind, i]: the most workers a node of the kind takes with its ring >= bounds[i].
        widest = max((len(rings) for rings in self.rings), default=0)
        ring_of = np.full((len(self.rings), widest), -math.inf)
        for kind, rings in enumerate(self.rings):
            ring_of[kind, : len(rings)] = rings
        reaches = ring_of[:, :, None] >= np.array(self.bounds)[None, None, :]
        self.most = (reaches * np.arange(1, widest + 1)[None, :, None]).max(axis=1, initial=0)
        self.counts = np.array(self.free_count, dtype=np.int64)
        self._bits: dict[tuple[int, float], int] = {}
        self._domains: dict[int, tuple[list[Location], npt.NDArray[np.int64]]] = {}
        self._per_domain: dict[int, _PerDomain] = {}
        self._single: tuple[int, float] | None = None
        self._single_known = False

    def _add_kind(self, node: NodeState, per_worker: int) -> int:
        tables = tables_for(node.topology)
        used = 0
        for index in node.used:
            used |= 1 << index
        free = ((1 << tables.size) - 1) & ~used
        count = max(free.bit_count() - node.unplaced, 0)
        best = tables.best
        self.tables.append(tables)
        self.free_mask.append(free)
        self.free_count.append(count)
        self.rings.append(
            tuple(float(best[w * per_worker][free]) for w in range(1, count // per_worker + 1))
        )
        return len(self.tables) - 1

    def location(self, position: int) -> Location:
        return self.places[int(self.place_of[position])]

    def kinds(self) -> list[tuple[NodeView, int]]:
        """One view per kind of node (its first node's) and how many nodes are of it."""
        how_many = np.bincount(self.kind_of, minlength=len(self.tables)).tolist()
        first = {kind: position for position, kind in reversed(list(enumerate(self.kind_list)))}
        return [
            (
                NodeView(
                    first[kind],
                    self.nodes[first[kind]].name,
                    self.tables[kind],
                    self.free_mask[kind],
                    self.free_count[kind],
                ),
                n,
            )
            for kind, n in enumerate(how_many)
        ]

    def fits_somewhere(self) -> bool:
        """Whether the nodes together have room for every worker, wherever they are."""
        per_worker = self.request.gpus_per_worker
        how_many = np.bincount(self.kind_of, minlength=len(self.tables))
        room = how_many * (self.counts // per_worker)
        return int(room.sum()) >= self.request.workers

    def allowed(self, kind: int, bound: float) -> int:
        """Bit ``w`` set when a node of the kind can take ``w`` workers with its share ring >=
        bound."""
        found = self._bits.get((kind, bound))
        if found is None:
            rings = self.rings[kind]
            found = sum(1 << w for w, ring in enumerate(rings, start=1) if ring >= bound)
            self._bits[(kind, bound)] = found
        return found

    def single(self) -> tuple[int, float] | None:
        """The node whose best ``total`` GPUs are best (then fewest free GPUs, then name) and
        that ring, as :func:`~mpijob.placement.job.best_single_node` picks it; None if none."""
        if not self._single_known:
            self._single, self._single_known = self._best_single(), True
        return self._single

    def _best_single(self) -> tuple[int, float] | None:
        size = self.request.total_gpus
        rings = {
            kind: float(self.tables[kind].best[size][self.free_mask[kind]])
            for kind in range(len(self.tables))
            if self.free_count[kind] >= size
        }
        if not rings:
            return None
        top = max(rings.values())
        keys: dict[int, tuple[float, float, int, int]] = {}
        for kind, ring in rings.items():
            if ring != top:
                continue
            rank = allocator.rank(self.tables[kind], self.free_mask[kind], size)
            if rank is not None:
                keys[kind] = (
                    rank.ring_gbps,
                    rank.nvlink_gbps,
                    -rank.numa_nodes,
                    -self.free_count[kind],
                )
        if not keys:  # pragma: no cover - a kind with room has a rank
            return None
        best = max(keys.values())
        chosen = [kind for kind, key in keys.items() if key == best]
        positions = np.flatnonzero(np.isin(self.kind_of, chosen)).tolist()
        position = min(positions, key=lambda p: self.nodes[p].name)
        return position, top

    def run(self, min_depth: int) -> _Found | None:
        """The best placement in one scope at least ``min_depth`` domains deep, or None."""
        request = self.request
        best: _Found | None = None
        single = self.single()
        if single is not None:
            depth = len(self.fabric.levels) + 1
            best = _Found(single[1], depth, {single[0]: request.workers})
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
            of_place = [
                ids.setdefault(location[:depth], len(ids)) if len(location) >= depth else -1
                for location in self.places
            ]
            of = np.array(of_place, dtype=np.int64)[self.place_of]
            found = self._domains[depth] = (list(ids), of)
        return found

    def per_domain(self, depth: int) -> _PerDomain:
        """How many nodes of each kind every domain ``depth`` deep holds, and its members."""
        found = self._per_domain.get(depth)
        if found is None:
            paths, of = self.domains(depth)
            kinds = len(self.tables)
            inside = np.flatnonzero(of >= 0)
            pairs = of[inside] * kinds + self.kind_of[inside]
            counts = np.bincount(pairs, minlength=len(paths) * kinds).reshape(len(paths), kinds)
            # Nodes grouped by domain: domain d's nodes are grouped[start[d]:start[d + 1]].
            grouped = inside[np.argsort(of[inside], kind="stable")]
            start = np.searchsorted(of[grouped], np.arange(len(paths) + 1))
            found = self._per_domain[depth] = _PerDomain(counts, grouped, start)
        return found

    def _best_at(self, depth: int, hop: float, beat: float) -> _Found | None:
        workers = self.request.workers
        paths, _ = self.domains(depth)
        if not paths:
            return None
        per = self.per_domain(depth)
        room = per.counts @ self.most
        free = per.counts @ self.counts
        for index, bound in enumerate(self.bounds):
            if bound > hop:
                continue
            if bound <= beat:
                break
            fitting = np.flatnonzero(room[:, index] >= workers).tolist()
            for domain in sorted(fitting, key=lambda d: (free[d], paths[d])):
                members = per.grouped[per.start[domain] : per.start[domain + 1]]
                shares = self._fit(members, bound)
                if shares is not None:
                    return _Found(bound, depth, shares)
        return None

    def _fit(self, members: npt.NDArray[np.int64], bound: float) -> dict[int, int] | None:
        """Fewest nodes among ``members`` taking exactly the job at ``bound``, or None."""
        workers, nodes = self.request.workers, self.nodes
        kinds = self.kind_of[members]
        present, how_many = np.unique(kinds, return_counts=True)
        taking = sorted(
            (
                (self.allowed(k, bound).bit_length() - 1, n)
                for k, n in zip(present.tolist(), how_many.tolist(), strict=True)
            ),
            reverse=True,
        )
        hosted, fewest = 0, 0
        for count, n in taking:
            if count <= 0:
                break
            need = -(-(workers - hosted) // count)
            if need <= n:
                hosted, fewest = workers, fewest + need
                break
            hosted, fewest = hosted + count * n, fewest + n
        if hosted < workers:
            return None
        most_nodes = min(fewest + _MORE_NODES, len(members))
        positions = members.tolist()
        if len(positions) > _FEW:
            # Among nodes of one kind the search only ever takes the last ``m`` in its order
            # (exact_counts keeps the last m of each set of allowed counts, its fallback the m
            # allowing most): the rest of each kind cannot change the answer.
            by_kind: dict[int, list[int]] = {}
            for position, kind in zip(positions, kinds.tolist(), strict=True):
                by_kind.setdefault(kind, []).append(position)
            positions = []
            for group in by_kind.values():
                positions += (
                    group
                    if len(group) <= most_nodes
                    else heapq.nsmallest(most_nodes, group, key=lambda p: nodes[p].name)
                )
        # exact_counts prefers later nodes: the fewest free GPUs come last.
        of, counts = self.kind_list, self.free_count
        ordered = sorted(positions, key=lambda p: (counts[of[p]], nodes[p].name), reverse=True)
        allowed = [self.allowed(of[position], bound) for position in ordered]
        for m in range(fewest, most_nodes + 1):
            chosen = spread.exact_counts(allowed, workers, m)
            if chosen is not None:
                return {ordered[i]: count for i, count in chosen.items()}
        return None


@dataclass(frozen=True)
class _PerDomain:
    counts: npt.NDArray[np.int64]
    """``counts[d, k]``: nodes of kind ``k`` in domain ``d``."""
    grouped: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]


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
    search = _Search(request, nodes, locations, fabric)
    found = search.run(min_depth)
    kept = True
    if found is None and preferred is not None:
        found, kept = search.run(0), False
    if found is None:
        if required is not None and search.fits_somewhere():
            return NoFit(_not_within(request, search, required))
        return NoFit(job.reason_by_kind(request, search.kinds()))
    return _result(request, nodes, search, found, asked, kept)


def _result(
    request: JobRequest,
    nodes: Sequence[NodeState],
    search: _Search,
    found: _Found,
    asked: str | None,
    kept: bool,
) -> FabricPlacement:
    fabric, where = search.fabric, search.location
    used = [where(position) for position in found.shares]
    if len(found.shares) == 1:
        depth, hop = len(fabric.levels) + 1, math.inf
        domain = used[0]
    else:
        depth = shared_depth(used)
        hop, domain = fabric.gbps_at(depth), used[0][:depth]
    placement = job.assemble(
        request, nodes, found.shares, hop, layout=lambda p: (where(p), nodes[p].name)
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
        most = max((search.free_count[k] for k in set(search.kind_list)), default=0)
        return f"needs {shape} on one node; most free on one node: {most} GPUs"
    depth = fabric.depth_of(level)
    label = fabric.levels[depth - 1].label
    # Levels read from HyperNodes are named by their tier, not by the label standing in for it.
    hypernodes = fabric_labels.source(label) != label
    paths, _ = search.domains(depth)
    if not paths:
        missing = (
            f"is in a {fabric_labels.source(label)} HyperNode"
            if hypernodes
            else f"has the label {label}"
        )
        return f"needs {shape} within one {level}; no eligible node {missing}"
    workers_of = np.array(search.free_count, dtype=np.int64) // per_worker
    room = (search.per_domain(depth).counts @ workers_of).tolist()
    top = max(range(len(paths)), key=lambda d: (room[d], paths[d]))
    return (
        f"needs {shape} within one {level} "
        f"({fabric_labels.source(label) + ' HyperNodes' if hypernodes else label}); "
        f"most room in one {level}: "
        f"{room[top]} workers ({paths[top][-1]})"
    )

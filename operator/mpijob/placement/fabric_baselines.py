"""What fabric placement is measured against: the optimum, an upper bound, two other policies.

* :func:`figure`: the figure of merit of any worker split (see :mod:`~mpijob.placement.span`):
  each node's share at its best ring, the inter-node hop of the innermost shared domain.
* :func:`exhaustive`: the best figure over every split of the workers over the nodes (each
  node any count it has room for), by a memoised search over (node, workers left, domain
  shared so far); exact, and independent of the production search.
* :func:`upper_bound`: a certified bound for large cases: any split within one domain is at
  most that domain's hop and at most the highest ``t`` at which the nodes' largest counts with
  a share ring of ``t`` or better add up to the job (a relaxation of the exact sum).
* :func:`fewest_domains`: a Kueue-TAS-like policy: the innermost level at which one domain has
  room, the best-fitting such domain, then down the levels the fewest children (largest room
  first, the last one best-fitting), down to nodes; room counts GPUs only.
* :func:`lowest_tier_first`: a Volcano-like policy: the lowest tier with a domain that has
  room, the fullest such domain (binpack), then worker by worker onto the fullest node that
  still has room.

Neither policy sees the links inside a node; both get our node allocator for the GPUs of each
node's share, so a difference comes from which nodes and counts they choose. Used by the tests
and the benchmark; not by the operator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cache

from mpijob.placement.fabric import Fabric, Location, shared_depth
from mpijob.placement.job import JobRequest, NodeState
from mpijob.placement.tables import tables_for

Shares = dict[int, int]


def share_ring(node: NodeState, gpus: int) -> float:
    """Best ring of ``gpus`` of the node's free GPUs (``inf`` for one GPU, 0 if too few)."""
    if gpus > node.free_count:
        return 0.0
    return float(tables_for(node.topology).best[gpus][node.free_mask])


def figure(
    request: JobRequest,
    nodes: Sequence[NodeState],
    fabric: Fabric,
    locations: Mapping[str, Location],
    shares: Shares,
) -> float:
    """The job's ring bottleneck for a split (``inf`` for a one-GPU job); 0.0 for none."""
    used = [position for position, count in shares.items() if count > 0]
    if not used or sum(shares.values()) != request.workers:
        return 0.0
    value = min(share_ring(nodes[p], shares[p] * request.gpus_per_worker) for p in used)
    if len(used) > 1:
        depth = shared_depth([locations.get(nodes[p].name, ()) for p in used])
        value = min(value, fabric.gbps_at(depth))
    return value


def exhaustive(
    request: JobRequest,
    nodes: Sequence[NodeState],
    fabric: Fabric,
    locations: Mapping[str, Location],
    *,
    min_depth: int = 0,
) -> float:
    """The best figure over every split (within one domain ``min_depth`` deep); 0.0 if none."""
    per_worker = request.gpus_per_worker
    where = [locations.get(node.name, ()) for node in nodes]
    rooms = [node.free_count // per_worker for node in nodes]
    rings = [
        [share_ring(node, w * per_worker) for w in range(room + 1)]
        for node, room in zip(nodes, rooms, strict=True)
    ]
    after = [0] * (len(nodes) + 1)
    for position in reversed(range(len(nodes))):
        after[position] = after[position + 1] + rooms[position]

    @cache
    def best(position: int, left: int, shared: Location, used: int) -> float:
        if left == 0:
            if used == 1:
                return math.inf
            return fabric.gbps_at(len(shared)) if len(shared) >= min_depth else -math.inf
        if after[position] < left:
            return -math.inf
        found = best(position + 1, left, shared, used)
        here = where[position]
        for count in range(1, min(rooms[position], left) + 1):
            ring = rings[position][count]
            if ring <= found:
                continue
            joined = here if used == 0 else shared[: shared_depth([shared, here])]
            rest = best(position + 1, left - count, joined, min(used + 1, 2))
            found = max(found, min(ring, rest))
        return found

    value = best(0, request.workers, (), 0)
    return max(value, 0.0)


def upper_bound(
    request: JobRequest,
    nodes: Sequence[NodeState],
    fabric: Fabric,
    locations: Mapping[str, Location],
) -> float:
    """A certified upper bound on the best figure (see the module doc); 0.0 if none fits."""
    per_worker = request.gpus_per_worker
    bound = max(
        (
            share_ring(node, request.total_gpus)
            for node in nodes
            if node.free_count >= request.total_gpus
        ),
        default=0.0,
    )
    tops: list[dict[float, int]] = []
    for node in nodes:
        most: dict[float, int] = {}
        for w in range(1, node.free_count // per_worker + 1):
            ring = share_ring(node, w * per_worker)
            most[ring] = max(most.get(ring, 0), w)
        tops.append(most)
    values = sorted({ring for most in tops for ring in most}, reverse=True)
    for depth in range(len(fabric.levels) + 1):
        hop = fabric.gbps_at(depth)
        if hop <= bound:
            continue
        domains: dict[Location, list[int]] = {}
        for position, node in enumerate(nodes):
            location = locations.get(node.name, ())
            if len(location) >= depth:
                domains.setdefault(location[:depth], []).append(position)
        for members in domains.values():
            for t in values:
                if min(t, hop) <= bound:
                    break
                room = sum(
                    max((w for ring, w in tops[p].items() if ring >= t), default=0) for p in members
                )
                if room >= request.workers:
                    bound = min(t, hop)
                    break
    return bound


def _room(node: NodeState, per_worker: int) -> int:
    return node.free_count // per_worker


def _child(location: Location, depth: int, name: str) -> tuple[str, ...]:
    """A node's child domain ``depth + 1`` deep, or the node itself below its last label."""
    return location[: depth + 1] if len(location) > depth else ("\0node", name)


def fewest_domains(
    request: JobRequest,
    nodes: Sequence[NodeState],
    fabric: Fabric,
    locations: Mapping[str, Location],
) -> Shares | None:
    """Kueue-TAS-like choice (see the module doc), or None when the job does not fit."""
    per_worker, workers = request.gpus_per_worker, request.workers
    rooms = [_room(node, per_worker) for node in nodes]
    where = [locations.get(node.name, ()) for node in nodes]
    single = [p for p, room in enumerate(rooms) if room >= workers]
    if single:
        chosen = min(single, key=lambda p: (rooms[p], nodes[p].name))
        return {chosen: workers}
    for depth in range(len(fabric.levels), -1, -1):
        domains: dict[Location, list[int]] = {}
        for position, location in enumerate(where):
            if len(location) >= depth:
                domains.setdefault(location[:depth], []).append(position)
        fitting = [
            (sum(rooms[p] for p in members), path, members)
            for path, members in domains.items()
            if sum(rooms[p] for p in members) >= workers
        ]
        if fitting:
            _, _, members = min(fitting)
            shares: Shares = {}
            _descend(members, depth, workers, rooms, where, nodes, shares)
            return shares
    return None


def _descend(
    members: list[int],
    depth: int,
    need: int,
    rooms: list[int],
    where: list[Location],
    nodes: Sequence[NodeState],
    shares: Shares,
) -> None:
    """Split ``need`` over the fewest children of a domain, down to nodes."""
    if len(members) == 1 and rooms[members[0]] >= need:
        shares[members[0]] = need
        return
    children: dict[tuple[str, ...], list[int]] = {}
    for position in members:
        children.setdefault(_child(where[position], depth, nodes[position].name), []).append(
            position
        )
    room = {key: sum(rooms[p] for p in group) for key, group in children.items()}
    left = sorted(children, key=lambda key: (-room[key], key))
    while need > 0:
        fits = [key for key in left if room[key] >= need]
        key = min(fits, key=lambda k: (room[k], k)) if fits else left[0]
        take = min(need, room[key])
        _descend(children[key], depth + 1, take, rooms, where, nodes, shares)
        left.remove(key)
        need -= take


def lowest_tier_first(
    request: JobRequest,
    nodes: Sequence[NodeState],
    fabric: Fabric,
    locations: Mapping[str, Location],
) -> Shares | None:
    """Volcano-like choice (see the module doc), or None when the job does not fit."""
    per_worker, workers = request.gpus_per_worker, request.workers
    rooms = [_room(node, per_worker) for node in nodes]
    for depth in range(len(fabric.levels), -1, -1):
        domains: dict[Location, list[int]] = {}
        for position, node in enumerate(nodes):
            location = locations.get(node.name, ())
            if len(location) >= depth:
                domains.setdefault(location[:depth], []).append(position)
        fitting = []
        for path, members in domains.items():
            if sum(rooms[p] for p in members) >= workers:
                total = sum(nodes[p].topology.size for p in members)
                free = sum(nodes[p].free_count for p in members)
                fitting.append(((free / total, path), members))
        if not fitting:
            continue
        _, members = min(fitting)
        left = {p: rooms[p] for p in members}
        shares: Shares = {}
        for _ in range(workers):
            position = min(
                (p for p in members if left[p] > 0),
                key=lambda p: (
                    nodes[p].free_count - (rooms[p] - left[p]) * per_worker,
                    nodes[p].name,
                ),
            )
            shares[position] = shares.get(position, 0) + 1
            left[position] -= 1
        return shares
    return None

"""How many workers each node takes when a job cannot fit on one node.

Fewest nodes first: ``m`` is the least number of nodes whose room (free GPUs over GPUs per
worker) adds up to the job. Then the best ring: a job spread over nodes runs at the slowest of
the inter-node link and each node's share (the best ring of that node's GPUs, looked up in its
tables), so for each candidate bound ``t``, from the highest down, each node allows the worker
counts whose share reaches ``t``, and the first ``t`` at which ``m`` such nodes can take exactly
the job wins. That exact-sum choice is a small dynamic programme over bit sets (nodes with the
same allowed counts are interchangeable, so at most ``m`` of each kind are considered); past a
size budget a greedy pass stands in, which is exact when the allowed counts have no gaps.
Among equal choices the nodes with the fewest free GPUs are used, to keep whole nodes free.
Called by :func:`mpijob.placement.job.place_job`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from mpijob.placement.tables import Tables

#: Above this many (node kinds x nodes) steps the exact-sum search gives way to a greedy pass.
_EXACT_BUDGET: Final = 20_000


class NodeView(NamedTuple):
    """A node as placement sees it: its tables and free GPUs (a tuple: thousands are built per
    decision)."""

    position: int
    """Position in the caller's node list."""
    name: str
    tables: Tables
    free_mask: int
    free_count: int


def fewest_nodes(views: Sequence[NodeView], workers: int, gpus_per_worker: int) -> int | None:
    """Least number of nodes that can host the workers, or None if all together cannot."""
    rooms = sorted((view.free_count // gpus_per_worker for view in views), reverse=True)
    hosted = 0
    for count, room in enumerate(rooms, start=1):
        hosted += room
        if hosted >= workers:
            return count
    return None


def spread(
    views: Sequence[NodeView], workers: int, gpus_per_worker: int, inter_node_gbps: float
) -> dict[int, int] | None:
    """Workers per node position over the fewest nodes with the best ring, or None."""
    m = fewest_nodes(views, workers, gpus_per_worker)
    if m is None:
        return None
    # Worse-fitting nodes first: the search prefers what it considers last.
    ordered = sorted(views, key=lambda view: (view.free_count, view.name), reverse=True)
    shares = [_share_rings(view, gpus_per_worker, inter_node_gbps) for view in ordered]
    bounds = sorted({ring for rings in shares for ring in rings}, reverse=True)
    for bound in bounds:
        allowed = [_allowed(rings, bound) for rings in shares]
        chosen = _exact(allowed, workers, m) or _greedy(allowed, workers, m)
        if chosen is not None:
            return {ordered[i].position: count for i, count in chosen.items()}
    return None  # pragma: no cover - the lowest bound allows every count


def exact_counts(allowed: list[int], workers: int, m: int) -> dict[int, int] | None:
    """Worker counts for exactly ``m`` of the nodes, summing to ``workers``, each count one the
    node allows (bit ``w`` of ``allowed[i]``); later nodes are preferred. None if there are none.

    Also used by :mod:`~mpijob.placement.span` inside one fabric domain.
    """
    return _exact(allowed, workers, m) or _greedy(allowed, workers, m)


def _share_rings(view: NodeView, gpus_per_worker: int, inter_node_gbps: float) -> list[float]:
    """``rings[w - 1]``: the job's bound if this node takes ``w`` workers."""
    room = view.free_count // gpus_per_worker
    return [
        min(inter_node_gbps, float(view.tables.best[w * gpus_per_worker][view.free_mask]))
        for w in range(1, room + 1)
    ]


def _allowed(rings: list[float], bound: float) -> int:
    """Bit ``w`` set when taking ``w`` workers keeps the job at ``bound`` or better."""
    return sum(1 << w for w, ring in enumerate(rings, start=1) if ring >= bound)


def _exact(allowed: list[int], workers: int, m: int) -> dict[int, int] | None:
    """Exactly ``m`` nodes taking exactly ``workers`` in total, or None (also when too big)."""
    # A node in the answer takes at least what the other m-1 cannot: drop smaller counts.
    most = sorted((bits.bit_length() - 1 for bits in allowed), reverse=True)
    floor = workers - sum(most[: m - 1])
    allowed = [bits & ~((1 << max(floor, 0)) - 1) for bits in allowed]
    kinds: dict[int, list[int]] = {}
    for position, bits in enumerate(allowed):
        if bits:
            kinds.setdefault(bits, []).append(position)
    # Only m nodes of a kind can matter; keep the last ones (the preferred ones).
    copies = sorted(position for group in kinds.values() for position in group[-m:])
    if len(copies) * m > _EXACT_BUDGET:
        return None
    limit = (1 << (workers + 1)) - 1
    reach = [1] + [0] * m  # reach[j]: bit s set when j nodes can take s workers
    history: list[list[int]] = []
    for position in copies:
        history.append(list(reach))
        options = _counts(allowed[position])
        for j in range(m, 0, -1):
            if reach[j - 1]:
                for count in options:
                    reach[j] |= (reach[j - 1] << count) & limit
    if not reach[m] >> workers & 1:
        return None
    chosen: dict[int, int] = {}
    left, nodes = workers, m
    for position, before in zip(reversed(copies), reversed(history), strict=True):
        if nodes == 0:
            break
        for count in sorted(_counts(allowed[position]), reverse=True):
            if count <= left and before[nodes - 1] >> (left - count) & 1:
                chosen[position] = count
                left, nodes = left - count, nodes - 1
                break
    return chosen


def _greedy(allowed: list[int], workers: int, m: int) -> dict[int, int] | None:
    """The ``m`` nodes allowing the most workers, trimmed down to the job; None if that fails."""
    biggest = sorted(
        (position for position, counts in enumerate(allowed) if counts),
        key=lambda position: allowed[position].bit_length(),
    )[-m:]
    chosen = {position: allowed[position].bit_length() - 1 for position in biggest}
    excess = sum(chosen.values()) - workers
    if len(chosen) < m or excess < 0:
        return None
    for position in biggest:
        if excess == 0:
            break
        lower = [c for c in _counts(allowed[position]) if chosen[position] - excess <= c]
        trimmed = min(lower)
        excess -= chosen[position] - trimmed
        chosen[position] = trimmed
    return chosen if excess == 0 else None


def _counts(bits: int) -> list[int]:
    return [count for count in range(1, bits.bit_length()) if bits >> count & 1]

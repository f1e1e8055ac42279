"""Allocators to compare ours against: exhaustive search, first-fit, and NVIDIA's BestEffort.

* :func:`brute_force` scores every ``k``-subset with the reference scoring: the optimum.
* :func:`first_fit` takes the lowest free indices (go-gpuallocator's SimplePolicy).
* :func:`best_effort` re-implements go-gpuallocator's BestEffortPolicy from its description:
  pair scores by link type (PCIe level 10..60 points, 100 per NVLink, no NVLink credit through
  NVSwitch, as upstream has none), every partition of the available GPUs into groups of ``k``,
  the best-scoring partition that has a group holding all required GPUs, then that partition's
  best group. Its cost grows with the partition count (:func:`best_effort_partitions`).

Used by the tests and the benchmark; not by the operator.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from mpijob.placement import scoring
from mpijob.placement.allocator import Choice
from mpijob.placement.model import PcieLevel, Topology

_ring_memo: dict[tuple[str, tuple[int, ...]], float] = {}


def ring_gbps(topology: Topology, gpus: tuple[int, ...]) -> float:
    """:func:`scoring.ring_gbps`, remembered per topology and set (brute force revisits sets)."""
    key = (topology.fingerprint, gpus)
    found = _ring_memo.get(key)
    if found is None:
        found = _ring_memo[key] = scoring.ring_gbps(topology, gpus)
    return found


def brute_force(topology: Topology, free: Iterable[int], size: int) -> Choice | None:
    """Best set by (ring, NVLink total, fewest NUMA nodes) over all subsets; lowest wins ties."""
    best: tuple[float, float, int] | None = None
    chosen: tuple[int, ...] = ()
    for gpus in itertools.combinations(sorted(set(free)), size):
        key = (
            ring_gbps(topology, gpus),
            scoring.nvlink_gbps_total(topology, gpus),
            -scoring.numa_span(topology, gpus),
        )
        if best is None or key > best:
            best, chosen = key, gpus
    return None if best is None else Choice(chosen, best[0])


def first_fit(topology: Topology, free: Iterable[int], size: int) -> Choice | None:
    """The ``size`` lowest free indices."""
    chosen = tuple(sorted(set(free)))[:size]
    if len(chosen) < size:
        return None
    return Choice(chosen, ring_gbps(topology, chosen))


#: BestEffort's points per PCIe level (its P2PLink types).
_PCIE_POINTS: Final = {
    PcieLevel.INTERNAL: 60,
    PcieLevel.PIX: 50,
    PcieLevel.PXB: 40,
    PcieLevel.PHB: 30,
    PcieLevel.NODE: 20,
    PcieLevel.SYS: 10,
}
_POINTS_PER_NVLINK: Final = 100


def pair_score(topology: Topology, a: int, b: int) -> int:
    """BestEffort's score of a pair: PCIe points plus 100 per direct NVLink."""
    link = topology.link(a, b)
    points = 0 if link.pcie is None else _PCIE_POINTS[link.pcie]
    if link.nvlinks and not link.nvswitch:
        points += _POINTS_PER_NVLINK * link.nvlinks
    return points


def best_effort(
    topology: Topology, available: Sequence[int], size: int, required: Sequence[int] = ()
) -> tuple[int, ...]:
    """BestEffort's choice, in upstream's enumeration order; empty when it finds none."""
    if size <= 0 or len(available) < size or len(required) > size:
        return ()
    if size == 1:
        return (required[0],) if required else (available[0],)
    must = set(required)
    padding = -len(available) % size
    devices: list[int | None] = [*available, *([None] * padding)]
    scores: dict[tuple[int | None, ...], int] = {}

    def score(group: tuple[int | None, ...]) -> int:
        found = scores.get(group)
        if found is None:
            found = scores[group] = _set_score(topology, group)
        return found

    best: list[tuple[int | None, ...]] | None = None
    best_score = 0
    for partition in partitions(devices, size):
        if not any(None not in group and must <= set(group) for group in partition):
            continue
        total = sum(score(group) for group in partition)
        if best is None or total > best_score:
            best, best_score = partition, total
    if best is None:
        return ()
    groups = [group for group in best if None not in group and must <= set(group)]
    chosen = max(groups, key=score)  # first max wins
    return tuple(sorted(gpu for gpu in chosen if gpu is not None))


def best_effort_choice(topology: Topology, free: Iterable[int], size: int) -> Choice | None:
    """:func:`best_effort` on the free GPUs in index order, with its ring."""
    chosen = best_effort(topology, sorted(set(free)), size)
    return Choice(chosen, ring_gbps(topology, chosen)) if chosen else None


def best_effort_partitions(available: int, size: int) -> int:
    """How many partitions BestEffort scores for ``available`` GPUs and groups of ``size``."""
    if size <= 1 or available <= size:
        return 1
    padding = -available % size
    partners = math.comb(available, size - padding) if padding else 1
    rest = available - (size - padding) if padding else available
    groups = rest // size
    orderings = math.prod([math.factorial(size)] * groups) * math.factorial(groups)
    return partners * math.factorial(rest) // orderings


def _set_score(topology: Topology, group: Sequence[int | None]) -> int:
    real = [gpu for gpu in group if gpu is not None]
    return sum(pair_score(topology, a, b) for a, b in itertools.combinations(real, 2))


def partitions(devices: list[int | None], size: int) -> Iterator[list[tuple[int | None, ...]]]:
    """Partitions into groups of ``size``, each group led by the first device left, in upstream's
    order; the padding (None, at the end of ``devices``) stays together in one group."""
    if len(devices) == size:
        yield [tuple(devices)]
        return
    padding = devices.count(None)

    def split(
        rest: list[int | None], accum: list[tuple[int | None, ...]]
    ) -> Iterator[list[tuple[int | None, ...]]]:
        if not rest:
            yield list(accum)
            return
        head, tail = rest[0], rest[1:]
        for others in _group_mates(tail, size - 1, padding):
            taken = set(others)
            accum.append((head, *(tail[i] for i in others)))
            yield from split([d for i, d in enumerate(tail) if i not in taken], accum)
            accum.pop()

    yield from split(devices, [])


def _group_mates(tail: list[int | None], count: int, padding: int) -> Iterator[tuple[int, ...]]:
    """Positions in ``tail`` to group with its head, lexicographically, as upstream visits them
    less the groups it would skip (those holding part of the padding)."""
    real = [i for i, device in enumerate(tail) if device is not None]
    pads = tuple(i for i, device in enumerate(tail) if device is None)
    without = itertools.combinations(real, count)
    if not pads or count < padding:
        yield from without
        return
    with_all = (mates + pads for mates in itertools.combinations(real, count - padding))
    yield from heapq.merge(without, with_all)

"""The node allocator: the best ``k`` free GPUs of one node.

Preference, in order: the best ring (figure of merit), then more NVLink bandwidth inside the
set, then fewer NUMA nodes, then what the choice leaves behind: the best ring the remaining
free GPUs still offer for ``k`` GPUs, then for every other size from the largest down, then the
least bandwidth cut between the set and the rest; the lowest GPU indices break what remains.
The first three come from the sorted subset tables (one vectorised scan); the leftover is looked
up only for the sets tied on them. Decisions are cached by (topology tables, free mask, size).
Called by :mod:`~mpijob.placement.job`, the benchmark and tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mpijob.placement.model import Topology
from mpijob.placement.tables import Masks, Tables, gpus_of, mask_of, tables_for


@dataclass(frozen=True)
class Choice:
    """GPUs chosen on one node and the figure of merit of the set."""

    gpus: tuple[int, ...]
    """Chosen GPU indices, ascending."""
    ring_gbps: float
    """Best ring bottleneck of the set, GB/s per direction (``inf`` for one GPU)."""


@dataclass(frozen=True)
class Rank:
    """The part of a choice's preference that compares across nodes."""

    ring_gbps: float
    nvlink_gbps: float
    numa_nodes: int


def best_set(topology: Topology, free: Iterable[int], size: int) -> Choice | None:
    """The preferred ``size`` GPUs among ``free`` on this topology, or None if too few are free."""
    if size < 1:
        raise ValueError(f"a request needs at least one GPU, got {size}")
    tables = tables_for(topology)
    free_mask = mask_of(list(free)) & ((1 << tables.size) - 1)
    return choose(tables, free_mask, size)


def rank(tables: Tables, free_mask: int, size: int) -> Rank | None:
    """Ring, NVLink total and NUMA span of the best choice, without the leftover tie-break."""
    _by_key.setdefault(tables.key, tables)
    return _cached_rank(tables.key, free_mask, size)


@lru_cache(maxsize=1 << 16)
def _cached_rank(key: int, free_mask: int, size: int) -> Rank | None:
    tables = _by_key[key]
    found = _top_group(tables, free_mask, size)
    if found is None:
        return None
    mask = int(tables.by_size[size][found[0]])
    return Rank(float(tables.ring[mask]), float(tables.nvlink[mask]), int(tables.numa[mask]))


@lru_cache(maxsize=1 << 16)
def _cached_choice(key: int, free_mask: int, size: int) -> Choice | None:
    return _choose(_by_key[key], free_mask, size)


_by_key: dict[int, Tables] = {}


def choose(tables: Tables, free_mask: int, size: int) -> Choice | None:
    """:func:`best_set` on precomputed tables and a free mask (cached)."""
    _by_key.setdefault(tables.key, tables)
    return _cached_choice(tables.key, free_mask, size)


def clear_cache() -> None:
    """Forget cached decisions (the benchmark measures uncached ones)."""
    _cached_choice.cache_clear()
    _cached_rank.cache_clear()


def _top_group(tables: Tables, free_mask: int, size: int) -> tuple[int, int] | None:
    """Positions ``[start, stop)`` in ``by_size[size]`` of the best group with a fitting set."""
    if size > tables.size or free_mask.bit_count() < size:
        return None
    candidates = tables.by_size[size]
    fits = (candidates & ~np.int64(free_mask)) == 0
    first = int(fits.argmax())
    return first, int(tables.group_stop[size][first])


def _choose(tables: Tables, free_mask: int, size: int) -> Choice | None:
    found = _top_group(tables, free_mask, size)
    if found is None:
        return None
    start, stop = found
    group = tables.by_size[size][start:stop]
    group = group[(group & ~np.int64(free_mask)) == 0]
    chosen = int(group[0]) if len(group) == 1 else _least_damage(tables, free_mask, size, group)
    return Choice(gpus_of(chosen), float(tables.ring[chosen]))


def _least_damage(tables: Tables, free_mask: int, size: int, group: Masks) -> int:
    """Among equally good sets, the one that leaves the best GPUs behind."""
    free = np.int64(free_mask)
    left = free & ~group
    remaining = free_mask.bit_count() - size
    sizes = [size] if size <= remaining else []
    sizes += [other for other in range(remaining, 1, -1) if other != size]
    # np.lexsort sorts ascending with the last key first: negate what should be large.
    keys = [
        group,
        np.round(tables.internal[free_mask] - tables.internal[group] - tables.internal[left], 6),
    ]
    keys += [-tables.best[other][left] for other in reversed(sizes)]
    return int(group[np.lexsort(keys)[0]])

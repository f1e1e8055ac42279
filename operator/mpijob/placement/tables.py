"""Per-topology tables over every subset of GPUs, so that decisions are lookups.

A subset is a bit mask. For a topology of ``n <= 16`` GPUs, :func:`tables_for` computes once
(and caches by hardware fingerprint, so a thousand nodes of one model share it):

* ``ring[mask]``: the set's figure of merit (see :mod:`~mpijob.placement.scoring`), from a
  Hamiltonian-cycle dynamic programme over subsets per bandwidth threshold, vectorised;
* ``nvlink[mask]``, ``numa[mask]``, ``internal[mask]``: the tie-breakers' inputs;
* ``best[k][free]``: the best ring of any ``k`` GPUs among ``free`` (a max over subsets, done
  with a sum-over-subsets pass), which answers "how good can this node do" in O(1);
* ``by_size[k]``: the ``k``-subsets sorted by preference, in groups of equal key;
* ``nvlink_ring_size[free]``: the largest all-NVLink ring among ``free`` (for messages).

Used by :mod:`~mpijob.placement.allocator` and :mod:`~mpijob.placement.job`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from mpijob.placement.model import Topology

Masks = npt.NDArray[np.int64]
Values = npt.NDArray[np.float64]

#: Marks "no ring" in tables: every real ring has positive bandwidth.
NONE: Final = 0.0


@dataclass(frozen=True, eq=False)
class Tables:
    """Lookups for one hardware topology; see the module doc for each table."""

    key: int
    """Small id, unique per fingerprint in this process (for decision caches)."""
    size: int
    ring: Values
    nvlink: Values
    numa: npt.NDArray[np.int64]
    internal: Values
    best: tuple[Values, ...]
    """``best[k]`` for ``k`` in ``0..size`` (``best[0]`` unused)."""
    by_size: tuple[Masks, ...]
    group_start: tuple[npt.NDArray[np.int64], ...]
    """For each sorted ``k``-subset, the position where its group of equal key starts."""
    group_stop: tuple[npt.NDArray[np.int64], ...]
    nvlink_ring_size: npt.NDArray[np.int64]


_registry: dict[str, Tables] = {}


def tables_for(topology: Topology) -> Tables:
    """The tables of a topology's hardware, computed on first use."""
    found = _registry.get(topology.fingerprint)
    if found is None:
        found = _compute(topology, key=len(_registry))
        _registry[topology.fingerprint] = found
    return found


def mask_of(gpus: frozenset[int] | set[int] | tuple[int, ...] | list[int]) -> int:
    """Bit mask of a set of GPU indices."""
    mask = 0
    for index in gpus:
        mask |= 1 << index
    return mask


def gpus_of(mask: int) -> tuple[int, ...]:
    """GPU indices of a bit mask, ascending."""
    return tuple(index for index in range(mask.bit_length()) if mask >> index & 1)


def _compute(topology: Topology, *, key: int) -> Tables:
    n = topology.size
    masks = np.arange(1 << n, dtype=np.int64)
    bits = [(masks >> i) & 1 for i in range(n)]
    pop = np.sum(bits, axis=0).astype(np.int64)
    low = np.full(1 << n, -1, dtype=np.int64)
    for i in reversed(range(n)):
        low[bits[i] == 1] = i
    layers = [masks[pop == p] for p in range(n + 1)]
    gbps = np.array([[topology.gbps(a, b) for b in range(n)] for a in range(n)])

    ring = _rings(n, gbps, layers, low)
    nvlink_adjacency = [
        sum(1 << b for b in range(n) if b != a and topology.link(a, b).nvlinks) for a in range(n)
    ]
    nvlink_ok = _hamiltonian(n, nvlink_adjacency, layers, low)

    nvlink = np.zeros(1 << n)
    internal = np.zeros(1 << n)
    for a in range(n):
        for b in range(a + 1, n):
            both = (bits[a] & bits[b]).astype(bool)
            nvlink[both] += topology.nvlink_gbps(a, b)
            internal[both] += gbps[a, b]
    numa_ids = sorted({gpu.numa_node for gpu in topology.gpus}, key=str)
    numa_bits = np.zeros(1 << n, dtype=np.int64)
    for gpu in topology.gpus:
        numa_bits |= bits[gpu.index] << numa_ids.index(gpu.numa_node)
    numa = np.sum([(numa_bits >> i) & 1 for i in range(len(numa_ids))], axis=0).astype(np.int64)

    best = [np.zeros(1 << n)]
    by_size = [np.zeros(0, dtype=np.int64)]
    starts = [np.zeros(0, dtype=np.int64)]
    stops = [np.zeros(0, dtype=np.int64)]
    for k in range(1, n + 1):
        best.append(_best_over_subsets(n, np.where(pop == k, ring, NONE)))
        sized = layers[k]
        order = np.lexsort((sized, numa[sized], -nvlink[sized], -ring[sized]))
        sized = sized[order]
        start, stop = _groups(ring[sized], nvlink[sized], numa[sized])
        by_size.append(sized)
        starts.append(start)
        stops.append(stop)
    ring_sizes = np.where(nvlink_ok, pop, 0).astype(np.float64)
    nvlink_ring_size = _best_over_subsets(n, ring_sizes).astype(np.int64)

    return Tables(
        key=key,
        size=n,
        ring=ring,
        nvlink=nvlink,
        numa=numa,
        internal=internal,
        best=tuple(best),
        by_size=tuple(by_size),
        group_start=tuple(starts),
        group_stop=tuple(stops),
        nvlink_ring_size=nvlink_ring_size,
    )


def _rings(n: int, gbps: Values, layers: list[Masks], low: Masks) -> Values:
    """Figure of merit of every subset: the highest threshold at which it has a ring."""
    ring = np.zeros(1 << n)
    ring[layers[1]] = np.inf
    thresholds = sorted(
        {float(gbps[a, b]) for a in range(n) for b in range(a + 1, n)}, reverse=True
    )
    unset = np.ones(1 << n, dtype=bool)
    unset[layers[0]] = unset[layers[1]] = False
    for threshold in thresholds:
        if not unset.any():
            break
        adjacency = [
            sum(1 << b for b in range(n) if b != a and gbps[a, b] >= threshold) for a in range(n)
        ]
        has_ring = _hamiltonian(n, adjacency, layers, low)
        newly = has_ring & unset
        ring[newly] = threshold
        unset &= ~newly
    return ring


def _hamiltonian(
    n: int, adjacency: list[int], layers: list[Masks], low: Masks
) -> npt.NDArray[np.bool_]:
    """Which subsets (of two or more GPUs) have a Hamiltonian cycle in the given graph.

    ``ends[mask]`` holds the GPUs at which a path from the mask's lowest GPU through all of the
    mask can end; a cycle exists when one of them links back to the lowest GPU. Two GPUs form a
    "ring" when they are linked (the two directions of one link).
    """
    ends = np.zeros(1 << n, dtype=np.int64)
    ends[layers[1]] = layers[1]
    adjacency_of = np.array(adjacency, dtype=np.int64)
    for layer in layers[2:]:
        for v in range(n):
            bit = 1 << v
            chosen = layer[((layer & bit) != 0) & (low[layer] != v)]
            reachable = (ends[chosen ^ bit] & adjacency_of[v]) != 0
            ends[chosen[reachable]] |= bit
    has_ring = np.zeros(1 << n, dtype=bool)
    for size, layer in enumerate(layers):
        if size >= 2:  # the smallest ring is a linked pair
            closes = ends[layer] & adjacency_of[low[layer]]
            has_ring[layer] = (ends[layer] != 0) if size == 2 else (closes != 0)
    return has_ring


def _best_over_subsets(n: int, values: Values) -> Values:
    """``out[mask]`` = max of ``values`` over the subsets of ``mask`` (sum-over-subsets pass)."""
    out = values.copy()
    for i in range(n):
        view = out.reshape(-1, 2, 1 << i)
        np.maximum(view[:, 1, :], view[:, 0, :], out=view[:, 1, :])
    return out


def _groups(
    ring: Values, nvlink: Values, numa: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Start and stop position of each element's run of equal (ring, nvlink, numa) keys."""
    count = len(ring)
    change = np.ones(count, dtype=bool)
    change[1:] = (ring[1:] != ring[:-1]) | (nvlink[1:] != nvlink[:-1]) | (numa[1:] != numa[:-1])
    first = np.flatnonzero(change)
    run = np.cumsum(change) - 1
    last = np.append(first[1:], count)
    return first[run].astype(np.int64), last[run].astype(np.int64)

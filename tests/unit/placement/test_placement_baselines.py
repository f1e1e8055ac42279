"""The comparison allocators, BestEffort above all, behave as their upstream descriptions say."""

from __future__ import annotations

import itertools

import pytest

from mpijob.placement import baselines, topologies

pytestmark = pytest.mark.unit

ALL = tuple(range(8))


@pytest.mark.parametrize(
    ("available", "required", "size", "expected"),
    [
        ((0, 2, 4, 5), (), 2, (4, 5)),
        ((0, 4, 5, 6), (), 2, (5, 6)),
        ((0, 3, 1), (), 2, (0, 3)),
        ((0, 1, 4), (), 2, (0, 4)),
        (ALL, (4,), 1, (4,)),
        (ALL, (4,), 2, (4, 7)),
        (ALL, (4,), 4, (4, 5, 6, 7)),
        (ALL, (0, 2, 4, 6), 4, (0, 2, 4, 6)),
        (tuple(range(1, 8)), (0, 1, 2, 3), 4, ()),
    ],
)
def test_best_effort_allocate(
    available: tuple[int, ...], required: tuple[int, ...], size: int, expected: tuple[int, ...]
) -> None:
    """Counterpart of go-gpuallocator's BestEffort tests on its DGX-1 Volta fixture."""
    topology = topologies.load("dgx1-v100")
    assert baselines.best_effort(topology, available, size, required) == expected


def test_best_effort_scores_nvswitch_pairs_on_pcie_only() -> None:
    h100 = topologies.load("dgx-h100")
    assert baselines.pair_score(h100, 0, 1) == 20
    v100 = topologies.load("dgx1-v100")
    assert baselines.pair_score(v100, 0, 3) == 230


@pytest.mark.parametrize(
    ("available", "size", "partitions"),
    [
        (8, 2, 105),
        (8, 3, 280),
        (8, 4, 35),
        (16, 2, 2_027_025),
        (16, 3, 22_422_400),
        (16, 4, 2_627_625),
        (16, 8, 6_435),
    ],
)
def test_best_effort_partition_counts(available: int, size: int, partitions: int) -> None:
    assert baselines.best_effort_partitions(available, size) == partitions


@pytest.mark.parametrize(("available", "size"), [(8, 2), (8, 3), (7, 3), (6, 4)])
def test_partition_enumeration_matches_the_count(available: int, size: int) -> None:
    devices: list[int | None] = [*range(available), *([None] * (-available % size))]
    partitions = list(baselines.partitions(devices, size))
    assert len(partitions) == baselines.best_effort_partitions(available, size)
    assert len({tuple(sorted(map(str, p))) for p in partitions}) == len(partitions)


def test_first_fit_takes_the_lowest_free_indices() -> None:
    topology = topologies.load("dgx1-v100")
    choice = baselines.first_fit(topology, {7, 1, 2, 5}, 3)
    assert choice is not None
    assert choice.gpus == (1, 2, 5)
    assert baselines.first_fit(topology, {1}, 2) is None


def naive_partitions(devices: list[int | None], size: int) -> list[list[tuple[int | None, ...]]]:
    """Upstream's walk as described: every group led by the first device left, any mates in
    order, skipping groups that hold only part of the padding."""
    padding = devices.count(None)
    found: list[list[tuple[int | None, ...]]] = []

    def walk(rest: list[int | None], accum: list[tuple[int | None, ...]]) -> None:
        if not rest:
            found.append(list(accum))
            return
        for mates in itertools.combinations(range(1, len(rest)), size - 1):
            group = (rest[0], *(rest[i] for i in mates))
            if group.count(None) not in (0, padding):
                continue
            walk([d for i, d in enumerate(rest) if i and i not in mates], [*accum, group])

    walk(devices, [])
    return found


@pytest.mark.parametrize(("available", "size"), [(7, 3), (6, 4), (5, 2), (9, 4)])
def test_partitions_come_in_upstream_order(available: int, size: int) -> None:
    devices: list[int | None] = [*range(available), *([None] * (-available % size))]
    assert list(baselines.partitions(devices, size)) == naive_partitions(devices, size)

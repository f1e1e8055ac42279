"""The NVLink picture's layout: GPUs by NUMA node and NVSwitch, every GPU drawn once, no two
links of one group crossing, widths by bandwidth; and each shipped topology rendered."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from mpijob.console import picture, plot
from mpijob.console.topology import GpuUse
from mpijob.placement import topologies

pytestmark = pytest.mark.unit


def test_the_crossing_check_sees_a_crossing_and_not_a_shared_end() -> None:
    """The check the layout tests rely on: a square's two diagonals cross; two sides meeting at
    a corner do not."""
    assert picture.crosses(((0, 0), (1, 1)), ((0, 1), (1, 0)))
    assert not picture.crosses(((0, 0), (1, 0)), ((0, 0), (0, 1)))
    assert not picture.crosses(((0, 0), (1, 0)), ((0, 1), (1, 1)))


@pytest.mark.parametrize("name", topologies.NAMES)
def test_each_gpu_is_drawn_once_inside_its_numa_nodes_box(name: str) -> None:
    topology = topologies.load(name)
    drawn = picture.layout(topology)
    assert sorted(drawn.positions) == list(range(topology.size))
    assert len(set(drawn.positions.values())) == topology.size
    grouped = [gpu for group in drawn.groups for gpu in group.gpus]
    assert sorted(grouped) == list(range(topology.size))
    for group in drawn.groups:
        x, y, w, h = group.box
        numa = {topology.gpus[gpu].numa_node for gpu in group.gpus}
        assert len(numa) == 1, group
        for gpu in group.gpus:
            px, py = drawn.positions[gpu]
            assert x < px < x + w, (gpu, group)
            assert y < py < y + h, (gpu, group)


@pytest.mark.parametrize("name", topologies.NAMES)
def test_no_two_links_inside_a_group_cross_and_none_passes_over_a_gpu(name: str) -> None:
    topology = topologies.load(name)
    drawn = picture.layout(topology)
    group_of = {gpu: i for i, group in enumerate(drawn.groups) for gpu in group.gpus}
    inside = [e for e in drawn.edges if e.b is not None and group_of[e.a] == group_of[e.b]]
    for one, other in itertools.combinations(inside, 2):
        if group_of[one.a] == group_of[other.a]:
            assert not picture.crosses(one.points, other.points), (one.a, one.b, other.a, other.b)
    for edge in drawn.edges:
        for gpu, centre in drawn.positions.items():
            if gpu not in (edge.a, edge.b):
                assert not picture._near(edge.points, centre), (edge.a, edge.b, gpu)


@pytest.mark.parametrize("name", topologies.NAMES)
def test_links_are_as_wide_as_their_bandwidth(name: str) -> None:
    drawn = picture.layout(topologies.load(name))
    ordered = sorted(drawn.edges, key=lambda e: e.gbps)
    assert all(a.width <= b.width for a, b in itertools.pairwise(ordered))
    assert all(a.width < b.width for a, b in itertools.pairwise(ordered) if a.gbps < b.gbps)


def test_a_dgx1_is_its_two_quads_side_by_side_joined_by_cross_links() -> None:
    topology = topologies.load("dgx1-v100")
    drawn = picture.layout(topology)
    assert [set(g.gpus) for g in drawn.groups] == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    for group in drawn.groups:  # each quad a square
        xs = {drawn.positions[g][0] for g in group.gpus}
        ys = {drawn.positions[g][1] for g in group.gpus}
        assert len(xs) == len(ys) == 2
    assert max(drawn.positions[g][0] for g in range(4)) < min(
        drawn.positions[g][0] for g in range(4, 8)
    )
    # Every NVLinked pair drawn once: 16 links, widths NV2 > NV1.
    assert sorted((e.a, e.b) for e in drawn.edges) == sorted(
        (link.a, link.b) for link in topology.links if link.nvlinks
    )
    # GPU i and GPU i+4 face each other: two of the four cross-links run straight.
    cross = [e for e in drawn.edges if e.b is not None and (e.b - e.a) == 4]
    assert sum(len(e.points) == 2 for e in cross) == 2


@pytest.mark.parametrize("name", ["dgx2", "dgx-a100", "dgx-h100", "gb200-tray"])
def test_an_nvswitch_system_has_one_link_per_gpu_to_the_switch(name: str) -> None:
    topology = topologies.load(name)
    drawn = picture.layout(topology)
    assert drawn.switch is not None
    assert sorted(e.a for e in drawn.edges) == list(range(topology.size))
    assert all(e.b is None for e in drawn.edges)
    assert f"NV{topology.link(0, 1).nvlinks} per GPU" in drawn.switch_label
    _, bar_y, _, bar_h = drawn.switch
    above = {g for g, (_, y) in drawn.positions.items() if y > bar_y + bar_h}
    below = {g for g, (_, y) in drawn.positions.items() if y < bar_y}
    assert above | below == set(range(topology.size))
    assert above
    assert below


@pytest.mark.parametrize("name", topologies.NAMES)
def test_each_shipped_topology_renders_with_every_gpu_labelled_once(
    name: str, tmp_path: Path
) -> None:
    topology = topologies.load(name)
    usage = {0: GpuUse("ns/a", "a-worker-0"), 1: GpuUse("ns/a", "a-worker-1")}
    texts = [t.get_text() for t in plot.draw(topology, usage, "t").axes[0].texts]
    for gpu in range(topology.size):
        assert texts.count(f"GPU{gpu}") == 1
    path = tmp_path / f"{name}.png"
    plot.write_png(path, topology, usage, node="n")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""Shipped topologies carry the published hardware facts, and bad topologies are refused."""

from __future__ import annotations

import itertools

import pytest

from mpijob.placement import scoring, topologies
from mpijob.placement.model import Gpu, Link, PcieLevel, Topology

pytestmark = pytest.mark.unit

DGX1V_NVLINK_QUADS = {
    (0, 1, 2, 3),
    (4, 5, 6, 7),
    (0, 1, 4, 5),
    (0, 2, 4, 6),
    (0, 3, 4, 7),
    (1, 2, 5, 6),
    (1, 3, 5, 7),
    (2, 3, 6, 7),
}


def all_nvlink_ring(topology: Topology, gpus: tuple[int, ...]) -> bool:
    order = scoring.ring_order(topology, gpus)
    hops = zip(order, (*order[1:], order[0]), strict=True)
    return all(topology.link(a, b).nvlinks for a, b in hops)


@pytest.mark.parametrize("name", topologies.NAMES)
def test_every_name_loads(name: str) -> None:
    topology = topologies.load(name)
    assert topology.name == name
    assert topology.size in (4, 8, 16)
    assert topology.graph.number_of_edges() == topology.size * (topology.size - 1) // 2


def test_unknown_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown topology 'dgx9'.*dgx1-v100"):
        topologies.load("dgx9")


def test_dgx1_v100_has_exactly_eight_nvlink_ring_quads() -> None:
    topology = topologies.load("dgx1-v100")
    quads = {q for q in itertools.combinations(range(8), 4) if all_nvlink_ring(topology, q)}
    assert quads == DGX1V_NVLINK_QUADS
    triangles = [t for t in itertools.combinations(range(8), 3) if all_nvlink_ring(topology, t)]
    assert len(triangles) == 8


def test_dgx1_v100_nv2_links_form_one_ring_of_all_gpus() -> None:
    topology = topologies.load("dgx1-v100")
    cycle = (0, 3, 2, 1, 5, 6, 7, 4)
    hops = zip(cycle, (*cycle[1:], cycle[0]), strict=True)
    assert all(topology.link(a, b).nvlinks == 2 for a, b in hops)
    assert scoring.ring_gbps(topology, range(8)) == 50.0
    assert sum(topology.link(a, b).nvlinks for a in range(8) for b in range(8) if a != b) == 48


def test_dgx1_p100_links() -> None:
    topology = topologies.load("dgx1-p100")
    linked = {(link.a, link.b) for link in topology.links if link.nvlinks}
    assert linked == {
        *itertools.combinations(range(4), 2),
        *itertools.combinations(range(4, 8), 2),
        (0, 4),
        (1, 5),
        (2, 6),
        (3, 7),
    }
    assert topology.gbps(0, 1) == 20.0


@pytest.mark.parametrize(
    ("name", "links", "gbps"),
    [("dgx2", 6, 150.0), ("dgx-a100", 12, 300.0), ("dgx-h100", 18, 450.0)],
)
def test_nvswitch_systems_are_all_to_all(name: str, links: int, gbps: float) -> None:
    topology = topologies.load(name)
    assert all(link.nvswitch and link.nvlinks == links for link in topology.links)
    assert {topology.gbps(link.a, link.b) for link in topology.links} == {gbps}


def test_bridged_pcie_box_and_rtx8000() -> None:
    bridged = topologies.load("pcie-nvlink-bridge")
    bridges = {(link.a, link.b) for link in bridged.links if link.nvlinks}
    assert bridges == {(0, 2), (1, 3), (4, 5), (6, 7)}
    assert {link.pcie for link in bridged.links if not link.nvlinks} == {PcieLevel.SYS}
    rtx = topologies.load("rtx8000-4x")
    assert [(link.a, link.b, link.nvlinks, link.pcie) for link in rtx.links] == [
        (0, 1, 0, PcieLevel.NODE),
        (0, 2, 0, PcieLevel.SYS),
        (0, 3, 2, PcieLevel.SYS),
        (1, 2, 2, PcieLevel.SYS),
        (1, 3, 0, PcieLevel.SYS),
        (2, 3, 0, PcieLevel.NODE),
    ]


def test_pcie_levels_order_bandwidth() -> None:
    box = topologies.load("pcie-8gpu-2socket")
    assert box.gbps(0, 1) > box.gbps(0, 2) > box.gbps(0, 4)
    assert box.link(0, 1).pcie is PcieLevel.PIX
    assert box.link(0, 4).pcie is PcieLevel.SYS


def test_for_node_gives_stable_unique_identities() -> None:
    first = topologies.for_node("dgx1-v100", "node-a")
    again = topologies.for_node("dgx1-v100", "node-a")
    other = topologies.for_node("dgx1-v100", "node-b")
    uuids = first.uuids_of(range(8))
    assert uuids is not None
    assert len(set(uuids)) == 8
    assert uuids == again.uuids_of(range(8))
    assert set(uuids).isdisjoint(other.uuids_of(range(8)) or ())
    assert first.fingerprint == other.fingerprint == topologies.load("dgx1-v100").fingerprint
    assert topologies.load("dgx1-v100").uuids_of([0]) is None


def test_graph_edges_carry_the_link() -> None:
    graph = topologies.load("dgx1-v100").graph
    assert graph.edges[0, 3] == {
        "nvlinks": 2,
        "nvlink_gen": 2,
        "nvswitch": False,
        "pcie": PcieLevel.PHB,
        "gbps": 50.0,
    }
    assert graph.nodes[4]["numa_node"] == 1


@pytest.mark.parametrize(
    ("gpus", "links", "nvlink_gen", "message"),
    [
        ((Gpu(0), Gpu(1)), (), 0, r"no link for GPU pair \(0, 1\)"),
        ((Gpu(0), Gpu(2)), (Link(0, 1, pcie=PcieLevel.SYS),), 0, "position 1 has index 2"),
        ((Gpu(0), Gpu(1)), (Link(0, 1, nvlinks=2),), 0, "NVLink generation is unknown"),
        ((Gpu(0), Gpu(1)), (Link(0, 1),), 0, "neither NVLink nor a PCIe level"),
        ((Gpu(0, "u"), Gpu(1, "u")), (Link(0, 1, pcie=PcieLevel.SYS),), 0, "not unique"),
        ((), (), 0, "has 0 GPUs"),
        (tuple(Gpu(i) for i in range(17)), (), 0, "has 17 GPUs"),
    ],
)
def test_inconsistent_topologies_are_refused(
    gpus: tuple[Gpu, ...], links: tuple[Link, ...], nvlink_gen: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Topology("bad", gpus, links, nvlink_gen=nvlink_gen)

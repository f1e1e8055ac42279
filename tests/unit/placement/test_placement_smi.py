"""Parsing pasted ``nvidia-smi topo -m`` text, and rendering it back."""

from __future__ import annotations

import pytest

from mpijob.placement import smi, topologies
from mpijob.placement.model import PcieLevel

pytestmark = pytest.mark.unit

# A DGX-1 V100 as recent drivers print it: NIC columns and rows, GPU NUMA ID, the legend.
DGX1V_PASTED = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1"
    "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    """\
GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\t0\t\tN/A
GPU1\tNV1\t X \tNV2\tNV1\tSYS\tNV2\tSYS\tSYS\tPIX\tSYS\t0-19,40-59\t0\t\tN/A
GPU2\tNV1\tNV2\t X \tNV2\tSYS\tSYS\tNV1\tSYS\tPHB\tSYS\t0-19,40-59\t0\t\tN/A
GPU3\tNV2\tNV1\tNV2\t X \tSYS\tSYS\tSYS\tNV1\tPHB\tSYS\t0-19,40-59\t0\t\tN/A
GPU4\tNV2\tSYS\tSYS\tSYS\t X \tNV1\tNV1\tNV2\tSYS\tPIX\t20-39,60-79\t1\t\tN/A
GPU5\tSYS\tNV2\tSYS\tSYS\tNV1\t X \tNV2\tNV1\tSYS\tPIX\t20-39,60-79\t1\t\tN/A
GPU6\tSYS\tSYS\tNV1\tSYS\tNV1\tNV2\t X \tNV2\tSYS\tPHB\t20-39,60-79\t1\t\tN/A
GPU7\tSYS\tSYS\tSYS\tNV1\tNV2\tNV1\tNV2\t X \tSYS\tPHB\t20-39,60-79\t1\t\tN/A
NIC0\tPIX\tPIX\tPHB\tPHB\tSYS\tSYS\tSYS\tSYS\t X \tSYS
NIC1\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPHB\tPHB\tSYS\t X

Legend:

  X    = Self
  SYS  = PCIe and the interconnect between NUMA nodes
  NV#  = a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""
)

# Older drivers: spaces instead of tabs, no NUMA column, NV12 to every peer (an NVSwitch box).
SWITCHED_PASTED = """\
        GPU0    GPU1    GPU2    GPU3    CPU Affinity
GPU0     X      NV12    NV12    NV12    0-31
GPU1    NV12     X      NV12    NV12    0-31
GPU2    NV12    NV12     X      NV12    32-63
GPU3    NV12    NV12    NV12     X      32-63
"""


@pytest.mark.parametrize("name", topologies.NAMES)
def test_render_parse_round_trip(name: str) -> None:
    shipped = topologies.load(name)
    text = smi.render(shipped)
    parsed = smi.parse(text, name=name, nvlink_gen=shipped.nvlink_gen, pcie_gen=shipped.pcie_gen)
    assert smi.render(parsed) == text
    assert [g.numa_node for g in parsed.gpus] == [g.numa_node for g in shipped.gpus]
    for link in parsed.links:
        original = shipped.link(link.a, link.b)
        assert (link.nvlinks, link.nvswitch) == (original.nvlinks, original.nvswitch)
        # NV# hides the PCIe level under it; everything else is kept.
        assert link.pcie == (None if original.nvlinks else original.pcie)
        assert parsed.gbps(link.a, link.b) == shipped.gbps(link.a, link.b)


def test_pasted_dgx1_v100_matches_the_shipped_one() -> None:
    parsed = smi.parse(DGX1V_PASTED, nvlink_gen=2)
    shipped = topologies.load("dgx1-v100")
    assert [(link.a, link.b, link.nvlinks) for link in parsed.links] == [
        (link.a, link.b, link.nvlinks) for link in shipped.links
    ]
    assert [g.numa_node for g in parsed.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert parsed.link(0, 5).pcie is PcieLevel.SYS
    assert not any(link.nvswitch for link in parsed.links)


def test_nvlinks_to_every_peer_beyond_one_gpu_are_nvswitch() -> None:
    parsed = smi.parse(SWITCHED_PASTED, name="a100")
    assert all(link.nvswitch and link.nvlinks == 12 for link in parsed.links)
    assert [g.numa_node for g in parsed.gpus] == [None] * 4
    assert parsed.gbps(0, 3) == 300.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nothing here\n", "no header"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tSYS\t X \n", "NV1 one way and SYS the other"),
        ("\tGPU0\tGPU1\nGPU0\t X \tQPI\nGPU1\tQPI\t X \n", "unknown code 'QPI'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tSYS\n", r"expected rows GPU0..GPU1"),
        ("\tGPU0\tGPU2\nGPU0\t X \tSYS\n", "not GPU0..GPU1"),
        ("\tGPU0\tGPU1\nGPU0\t X\n", "short"),
    ],
)
def test_bad_text_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        smi.parse(text)

"""Parsing pasted ``nvidia-smi topo -m`` text, and rendering it back."""

from __future__ import annotations

from collections.abc import Callable

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


# The legend every driver prints under the matrix.
_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""  # noqa: E501

# One H100 as driver 580 prints it, piped: the header is underlined with SGR codes, the
# NUMA Affinity cell is followed by an empty cell, and GPU NUMA ID is N/A.
H100_DRIVER_580 = (
    "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \t0-51,104-155\t0\t\tN/A\n" + _LEGEND
)

# A DGX H100 with four of its NICs: every label underlined on its own, NV18 to each peer
# through NVSwitch, NIC columns and rows, two NUMA nodes, and the NIC legend.
_U, _R = "\x1b[4m", "\x1b[0m"
DGX_H100_PASTED = (
    "\t"
    + "\t".join(
        f"{_U}{label}{_R}"
        for label in [
            *(f"GPU{i}" for i in range(8)),
            *(f"NIC{i}" for i in range(4)),
            "CPU Affinity",
            "NUMA Affinity",
            "GPU NUMA ID",
        ]
    )
    + "\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18"
    "\tPXB\tNODE\tSYS\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18"
    "\tPXB\tNODE\tSYS\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18"
    "\tNODE\tPXB\tSYS\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18\tNV18"
    "\tNODE\tPXB\tSYS\tSYS\t0-55,112-167\t0\t\tN/A\n"
    "GPU4\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18\tNV18"
    "\tSYS\tSYS\tPXB\tNODE\t56-111,168-223\t1\t\tN/A\n"
    "GPU5\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18\tNV18"
    "\tSYS\tSYS\tPXB\tNODE\t56-111,168-223\t1\t\tN/A\n"
    "GPU6\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X \tNV18"
    "\tSYS\tSYS\tNODE\tPXB\t56-111,168-223\t1\t\tN/A\n"
    "GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t X "
    "\tSYS\tSYS\tNODE\tPXB\t56-111,168-223\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tSYS\tSYS\n"
    "NIC1\tNODE\tNODE\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tNODE\t X \tSYS\tSYS\n"
    "NIC2\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tNODE\tNODE\tSYS\tSYS\t X \tNODE\n"
    "NIC3\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPXB\tPXB\tSYS\tSYS\tNODE\t X \n"
    + _LEGEND
    + "\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n  NIC2: mlx5_2\n  NIC3: mlx5_3\n\n"
)

# Four PCIe GPUs on two sockets, as copied from a Windows terminal: CRLF endings, blank lines
# around the table, the header underlined.
PCIE_4GPU_CRLF = (
    "\r\n\r\n"
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\r\n"
    "GPU0\t X \tPIX\tSYS\tSYS\t0-15,32-47\t0\t\tN/A\r\n"
    "GPU1\tPIX\t X \tSYS\tSYS\t0-15,32-47\t0\t\tN/A\r\n"
    "GPU2\tSYS\tSYS\t X \tPXB\t16-31,48-63\t1\t\tN/A\r\n"
    "GPU3\tSYS\tSYS\tPXB\t X \t16-31,48-63\t1\t\tN/A\r\n"
    + _LEGEND.replace("\n", "\r\n")
    + "\r\n\r\n"
)


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


def test_one_h100_as_driver_580_prints_it() -> None:
    parsed = smi.parse(H100_DRIVER_580, name="h100")
    assert parsed.size == 1
    assert parsed.links == ()
    assert [g.numa_node for g in parsed.gpus] == [0]
    assert smi.parse(smi.render(parsed), name="h100") == parsed


def test_dgx_h100_with_nic_rows_columns_and_legend() -> None:
    parsed = smi.parse(DGX_H100_PASTED, name="dgx-h100", nvlink_gen=4, pcie_gen=5)
    shipped = topologies.load("dgx-h100")
    assert all(link.nvlinks == 18 and link.nvswitch for link in parsed.links)
    assert [g.numa_node for g in parsed.gpus] == [g.numa_node for g in shipped.gpus]
    assert [g.numa_node for g in parsed.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    for link in parsed.links:
        assert parsed.gbps(link.a, link.b) == shipped.gbps(link.a, link.b)


def test_pcie_four_gpus_with_crlf_and_blank_lines() -> None:
    parsed = smi.parse(PCIE_4GPU_CRLF, pcie_gen=4)
    assert parsed.nvlink_gen == 0
    assert {(link.a, link.b): link.pcie for link in parsed.links} == {
        (0, 1): PcieLevel.PIX,
        (0, 2): PcieLevel.SYS,
        (0, 3): PcieLevel.SYS,
        (1, 2): PcieLevel.SYS,
        (1, 3): PcieLevel.SYS,
        (2, 3): PcieLevel.PXB,
    }
    assert [g.numa_node for g in parsed.gpus] == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "dress",
    [
        pytest.param(lambda s: s.replace("GPU", "\x1b[1m\x1b[4mGPU"), id="bold-underline"),
        pytest.param(lambda s: s.replace("\t", "\x1b[m\t"), id="reset-before-tabs"),
        pytest.param(lambda s: s.replace("\x1b[0m", "\x1b(B\x1b[m"), id="tput-sgr0"),
        pytest.param(lambda s: s.replace("\x1b", ""), id="esc-lost-in-paste"),
        pytest.param(lambda s: s.replace("\x1b", "^["), id="cat-v"),
        pytest.param(lambda s: s.replace("\t", "    "), id="spaces"),
        pytest.param(lambda s: s.replace("\t", " \t  "), id="padded-tabs"),
        pytest.param(lambda s: "\n".join("    " + line for line in s.split("\n")), id="indented"),
    ],
)
def test_escape_codes_and_separators_anywhere(dress: Callable[[str], str]) -> None:
    parsed = smi.parse(dress(PCIE_4GPU_CRLF), pcie_gen=4)
    assert parsed == smi.parse(PCIE_4GPU_CRLF, pcie_gen=4)
    assert [g.numa_node for g in parsed.gpus] == [0, 0, 1, 1]


def test_numa_node_only_from_a_single_numa_affinity() -> None:
    text = (
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tSYS\t0-63\t0-1\t\t2\n"
        "GPU1\tSYS\t X \tN/A\tN/A\t\tN/A\n"
    )
    assert [g.numa_node for g in smi.parse(text).gpus] == [None, None]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nothing here\n", "no header line with GPU0"),
        (
            "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tSYS\t X \n",
            "lines 2 and 3: GPU0-GPU1 is NV1 one way and SYS the other",
        ),
        (
            "\tGPU0\tGPU1\nGPU0\t X \tQPI\nGPU1\tQPI\t X \n",
            "line 2, row GPU0, column GPU1: unknown code 'QPI'",
        ),
        (
            "\tGPU0\tGPU1\nGPU0\t X \tSYS\n",
            "line 3: expected row GPU1, found the end of the text",
        ),
        (
            "GPU0 GPU1 CPU Affinity\nGPU0 X SYS 0-7\nGPU1 SYS X 0-7\n",
            "line 1: cannot tell the header's columns apart .*: 'GPU0 GPU1 CPU Affinity'",
        ),
        ("\tGPU0\tGPU2\nGPU0\t X \tSYS\n", r"line 1: .*not GPU0\.\.GPU1 in order: 'GPU0 GPU2'"),
        ("\tGPU0\tGPU1\nGPU0\t X\n", r"line 2: row GPU0 is short: 1 of 2 cells: 'GPU0 X'"),
        (
            "\tGPU0\tGPU1\nGPU0\tSYS\tSYS\nGPU1\tSYS\t X \n",
            "line 2, row GPU0, column GPU0: expected X, found 'SYS'",
        ),
        (
            "\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tSYS\t X \nGPU2\tSYS\tSYS\n",
            r"line 4: row GPU2 has no column in the header \(line 1\)",
        ),
    ],
)
def test_bad_text_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        smi.parse(text)


def test_garbled_cell_names_line_row_and_column() -> None:
    garbled = DGX_H100_PASTED.replace(
        "GPU3\tNV18\tNV18\tNV18\t X \tNV18\tNV18", "GPU3\tNV18\tNV18\tNV18\t X \tNV18\t\x1b[1mN?18"
    )
    with pytest.raises(ValueError, match=r"line 5, row GPU3, column GPU5: unknown code") as error:
        smi.parse(garbled)
    assert "'N?18'" in str(error.value)
    assert "\x1b" not in str(error.value)


def test_missing_row_names_the_line_where_it_was_expected() -> None:
    lines = PCIE_4GPU_CRLF.split("\r\n")
    del lines[4]  # the row of GPU1
    with pytest.raises(ValueError, match=r"line 5: expected row GPU1, found 'GPU2 SYS SYS X") as e:
        smi.parse("\r\n".join(lines))
    assert "\x1b" not in str(e.value)


def test_table_ending_early_names_the_line_that_ended_it() -> None:
    lines = DGX_H100_PASTED.split("\n")
    del lines[8]  # the row of GPU7: the NIC rows follow GPU6
    with pytest.raises(ValueError, match=r"line 9: expected row GPU7, found 'NIC0 PXB PXB"):
        smi.parse("\n".join(lines))

"""The text of ``nvidia-smi topo -m``: parse what users paste, render what we know.

The matrix shows one code per GPU pair: ``NV#`` (a bonded set of # NVLinks) hides the PCIe
level, and nothing tells direct NVLinks from NVSwitch ones or the NVLink generation. So
:func:`parse` takes the generations as arguments and infers NVSwitch when a GPU's NVLinks to
its peers add up to more than any GPU has (NV12 to seven peers is a switch, not 84 cables).
NIC columns and rows, the CPU affinity and the legend are read past. Used by users' tooling and
the tests; :func:`render` of a parsed text gives the same matrix back.
"""

from __future__ import annotations

import itertools
import re
from typing import Final

from mpijob.placement import bandwidth
from mpijob.placement.model import Gpu, Link, PcieLevel, Topology

_GPU_LABEL: Final = re.compile(r"GPU(\d+)")
_NVLINK_CODE: Final = re.compile(r"NV(\d+)")
_COLUMN_SPLIT: Final = re.compile(r"\t+|\s{2,}")
_NUMA_AFFINITY: Final = "NUMA Affinity"
_LEGEND: Final = (
    "Legend:\n"
    "  X    = self\n"
    "  NV#  = # bonded NVLinks\n"
    "  PIX, PXB, PHB, NODE, SYS = PCIe path, nearest to farthest\n"
)


def render(topology: Topology) -> str:
    """The matrix as ``nvidia-smi topo -m`` prints it (CPU affinity unknown: ``N/A``)."""
    labels = [f"GPU{gpu.index}" for gpu in topology.gpus]
    lines = ["\t" + "\t".join([*labels, "CPU Affinity", _NUMA_AFFINITY])]
    for a in range(topology.size):
        codes = [" X " if a == b else _code(topology.link(a, b)) for b in range(topology.size)]
        numa = topology.gpus[a].numa_node
        lines.append("\t".join([labels[a], *codes, "N/A", "N/A" if numa is None else str(numa)]))
    return "\n".join(lines) + "\n\n" + _LEGEND


def parse(
    text: str, *, name: str = "nvidia-smi", nvlink_gen: int = 3, pcie_gen: int = 3
) -> Topology:
    """The topology in a pasted ``nvidia-smi topo -m``; ValueError says what does not parse.

    ``nvlink_gen`` defaults to 3 (25 GB/s per link per direction, as for generations 2 and 4);
    pass 1 for P100 (20 GB/s) or 5 for Blackwell (50 GB/s).
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if "GPU0" in line.split()), None)
    if header_at is None:
        raise ValueError("no header line with GPU0 found")
    labels = [label for label in _COLUMN_SPLIT.split(lines[header_at].strip()) if label]
    gpu_columns = {
        int(match.group(1)): position
        for position, label in enumerate(labels)
        if (match := _GPU_LABEL.fullmatch(label))
    }
    size = len(gpu_columns)
    if sorted(gpu_columns) != list(range(size)):
        raise ValueError(f"GPU columns are not GPU0..GPU{size - 1}")
    numa_column = labels.index(_NUMA_AFFINITY) if _NUMA_AFFINITY in labels else None

    codes: dict[int, list[str]] = {}
    numa: dict[int, int | None] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        match = _GPU_LABEL.fullmatch(tokens[0]) if tokens else None
        if match is None:
            continue
        index = int(match.group(1))
        if index not in gpu_columns:
            raise ValueError(f"row GPU{index} has no column")
        row = tokens[1:]
        if len(row) < len(gpu_columns):
            raise ValueError(f"row GPU{index} is short: {len(row)} values")
        codes[index] = [row[gpu_columns[peer]] for peer in range(size)]
        numa[index] = _numa(row, numa_column)
    if sorted(codes) != list(range(size)):
        raise ValueError(f"expected rows GPU0..GPU{size - 1}, found {sorted(codes)}")

    links = [
        _link(a, b, codes[a][b], codes[b][a]) for a, b in itertools.combinations(range(size), 2)
    ]
    links = _mark_nvswitch(size, links)
    any_nvlink = any(link.nvlinks for link in links)
    return Topology(
        name,
        tuple(Gpu(index, numa_node=numa[index]) for index in range(size)),
        tuple(links),
        nvlink_gen=nvlink_gen if any_nvlink else 0,
        pcie_gen=pcie_gen,
    )


def _code(link: Link) -> str:
    if link.nvlinks:
        return f"NV{link.nvlinks}"
    # A pair without NVLink always has a PCIe level (Topology checks it).
    return PcieLevel.SYS.code if link.pcie is None else link.pcie.code


def _numa(row: list[str], column: int | None) -> int | None:
    if column is None or column >= len(row) or not row[column].isdigit():
        return None
    return int(row[column])


def _link(a: int, b: int, code: str, mirror: str) -> Link:
    if code != mirror:
        raise ValueError(f"GPU{a}-GPU{b} is {code} one way and {mirror} the other")
    nvlink = _NVLINK_CODE.fullmatch(code)
    if nvlink:
        return Link(a, b, nvlinks=int(nvlink.group(1)))
    try:
        return Link(a, b, pcie=PcieLevel.from_code(code))
    except ValueError:
        raise ValueError(f"GPU{a}-GPU{b}: unknown code {code!r}") from None


def _mark_nvswitch(size: int, links: list[Link]) -> list[Link]:
    """Mark every NVLink pair as switched when some GPU has more NVLinks than a GPU can."""
    per_gpu = [0] * size
    for link in links:
        per_gpu[link.a] += link.nvlinks
        per_gpu[link.b] += link.nvlinks
    if max(per_gpu, default=0) <= bandwidth.MAX_NVLINKS_PER_GPU:
        return links
    return [
        Link(link.a, link.b, link.nvlinks, nvswitch=True, pcie=link.pcie) if link.nvlinks else link
        for link in links
    ]

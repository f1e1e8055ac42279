"""The text of ``nvidia-smi topo -m``: parse what users paste, render what we know.

The matrix shows one code per GPU pair: ``NV#`` (a bonded set of # NVLinks) hides the PCIe
level, and nothing tells direct NVLinks from NVSwitch ones or the NVLink generation. So
:func:`parse` takes the generations as arguments and infers NVSwitch when a GPU's NVLinks to
its peers add up to more than any GPU has (NV12 to seven peers is a switch, not 84 cables).
It reads the text as drivers print it and as it survives a paste: escape codes anywhere (recent
drivers underline the header even into a pipe), tabs or runs of spaces between cells, CRLF
endings, blank lines around the table, one GPU or many. NIC columns and rows, the CPU affinity,
the GPU NUMA ID and both legends are read past; a single node under ``NUMA Affinity`` becomes
the GPU's NUMA node. What it cannot read raises ValueError naming the line and the text there.
Used by users' tooling and the tests; :func:`render` of a parsed text gives the same matrix back.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Final

from mpijob.placement import bandwidth
from mpijob.placement.model import Gpu, Link, PcieLevel, Topology

_ESCAPE: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI, SGR among them
    r"|\x1b\][^\x07\x1b\r\n]*(?:\x07|\x1b\\)?"  # OSC; never past the line, to keep numbering
    r"|\x1b[ -/]*[0-~]"  # the rest, e.g. tput sgr0's charset reset ESC ( B
    r"|\x9b[0-?]*[ -/]*[@-~]"  # CSI as one C1 byte
    # SGR whose ESC a paste dropped or `cat -v` spelled ^[; no cell holds a bracket.
    r"|(?:\^\[)?\[[0-9;]*m"
    r"|\x1b"
)
_GPU_LABEL: Final = re.compile(r"GPU(\d+)")
_NVLINK_CODE: Final = re.compile(r"NV([1-9]\d*)")
_NUMA_NODE: Final = re.compile(r"[0-9]+")
# Labels hold single spaces ("CPU Affinity"); cells are apart by tabs or by two spaces or more.
_COLUMN_SPLIT: Final = re.compile(r"\s*\t\s*|\s{2,}")
_NUMA_AFFINITY: Final = "NUMA Affinity"
_SELF: Final = "X"
# Drivers before NODE and SYS existed printed SOC for the path across sockets.
_OLD_CODES: Final = {"SOC": "SYS"}
_SHOWN_CHARS: Final = 60
_LEGEND: Final = (
    "Legend:\n"
    "  X    = self\n"
    "  NV#  = # bonded NVLinks\n"
    "  PIX, PXB, PHB, NODE, SYS = PCIe path, nearest to farthest\n"
)


@dataclass(frozen=True)
class _Header:
    line: int
    """1-based line number in the text."""
    columns: tuple[str, ...]
    """Matrix columns: GPU0..GPUn-1, then NICs."""
    gpus: int
    numa_at: int | None
    """Position of NUMA Affinity among a row's cells (its label not counted)."""


@dataclass(frozen=True)
class _Row:
    line: int
    codes: tuple[str, ...]
    """Code to each GPU, ``X`` to itself, ``SOC`` already read as ``SYS``."""
    numa: int | None


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
    # Escape codes never span a line break, so line numbers still match the pasted text.
    lines = _ESCAPE.sub("", text).splitlines()
    header = _header(lines)
    rows = _rows(lines, header)
    links = [_link(rows, a, b) for a, b in itertools.combinations(range(header.gpus), 2)]
    links = _mark_nvswitch(header.gpus, links)
    any_nvlink = any(link.nvlinks for link in links)
    return Topology(
        name,
        tuple(Gpu(index, numa_node=row.numa) for index, row in enumerate(rows)),
        tuple(links),
        nvlink_gen=nvlink_gen if any_nvlink else 0,
        pcie_gen=pcie_gen,
    )


def _header(lines: list[str]) -> _Header:
    # The header is the first line led by GPU0 that is not GPU0's own row (which has its X).
    at = next(
        (
            at
            for at, line in enumerate(lines)
            if (words := line.split())[:1] == ["GPU0"] and _SELF not in words
        ),
        None,
    )
    if at is None:
        raise ValueError("no header line with GPU0 found (such as '\\tGPU0\\tGPU1\\t...')")
    number, line = at + 1, lines[at]
    labels = [label for label in _COLUMN_SPLIT.split(line.strip()) if label]
    if labels[0] != "GPU0":
        raise ValueError(
            f"line {number}: cannot tell the header's columns apart (they need a tab or two"
            f" spaces between them): {_show(line.split())}"
        )
    # Device names are one word; the columns after the matrix (CPU Affinity...) are not.
    width = next((i for i, label in enumerate(labels) if len(label.split()) > 1), len(labels))
    columns = tuple(labels[:width])
    gpu_labels = [label for label in columns if _GPU_LABEL.fullmatch(label)]
    if list(columns[: len(gpu_labels)]) != [f"GPU{i}" for i in range(len(gpu_labels))]:
        raise ValueError(
            f"line {number}: the header's GPU columns are not GPU0..GPU{len(gpu_labels) - 1}"
            f" in order: {_show(gpu_labels)}"
        )
    numa_at = labels.index(_NUMA_AFFINITY) if _NUMA_AFFINITY in labels[width:] else None
    return _Header(number, columns, len(gpu_labels), numa_at)


def _rows(lines: list[str], header: _Header) -> list[_Row]:
    """The GPU rows, which follow the header in order; NIC rows after them are read past."""
    rows: list[_Row] = []
    for number, line in enumerate(lines[header.line :], header.line + 1):
        words = line.split()
        if not words:
            continue
        label = words[0]
        if len(rows) < header.gpus:
            expected = f"GPU{len(rows)}"
            if label != expected:
                raise ValueError(f"line {number}: expected row {expected}, found {_show(words)}")
            rows.append(_row(number, words, header, len(rows)))
        elif label in header.columns[header.gpus :]:
            continue
        elif (match := _GPU_LABEL.fullmatch(label)) is None:
            break
        elif int(match.group(1)) < header.gpus:
            first = rows[int(match.group(1))].line
            raise ValueError(f"line {number}: a second row {label} (the first is on line {first})")
        else:
            raise ValueError(
                f"line {number}: row {label} has no column in the header (line {header.line})"
            )
    if len(rows) < header.gpus:
        raise ValueError(
            f"line {len(lines) + 1}: expected row GPU{len(rows)}, found the end of the text"
        )
    return rows


def _row(number: int, words: list[str], header: _Header, index: int) -> _Row:
    cells = words[1:]
    if len(cells) < len(header.columns):
        raise ValueError(
            f"line {number}: row GPU{index} is short: {len(cells)} of {len(header.columns)}"
            f" cells: {_show(words)}"
        )
    codes = [_OLD_CODES.get(cell, cell) for cell in cells[: header.gpus]]
    for peer, code in enumerate(codes):
        where = f"line {number}, row GPU{index}, column GPU{peer}"
        if peer == index and code != _SELF:
            raise ValueError(f"{where}: expected X, found {cells[peer]!r}")
        if peer != index and not _NVLINK_CODE.fullmatch(code) and _pcie(code) is None:
            raise ValueError(
                f"{where}: unknown code {cells[peer]!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)"
            )
    numa = None
    if header.numa_at is not None and header.numa_at < len(cells):
        # A range or list ("0-1") is CPUs on several nodes: no one node to record.
        numa = int(cells[header.numa_at]) if _NUMA_NODE.fullmatch(cells[header.numa_at]) else None
    return _Row(number, tuple(codes), numa)


def _pcie(code: str) -> PcieLevel | None:
    try:
        return PcieLevel.from_code(code)
    except ValueError:
        return None


def _show(words: list[str]) -> str:
    """Text for a message: one space between cells, cut short, quoted."""
    shown = " ".join(words)
    if len(shown) > _SHOWN_CHARS:
        shown = shown[: _SHOWN_CHARS - 3] + "..."
    return repr(shown)


def _code(link: Link) -> str:
    if link.nvlinks:
        return f"NV{link.nvlinks}"
    # A pair without NVLink always has a PCIe level (Topology checks it).
    return PcieLevel.SYS.code if link.pcie is None else link.pcie.code


def _link(rows: list[_Row], a: int, b: int) -> Link:
    code, mirror = rows[a].codes[b], rows[b].codes[a]
    if code != mirror:
        raise ValueError(
            f"lines {rows[a].line} and {rows[b].line}: GPU{a}-GPU{b} is {code} one way"
            f" and {mirror} the other"
        )
    nvlink = _NVLINK_CODE.fullmatch(code)
    if nvlink:
        return Link(a, b, nvlinks=int(nvlink.group(1)))
    # Every off-diagonal code was checked when its row was read.
    return Link(a, b, pcie=PcieLevel.from_code(code))


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

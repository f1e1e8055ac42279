"""The GPU topology of one node: its GPUs and the link between every pair of them.

A :class:`Topology` is immutable and validated on construction; its :attr:`Topology.graph` is
the networkx view (GPU indices as nodes, one edge per pair with the link's attributes). Built by
:mod:`~mpijob.placement.topologies` (shipped systems), :mod:`~mpijob.placement.smi` (the text
of ``nvidia-smi topo -m``), :mod:`~mpijob.placement.codec` (the node annotation) and the node
agent (NVML); read by scoring, the allocator and job placement.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Final

from mpijob.placement import bandwidth

if TYPE_CHECKING:
    import networkx as nx

#: Largest node the exact allocator handles (its tables have one entry per subset of GPUs).
MAX_GPUS: Final = 16


class PcieLevel(enum.IntEnum):
    """Closest common PCIe ancestor of two GPUs; values are NVML's topology levels."""

    INTERNAL = 0
    """Same board (dual-GPU cards)."""
    PIX = 10
    """At most one PCIe bridge."""
    PXB = 20
    """Several PCIe bridges, no host bridge."""
    PHB = 30
    """Through a PCIe host bridge (typically the CPU)."""
    NODE = 40
    """Between host bridges inside one NUMA node."""
    SYS = 50
    """Across the SMP interconnect between NUMA nodes (QPI/UPI)."""

    @property
    def code(self) -> str:
        """The code ``nvidia-smi topo -m`` prints; a same-board pair prints as ``PIX``."""
        return "PIX" if self is PcieLevel.INTERNAL else self.name

    @classmethod
    def from_code(cls, code: str) -> PcieLevel:
        """The level of an ``nvidia-smi topo -m`` code; ``CPU`` is the old name of ``NODE``."""
        name = "NODE" if code == "CPU" else code
        if name not in cls.__members__:
            raise ValueError(f"unknown PCIe level {code!r}")
        return cls[name]


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node, as the device layer knows it."""

    index: int
    """NVML index, which is also the CUDA index when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    uuid: str | None = None
    """``GPU-...`` UUID, when the source knows it."""
    pci_bus_id: str | None = None
    """PCI bus id as NVML prints it, e.g. ``00000000:06:00.0``, when known."""
    numa_node: int | None = None
    """NUMA node the GPU is attached to, when known."""


@dataclass(frozen=True)
class Link:
    """How GPUs ``a < b`` reach each other: NVLink (direct or through NVSwitch) and PCIe."""

    a: int
    b: int
    nvlinks: int = 0
    """NVLinks between the pair; through NVSwitch, the fewer of the two GPUs' switch links."""
    nvswitch: bool = False
    """The NVLinks go through NVSwitch rather than GPU to GPU."""
    pcie: PcieLevel | None = None
    """PCIe level; unknown when the source only showed the NVLink (``nvidia-smi topo -m``)."""


@dataclass(frozen=True)
class Topology:
    """The GPUs of a node and the link of every pair; raises ValueError when inconsistent."""

    name: str
    """What the node is, e.g. ``dgx1-v100`` or the GPU product name."""
    gpus: tuple[Gpu, ...]
    """GPUs in index order."""
    links: tuple[Link, ...]
    """Exactly one link per pair ``a < b``, in ``(a, b)`` order."""
    nvlink_gen: int = 0
    """NVLink generation of the GPUs (0 when no pair has NVLink)."""
    pcie_gen: int = 3
    """PCIe generation of the GPUs' x16 links."""

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ValueError(f"topology {self.name!r}: {problem}")

    @property
    def size(self) -> int:
        """Number of GPUs."""
        return len(self.gpus)

    def link(self, a: int, b: int) -> Link:
        """The link between two different GPUs, in either order."""
        return self._matrix[a][b]

    def gbps(self, a: int, b: int) -> float:
        """Per-direction bandwidth between two different GPUs: NVLink if any, else PCIe."""
        return self._gbps[a][b]

    def nvlink_gbps(self, a: int, b: int) -> float:
        """Per-direction NVLink bandwidth between two GPUs (0 without NVLink)."""
        link = self._matrix[a][b]
        return (
            link.nvlinks * bandwidth.NVLINK_GBPS_PER_LINK[self.nvlink_gen] if link.nvlinks else 0.0
        )

    def uuids_of(self, gpus: Iterable[int]) -> tuple[str, ...] | None:
        """The UUIDs of some GPUs, or None when any of them is unknown."""
        uuids = tuple(self.gpus[index].uuid for index in gpus)
        return None if None in uuids else tuple(u for u in uuids if u is not None)

    @cached_property
    def graph(self) -> nx.Graph:  # type: ignore[type-arg]
        """networkx view: nodes are GPU indices with their identity, edges carry the link."""
        import networkx as nx  # on first use: reading a node's topology does not need it

        graph: nx.Graph = nx.Graph(name=self.name)  # type: ignore[type-arg]
        for gpu in self.gpus:
            graph.add_node(
                gpu.index, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id, numa_node=gpu.numa_node
            )
        for link in self.links:
            graph.add_edge(
                link.a,
                link.b,
                nvlinks=link.nvlinks,
                nvlink_gen=self.nvlink_gen if link.nvlinks else 0,
                nvswitch=link.nvswitch,
                pcie=link.pcie,
                gbps=self.gbps(link.a, link.b),
            )
        return graph

    @cached_property
    def fingerprint(self) -> str:
        """Identity of the hardware (links, bandwidths, NUMA), not of the GPUs' names or ids.

        Nodes of one model share it, so per-topology tables are computed once for all of them.
        """
        numa = tuple(gpu.numa_node for gpu in self.gpus)
        pairs = tuple((link.nvlinks, link.nvswitch, link.pcie) for link in self.links)
        text = repr((self.size, self.nvlink_gen, self.pcie_gen, numa, pairs))
        return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()

    @cached_property
    def _matrix(self) -> list[list[Link]]:
        matrix: list[list[Link]] = [[] for _ in self.gpus]
        by_pair = {(link.a, link.b): link for link in self.links}
        for a in range(self.size):
            matrix[a] = [
                by_pair[(min(a, b), max(a, b))] if a != b else _SELF for b in range(self.size)
            ]
        return matrix

    @cached_property
    def _gbps(self) -> list[list[float]]:
        return [[_link_gbps(self, link) for link in row] for row in self._matrix]


_SELF: Final = Link(-1, -1)


def _link_gbps(topology: Topology, link: Link) -> float:
    if link is _SELF:
        return 0.0
    if link.nvlinks:
        return link.nvlinks * bandwidth.NVLINK_GBPS_PER_LINK[topology.nvlink_gen]
    # _problem rejects a pair with neither NVLink nor a PCIe level; SYS only satisfies the type.
    level = PcieLevel.SYS if link.pcie is None else link.pcie
    return bandwidth.PCIE_X16_GBPS[topology.pcie_gen] * bandwidth.PCIE_LEVEL_FACTOR[level]


def _problem(topology: Topology) -> str | None:
    """What is wrong with a topology, or None."""
    size = len(topology.gpus)
    if not 1 <= size <= MAX_GPUS:
        return f"has {size} GPUs; between 1 and {MAX_GPUS} are supported"
    for position, gpu in enumerate(topology.gpus):
        if gpu.index != position:
            return f"GPU at position {position} has index {gpu.index}"
    uuids = [gpu.uuid for gpu in topology.gpus if gpu.uuid is not None]
    if len(set(uuids)) != len(uuids):
        return "GPU UUIDs are not unique"
    if topology.pcie_gen not in bandwidth.PCIE_X16_GBPS:
        return f"unknown PCIe generation {topology.pcie_gen}"
    expected = list(itertools.combinations(range(size), 2))
    found = [(link.a, link.b) for link in topology.links]
    if found != expected:
        missing = sorted(set(expected) - set(found))
        if missing:
            return f"no link for GPU pair {missing[0]}"
        return "links must be one per GPU pair a < b, in (a, b) order"
    for link in topology.links:
        if link.nvlinks < 0:
            return f"pair ({link.a}, {link.b}) has a negative NVLink count"
        if link.nvswitch and not link.nvlinks:
            return f"pair ({link.a}, {link.b}) is NVSwitch-attached without NVLinks"
        if not link.nvlinks and link.pcie is None:
            return f"pair ({link.a}, {link.b}) has neither NVLink nor a PCIe level"
        if link.nvlinks and topology.nvlink_gen not in bandwidth.NVLINK_GBPS_PER_LINK:
            return f"pair ({link.a}, {link.b}) has NVLink but the NVLink generation is unknown"
    return None


def links_from(
    size: int,
    *,
    nvlinks: Mapping[tuple[int, int], int] | None = None,
    nvswitch_links: int = 0,
    pcie: Mapping[tuple[int, int], PcieLevel] | None = None,
) -> tuple[Link, ...]:
    """Links for every pair from per-pair tables (keys in either order); a helper for builders.

    ``nvswitch_links`` gives every pair that many NVLinks through NVSwitch (all-to-all systems).
    """
    direct = {(min(p), max(p)): count for p, count in (nvlinks or {}).items()}
    levels = {(min(p), max(p)): level for p, level in (pcie or {}).items()}
    links = []
    for a, b in itertools.combinations(range(size), 2):
        count = direct.get((a, b), 0)
        switched = not count and nvswitch_links > 0
        links.append(
            Link(
                a,
                b,
                nvlinks=nvswitch_links if switched else count,
                nvswitch=switched,
                pcie=levels.get((a, b)),
            )
        )
    return tuple(links)

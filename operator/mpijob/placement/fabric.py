"""The fabric between nodes: nested domains, each with the bandwidth of a ring hop inside it.

A node's GPUs and their links are a :class:`~mpijob.placement.model.Topology`. Between nodes,
a :class:`Fabric` lists levels from the outermost in (as Kueue's Topology objects order them),
for example a spine block, a leaf or rail group, and a multi-node NVLink domain (an NVLink
clique). Each :class:`Level` names the node label whose value is the node's domain at that
level and the bandwidth, GB/s per direction per GPU, of a hop between two nodes whose innermost
shared domain is that level; :attr:`Fabric.outside_gbps` is the hop between nodes that share
no domain. Levels nest: a node's :data:`Location` is its domain values outermost first, and a
domain is the whole path down to it, so two leaves called ``a`` under two blocks are two
domains. A node without a level's label is alone from that level in.

Inner levels are never slower than outer ones (checked): leaving a domain never speeds a hop.

Shipped fabrics (:func:`load`): ``nvl72`` (GB200 NVL72 racks of 18 nodes x 4 GPUs, one NVLink
domain per rack, racks on a leaf/spine network), ``hgx-h100-rail`` (8-GPU HGX H100 nodes on a
rail-optimised leaf/spine network) and ``dgx1-v100`` (the flat network of today's seeds: one
100 Gb/s NIC per node, no labelled domains). Their numbers are nominal line rates where a
public figure exists and stated assumptions where none does (see :data:`SPINE_OVERSUBSCRIPTION`);
every level is configurable. Read by :mod:`~mpijob.placement.span`, the labels in
:mod:`~mpijob.placement.fabric_labels` and the benchmark.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Final

from mpijob.placement.bandwidth import DEFAULT_INTER_NODE_GBPS, NVLINK_GBPS_PER_LINK

#: A node's domains, one value per level, outermost first; shorter when a label is missing.
Location = tuple[str, ...]

#: The level name that means "one node" (the GPU topology inside it), innermost of all.
NODE: Final = "node"

#: GFD's node label naming the node's NVLink clique (``<cluster uuid>.<clique id>``).
CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"
#: GKE's topology labels, as Kueue's Topology examples use them.
BLOCK_LABEL: Final = "cloud.google.com/gce-topology-block"
SUBBLOCK_LABEL: Final = "cloud.google.com/gce-topology-subblock"

#: One 400 Gb/s NIC per GPU (ConnectX-7 class, as on HGX H100 and GB200 compute trays), GB/s
#: per direction.
NIC_400G_GBPS: Final = 50.0
#: Assumed oversubscription of leaf uplinks to the spine: a hop that crosses the spine gets
#: this share less. Not a measurement; set the level's bandwidth to the cluster's own figure
#: (equal to the leaf's on a non-blocking spine).
SPINE_OVERSUBSCRIPTION: Final = 2.0
#: A GB200 NVL72 GPU's NVLink 5 bandwidth through the rack's NVLink switches (18 links).
NVL72_GBPS: Final = 18 * NVLINK_GBPS_PER_LINK[5]


@dataclass(frozen=True)
class Level:
    """One level of domains between nodes."""

    name: str
    """What users write in ``mpijob.io/fabric-required-level`` (e.g. ``clique``)."""
    label: str
    """Node label whose value names the node's domain at this level."""
    gbps: float
    """GB/s per direction of a ring hop between two nodes whose innermost shared domain this is."""


@dataclass(frozen=True)
class Fabric:
    """Levels of domains between nodes, outermost first; raises ValueError when inconsistent."""

    name: str
    levels: tuple[Level, ...]
    outside_gbps: float = DEFAULT_INTER_NODE_GBPS
    """GB/s per direction of a hop between nodes that share no domain."""

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ValueError(f"fabric {self.name!r}: {problem}")

    @property
    def level_names(self) -> tuple[str, ...]:
        """Names a job may ask for, outermost first, ending with ``node``."""
        return (*(level.name for level in self.levels), NODE)

    def depth_of(self, level: str) -> int:
        """How many domains deep a level is: 1 for the outermost, ``len(levels) + 1`` for node."""
        names = self.level_names
        if level not in names:
            raise ValueError(f"unknown fabric level {level!r}; known: {', '.join(names)}")
        return names.index(level) + 1

    def gbps_at(self, depth: int) -> float:
        """Bandwidth of a hop between nodes sharing ``depth`` domains (0: none)."""
        return self.outside_gbps if depth == 0 else self.levels[depth - 1].gbps

    def level_at(self, depth: int) -> str:
        """Name of the level ``depth`` domains deep (``cluster`` at 0)."""
        return "cluster" if depth == 0 else self.level_names[depth - 1]

    def location(self, labels: Mapping[str, str]) -> Location:
        """A node's domains from its labels, stopping at the first level it has no label for."""
        values: list[str] = []
        for level in self.levels:
            value = labels.get(level.label)
            if not value:
                break
            values.append(value)
        return tuple(values)


def shared_depth(locations: Sequence[Location]) -> int:
    """How many domains all the locations share (their common prefix)."""
    if not locations:
        return 0
    first = locations[0]
    depth = min(len(location) for location in locations)
    for other in locations[1:]:
        for index in range(depth):
            if other[index] != first[index]:
                depth = index
                break
    return depth


def hop_gbps(fabric: Fabric, locations: Sequence[Location]) -> float:
    """The slowest inter-node hop of a ring through nodes at these locations, laid out with
    every domain contiguous: the bandwidth of the innermost domain holding them all."""
    return fabric.gbps_at(shared_depth(locations))


def _problem(fabric: Fabric) -> str | None:
    names = [level.name for level in fabric.levels]
    if len(set(names)) != len(names):
        return "level names must be unique"
    if NODE in names or "cluster" in names:
        return f"{NODE!r} and 'cluster' are reserved level names"
    labels = [level.label for level in fabric.levels]
    if len(set(labels)) != len(labels):
        return "each level needs its own node label"
    if not fabric.outside_gbps > 0 or any(not level.gbps > 0 for level in fabric.levels):
        return "every bandwidth must be positive"
    outer = fabric.outside_gbps
    for level in fabric.levels:
        if level.gbps < outer:
            return f"level {level.name!r} ({level.gbps:g} GB/s) is slower than the level around it"
        outer = level.gbps
    return None


def _network(inner: tuple[Level, ...] = ()) -> tuple[Level, ...]:
    """Leaf/spine levels: same leaf at one NIC's rate, same block through the spine."""
    return (
        Level("block", BLOCK_LABEL, NIC_400G_GBPS / SPINE_OVERSUBSCRIPTION),
        Level("leaf", SUBBLOCK_LABEL, NIC_400G_GBPS),
        *inner,
    )


def nvl72() -> Fabric:
    """GB200 NVL72: 18 nodes of 4 GPUs per NVLink clique (one rack), racks on leaf/spine."""
    return Fabric(
        "nvl72",
        _network((Level("clique", CLIQUE_LABEL, NVL72_GBPS),)),
        outside_gbps=NIC_400G_GBPS / SPINE_OVERSUBSCRIPTION**2,
    )


def hgx_h100_rail() -> Fabric:
    """8-GPU HGX H100 nodes, one 400 Gb/s NIC per GPU on a rail-optimised leaf/spine network."""
    return Fabric(
        "hgx-h100-rail", _network(), outside_gbps=NIC_400G_GBPS / SPINE_OVERSUBSCRIPTION**2
    )


def dgx1_v100() -> Fabric:
    """The seeds' DGX-1 V100 nodes: no labelled domains, one 100 Gb/s NIC per node."""
    return Fabric("dgx1-v100", (), outside_gbps=DEFAULT_INTER_NODE_GBPS)


def flat(gbps: float = DEFAULT_INTER_NODE_GBPS) -> Fabric:
    """No domains: every inter-node hop runs at ``gbps`` (the ``--inter-node-bandwidth`` model)."""
    return Fabric("flat", (), outside_gbps=gbps)


_BUILDERS: Final[dict[str, Callable[[], Fabric]]] = {
    "nvl72": nvl72,
    "hgx-h100-rail": hgx_h100_rail,
    "dgx1-v100": dgx1_v100,
}

#: Names :func:`load` accepts.
NAMES: Final[tuple[str, ...]] = tuple(_BUILDERS)


@cache
def load(name: str) -> Fabric:
    """The shipped fabric called ``name``."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ValueError(f"unknown fabric {name!r}; known: {', '.join(NAMES)}")
    return builder()

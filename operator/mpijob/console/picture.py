"""Where ``mpijob topology NODE --png`` draws each GPU and link: laid out by what structures the
node, not by a spring layout.

- GPUs are grouped by NUMA node (the CPU socket, or the Grace CPU of a tray), each group a box;
  inside a box they sit on a grid two wide, so an NVLink quad is a square; boxes go left to
  right, each as read or mirrored, whichever lets more of its NVLinks to the boxes before it
  run straight (GPU i and GPU i+4 of a DGX-1 face each other).
- On an NVSwitch system (every pair switched) the GPUs of each NUMA node form a row, one row
  above and one below a bar standing for the switches, and each GPU has one link to the bar:
  all-to-all reads as all-to-all, without its N^2 lines.
- Otherwise each NVLink is drawn (on a node without NVLink, the PCIe paths inside a NUMA node),
  straight where the line is clear; where a straight line would cross a link of its own group
  or pass over another GPU, it bows out as a curve (the second diagonal of a quad goes round
  the outside of its square).
- Every link's width follows its bandwidth per direction.

Pure geometry (no drawing library): :mod:`mpijob.console.plot` draws what this returns, and the
tests check it (every GPU once, no crossing inside a group).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from mpijob.placement.model import Topology

Point = tuple[float, float]
#: How far apart two GPUs of a grid are, and the gap between two groups' boxes.
STEP = 1.0
GAP = 0.9
#: A GPU's disc radius: a line closer than this to another GPU's centre passes over it.
RADIUS = 0.2
#: Line widths (points) of the slowest and the fastest link drawn.
WIDTH_MIN, WIDTH_MAX = 1.0, 7.0
#: Points of a curve's polyline.
SAMPLES = 32


@dataclass(frozen=True)
class Group:
    """One NUMA node's GPUs and the box drawn round them."""

    label: str
    gpus: tuple[int, ...]
    box: tuple[float, float, float, float]
    """x, y of the lower left corner, width, height."""


@dataclass(frozen=True)
class Edge:
    """One link as drawn: GPU to GPU, or GPU to the switch bar (``b`` is None)."""

    a: int
    b: int | None
    points: tuple[Point, ...]
    """The polyline drawn, from ``a`` to ``b`` (two points when straight)."""
    gbps: float
    width: float
    label: str
    pcie: bool = False
    """A PCIe path, drawn dashed (a node without NVLink)."""


@dataclass(frozen=True)
class Picture:
    positions: dict[int, Point]
    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]
    switch: tuple[float, float, float, float] | None = None
    """The NVSwitch bar (x, y, width, height) on a switched system."""
    switch_label: str = ""


def switched(topology: Topology) -> bool:
    """Every pair of GPUs joined through NVSwitch."""
    return topology.size > 1 and all(link.nvswitch for link in topology.links)


def numa_groups(topology: Topology) -> list[tuple[int | None, tuple[int, ...]]]:
    """GPUs by NUMA node, in the order of their lowest index."""
    found: dict[int | None, list[int]] = {}
    for gpu in topology.gpus:
        found.setdefault(gpu.numa_node, []).append(gpu.index)
    return [(node, tuple(members)) for node, members in found.items()]


def _label(node: int | None) -> str:
    return f"NUMA {node}" if node is not None else "GPUs"


def _widths(gbps: Sequence[float]) -> list[float]:
    top = max(gbps, default=0.0) or 1.0
    return [WIDTH_MIN + (WIDTH_MAX - WIDTH_MIN) * g / top for g in gbps]


def layout(topology: Topology, code: dict[tuple[int, int], str] | None = None) -> Picture:
    """The picture's geometry; ``code`` labels a pair's link (``nvidia-smi topo -m``'s code)."""
    code = code or {}
    if switched(topology):
        return _switched(topology)
    positions: dict[int, Point] = {}
    groups = []
    x0 = 0.0
    for node, members in numa_groups(topology):
        rows = math.ceil(len(members) / 2)
        cols = 2 if len(members) > 1 else 1
        # The group as read, or mirrored, whichever lets more of its NVLinks to the groups on
        # its left run straight: a DGX-1's GPU i and GPU i+4 then face each other.
        ways: list[dict[int, Point]] = [
            {
                gpu: (x0 + (1 - i % 2 if mirror else i % 2) * STEP, (rows - 1 - i // 2) * STEP)
                for i, gpu in enumerate(members)
            }
            for mirror in ((False, True) if cols == 2 else (False,))
        ]
        placed = dict(positions)
        best: dict[int, Point] = min(ways, key=lambda way: _reach(topology, way, placed))
        positions.update(best)
        pad = 0.45
        box = (x0 - pad, -pad, (cols - 1) * STEP + 2 * pad, (rows - 1) * STEP + 2 * pad)
        groups.append(Group(_label(node), members, box))
        x0 += (cols - 1) * STEP + GAP + 2 * pad
    nvlinked = [link for link in topology.links if link.nvlinks]
    group_of = {gpu: i for i, g in enumerate(groups) for gpu in g.gpus}
    if nvlinked:
        pairs = [(link.a, link.b, False) for link in nvlinked]
    else:  # no NVLink: the PCIe paths inside each NUMA node
        pairs = [
            (link.a, link.b, True)
            for link in topology.links
            if group_of[link.a] == group_of[link.b]
        ]
    # Links inside a group first, the shortest first: they are the square's sides and its
    # straight diagonal; what would cross them curves.
    pairs.sort(
        key=lambda p: (
            group_of[p[0]] != group_of[p[1]],
            math.dist(positions[p[0]], positions[p[1]]),
        )
    )
    widths = _widths([topology.gbps(a, b) for a, b, _ in pairs])
    centre = (sum(x for x, _ in positions.values()) / len(positions), 0.5 * STEP)
    edges: list[Edge] = []
    for (a, b, pcie), width in zip(pairs, widths, strict=True):
        same = group_of[a] == group_of[b]
        rivals = [
            e.points
            for e in edges
            if same and e.b is not None and group_of[e.a] == group_of[a] == group_of[e.b]
        ]
        points = _route(positions, a, b, rivals, centre)
        edges.append(
            Edge(a, b, points, topology.gbps(a, b), width, code.get((a, b), ""), pcie=pcie)
        )
    return Picture(positions, tuple(groups), tuple(sorted(edges, key=lambda e: (e.a, e.b or 0))))


def _reach(
    topology: Topology, way: dict[int, Point], placed: dict[int, Point]
) -> tuple[int, float]:
    """The NVLinks from ``way``'s GPUs to those ``placed``: how many would pass over another
    GPU if drawn straight, and how long they are in all."""
    every = placed | way
    blocked, length = 0, 0.0
    for gpu, p in way.items():
        for other, q in placed.items():
            if topology.link(gpu, other).nvlinks:
                between = [r for g, r in every.items() if g not in (gpu, other)]
                blocked += any(_near((p, q), r) for r in between)
                length += math.dist(p, q)
    return blocked, length


def _switched(topology: Topology) -> Picture:
    """GPU rows above and below the switch bar, one link each."""
    groups_found = numa_groups(topology)
    if len(groups_found) == 1:  # one NUMA node: two rows all the same
        members = groups_found[0][1]
        half = (len(members) + 1) // 2
        groups_found = [(groups_found[0][0], members[:half]), (groups_found[0][0], members[half:])]
    width = max(len(m) for _, m in groups_found)
    positions: dict[int, Point] = {}
    groups = []
    rows = len(groups_found)
    for r, (node, members) in enumerate(groups_found):
        y = (rows - 1 - r) * 2.0 * STEP - (1.0 if rows > 1 else 0.0) * STEP
        offset = (width - len(members)) / 2 * STEP
        for i, gpu in enumerate(members):
            positions[gpu] = (offset + i * STEP, y)
        pad = 0.45
        box = (offset - pad, y - pad, (len(members) - 1) * STEP + 2 * pad, 2 * pad)
        groups.append(Group(_label(node), members, box))
    bar = (-0.45, -0.15, (width - 1) * STEP + 0.9, 0.3)
    per_gpu = [topology.nvlink_gbps(0, 1) or topology.gbps(0, 1)] * topology.size
    widths = _widths(per_gpu)
    edges = []
    for gpu, (x, y) in sorted(positions.items()):
        edge_y = bar[1] + bar[3] if y > 0 else bar[1]
        start = (x, y - RADIUS if y > 0 else y + RADIUS)
        edges.append(Edge(gpu, None, (start, (x, edge_y)), per_gpu[gpu], widths[gpu], ""))
    link = topology.link(0, 1)
    label = f"NVSwitch: NV{link.nvlinks} per GPU, {per_gpu[0]:g} GB/s to any other GPU"
    return Picture(positions, tuple(groups), tuple(edges), bar, label)


def _route(
    positions: dict[int, Point],
    a: int,
    b: int,
    rivals: Sequence[tuple[Point, ...]],
    centre: Point,
) -> tuple[Point, ...]:
    """Straight if clear; else the least bowed curve that is (bowing away from the centre
    first)."""
    pa, pb = positions[a], positions[b]
    others = [p for g, p in positions.items() if g not in (a, b)]
    straight = (pa, pb)
    if _clear(straight, others, rivals):
        return straight
    mid = ((pa[0] + pb[0]) / 2, (pa[1] + pb[1]) / 2)
    length = math.dist(pa, pb)
    nx_, ny_ = -(pb[1] - pa[1]) / length, (pb[0] - pa[0]) / length
    outward = (mid[0] - centre[0]) * nx_ + (mid[1] - centre[1]) * ny_
    sides = (1, -1) if outward >= 0 else (-1, 1)
    best: tuple[Point, ...] = straight
    for bow in (0.25, 0.4, 0.6, 0.8, 1.1, 1.5):
        for side in sides:
            ctrl = (mid[0] + side * bow * length * nx_, mid[1] + side * bow * length * ny_)
            curve = _bezier(pa, ctrl, pb)
            if _clear(curve, others, rivals):
                return curve
            if best is straight:
                best = curve
    return best


def middle(points: Sequence[Point]) -> Point:
    """Where a link's label goes: the middle of its line or curve."""
    if len(points) == 2:
        return ((points[0][0] + points[1][0]) / 2, (points[0][1] + points[1][1]) / 2)
    return points[len(points) // 2]


def _bezier(p0: Point, p1: Point, p2: Point) -> tuple[Point, ...]:
    out = []
    for i in range(SAMPLES + 1):
        t = i / SAMPLES
        u = 1 - t
        out.append((u * u * p0[0] + 2 * u * t * p1[0] + t * t * p2[0],
                    u * u * p0[1] + 2 * u * t * p1[1] + t * t * p2[1]))  # fmt: skip
    return tuple(out)


def _clear(
    line: tuple[Point, ...],
    others: Sequence[Point],
    rivals: Sequence[tuple[Point, ...]],
) -> bool:
    if any(_near(line, p) for p in others):
        return False
    return not any(crosses(line, r) for r in rivals)


def _near(line: tuple[Point, ...], p: Point) -> bool:
    return any(_segment_distance(p, s, e) < RADIUS * 1.2 for s, e in itertools.pairwise(line))


def _segment_distance(p: Point, s: Point, e: Point) -> float:
    dx, dy = e[0] - s[0], e[1] - s[1]
    if dx == dy == 0:
        return math.dist(p, s)
    t = max(0.0, min(1.0, ((p[0] - s[0]) * dx + (p[1] - s[1]) * dy) / (dx * dx + dy * dy)))
    return math.dist(p, (s[0] + t * dx, s[1] + t * dy))


def crosses(one: Sequence[Point], other: Sequence[Point]) -> bool:
    """Two polylines cross somewhere other than at an end they share (the same GPU)."""
    shared = {p for p in (one[0], one[-1]) if p in (other[0], other[-1])}
    for s1, e1 in itertools.pairwise(one):
        for s2, e2 in itertools.pairwise(other):
            hit = _intersection(s1, e1, s2, e2)
            if hit is not None and not any(math.dist(hit, p) < 1e-6 for p in shared):
                return True
    return False


def _intersection(p1: Point, p2: Point, p3: Point, p4: Point) -> Point | None:
    d = (p2[0] - p1[0]) * (p4[1] - p3[1]) - (p2[1] - p1[1]) * (p4[0] - p3[0])
    if abs(d) < 1e-12:
        return None  # parallel: the layouts never overlap two links along a line
    t = ((p3[0] - p1[0]) * (p4[1] - p3[1]) - (p3[1] - p1[1]) * (p4[0] - p3[0])) / d
    u = ((p3[0] - p1[0]) * (p2[1] - p1[1]) - (p3[1] - p1[1]) * (p2[0] - p1[0])) / d
    if -1e-9 <= t <= 1 + 1e-9 and -1e-9 <= u <= 1 + 1e-9:
        return (p1[0] + t * (p2[0] - p1[0]), p1[1] + t * (p2[1] - p1[1]))
    return None

"""``mpijob topology NODE --png FILE``: the node's GPUs and links, each job's GPUs coloured.

Draws :func:`mpijob.console.picture.layout`'s geometry (GPUs by NUMA node, NVSwitch as a bar,
link widths by bandwidth) on a matplotlib ``Figure`` (no pyplot, so no global state and no
display needed) and writes one PNG. A link between two GPUs of one job takes the job's colour,
so the ring a job got stands out; free GPUs are grey; the legend names the jobs. NVLinks are
labelled ``NV<k>``; on a node without NVLink the PCIe paths inside each NUMA node are drawn
dashed with their ``nvidia-smi topo -m`` code. Called by :mod:`mpijob.console.main`; needs the
package's ``plot`` extra (matplotlib).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyBboxPatch, Patch

from mpijob.console import picture
from mpijob.console.terminal import escape
from mpijob.console.topology import GpuUse, jobs_of, link_code
from mpijob.placement.model import Topology

#: Job colours (matplotlib's tab10 without its grey), in the order of ``jobs_of``.
JOB_COLOURS: Final = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
FREE_COLOUR: Final = "#d9d9d9"
EDGE_COLOUR: Final = "#555555"
BOX_COLOUR: Final = "#f3f3f3"
SWITCH_COLOUR: Final = "#b0b0b0"


def job_colour(job: str, usage: Mapping[int, GpuUse]) -> str:
    return JOB_COLOURS[jobs_of(usage).index(job) % len(JOB_COLOURS)]


def _edge_colour(edge: picture.Edge, usage: Mapping[int, GpuUse]) -> str:
    """A link inside one job's GPUs (on a switched system, a job's GPU's link to the switch) in
    that job's colour."""
    a = usage.get(edge.a)
    if a is None:
        return EDGE_COLOUR
    if edge.b is None:  # the GPU's link to the switch
        return job_colour(a.job, usage)
    b = usage.get(edge.b)
    return job_colour(a.job, usage) if b is not None and a.job == b.job else EDGE_COLOUR


def draw(topology: Topology, usage: Mapping[int, GpuUse], title: str) -> Figure:
    """The picture as a matplotlib Figure."""
    codes = {(link.a, link.b): link_code(topology, link.a, link.b) for link in topology.links}
    geometry = picture.layout(topology, codes)
    xs = [x for x, _ in geometry.positions.values()]
    ys = [y for _, y in geometry.positions.values()]
    span_x, span_y = max(xs) - min(xs) + 2.5, max(ys) - min(ys) + 2.5
    fig = Figure(figsize=(min(14.0, 2.0 + 1.3 * span_x), min(10.0, 2.5 + 1.3 * span_y)), dpi=100)
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_aspect("equal")
    # Names from the API, escaped as on the terminal: a line break would forge a line here too.
    ax.set_title(escape(title))
    for group in geometry.groups:
        x, y, w, h = group.box
        ax.add_patch(
            FancyBboxPatch(
                (x, y), w, h, boxstyle="round,pad=0.05", facecolor=BOX_COLOUR,
                edgecolor="#999999", linewidth=1, zorder=0,
            )
        )  # fmt: skip
        below = geometry.switch is not None and y + h < geometry.switch[1]
        ax.text(x + 0.05, y - 0.3 if below else y + h + 0.12, group.label, fontsize=9,
                color="#555555", zorder=1)  # fmt: skip
    if geometry.switch is not None:
        x, y, w, h = geometry.switch
        ax.add_patch(
            FancyBboxPatch(
                (x, y), w, h, boxstyle="round,pad=0.02", facecolor=SWITCH_COLOUR,
                edgecolor="black", linewidth=1, zorder=1,
            )
        )  # fmt: skip
        ax.text(x + w / 2, y + h / 2, geometry.switch_label, ha="center", va="center",
                fontsize=8, zorder=2)  # fmt: skip
    for edge in geometry.edges:
        ax.add_line(
            Line2D(
                [p[0] for p in edge.points], [p[1] for p in edge.points],
                linewidth=edge.width, color=_edge_colour(edge, usage),
                linestyle="--" if edge.pcie else "-", solid_capstyle="round", zorder=2,
            )
        )  # fmt: skip
        if edge.label:
            mx, my = picture.middle(edge.points)
            ax.text(mx, my, edge.label, fontsize=7, ha="center", va="center", zorder=3,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                          "edgecolor": "none", "alpha": 0.85})  # fmt: skip
    for gpu, (x, y) in geometry.positions.items():
        colour = job_colour(usage[gpu].job, usage) if gpu in usage else FREE_COLOUR
        ax.add_patch(Circle((x, y), picture.RADIUS, facecolor=colour, edgecolor="black", zorder=4))
        ax.text(x, y, f"GPU{gpu}", ha="center", va="center", fontsize=8, zorder=5)
    ax.set_xlim(min(xs) - 1.2, max(xs) + 1.2)
    ax.set_ylim(min(ys) - 1.2, max(ys) + 1.2)
    handles = [Patch(facecolor=job_colour(job, usage), label=escape(job)) for job in jobs_of(usage)]
    handles.append(Patch(facecolor=FREE_COLOUR, edgecolor="black", label="free"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3)
    fig.text(0.99, 0.01, "line width: GB/s per direction", ha="right", fontsize=7, color="#777777")
    fig.tight_layout()
    return fig


def write_png(path: Path, topology: Topology, usage: Mapping[int, GpuUse], *, node: str) -> None:
    """Draw and save the picture of ``node`` to ``path``."""
    fig = draw(topology, usage, f"{node}: {topology.name} GPU links")
    fig.savefig(path, format="png")

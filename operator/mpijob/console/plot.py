"""``mpijob topology NODE --png FILE``: the node's NVLink graph, with each job's GPUs coloured.

Draws with networkx on a matplotlib ``Figure`` (no pyplot, so no global state and no display
needed) and writes one PNG. Edges are NVLinks, thicker for more links and labelled ``NV<k>``; on a
node without NVLink the PCIe pairs are drawn dashed instead. Free GPUs are grey; the legend names
the jobs. Called by :mod:`mpijob.console.main`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import networkx as nx
from matplotlib.figure import Figure
from matplotlib.patches import Patch

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


def job_colour(job: str, usage: Mapping[int, GpuUse]) -> str:
    return JOB_COLOURS[jobs_of(usage).index(job) % len(JOB_COLOURS)]


def draw(topology: Topology, usage: Mapping[int, GpuUse], title: str) -> Figure:
    """The picture as a matplotlib Figure."""
    graph = topology.graph
    nvlinked = [(link.a, link.b) for link in topology.links if link.nvlinks]
    edges = nvlinked or [(link.a, link.b) for link in topology.links]
    positions: dict[int, Any] = layout(topology)
    fig = Figure(figsize=(8, 7), dpi=100)
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(title)
    widths = [1.5 * max(topology.link(a, b).nvlinks, 1) for a, b in edges]
    nx.draw_networkx_edges(
        graph,
        positions,
        edgelist=edges,
        width=widths,
        edge_color=EDGE_COLOUR,
        style="solid" if nvlinked else "dashed",
        ax=ax,
    )
    nx.draw_networkx_edge_labels(
        graph,
        positions,
        edge_labels={(a, b): link_code(topology, a, b) for a, b in edges},
        font_size=8,
        ax=ax,
    )
    colours = [
        job_colour(usage[n].job, usage) if n in usage else FREE_COLOUR for n in graph.nodes()
    ]
    nx.draw_networkx_nodes(
        graph, positions, node_color=colours, node_size=1400, edgecolors="black", ax=ax
    )
    nx.draw_networkx_labels(graph, positions, labels={n: f"GPU{n}" for n in graph.nodes()}, ax=ax)
    handles = [Patch(facecolor=job_colour(job, usage), label=job) for job in jobs_of(usage)]
    handles.append(Patch(facecolor=FREE_COLOUR, edgecolor="black", label="free"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    fig.tight_layout()
    return fig


def write_png(path: Path, topology: Topology, usage: Mapping[int, GpuUse], *, node: str) -> None:
    """Draw and save the picture of ``node`` to ``path``."""
    fig = draw(topology, usage, f"{node}: {topology.name} NVLink graph")
    fig.savefig(path, format="png")


def layout(topology: Topology) -> dict[int, Any]:
    """Positions of the GPUs: NVLinked GPUs pulled together (deterministic for a topology)."""
    graph: nx.Graph[int] = nx.Graph()
    graph.add_nodes_from(range(topology.size))
    graph.add_weighted_edges_from(
        (link.a, link.b, link.nvlinks) for link in topology.links if link.nvlinks
    )
    if graph.number_of_edges() == 0:
        return dict(nx.circular_layout(graph))
    return dict(nx.spring_layout(graph, seed=7, iterations=200))

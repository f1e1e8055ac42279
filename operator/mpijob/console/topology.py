"""``mpijob topology NODE``: a node's GPU links as a matrix and which job holds which GPU; on a
``core_mem`` node, each GPU's shares too (:func:`shares_table`: memory and compute held, by which
pod, from the pods' ``mpijob.io/gpu-share`` annotations).

Pure: a :class:`~mpijob.placement.model.Topology` (decoded from the node's
``mpijob.io/gpu-topology`` annotation) and the node's pods in, data and rich tables out, the
API's text in them escaped (:mod:`mpijob.console.terminal`). A GPU is in use when a pod on the
node that has not finished carries it in ``mpijob.io/gpu-ids``. Called by
:mod:`mpijob.console.main` and :mod:`mpijob.console.plot`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from rich.text import Text

from mpijob import keys
from mpijob.api import gpu_ids
from mpijob.console.terminal import Table, text
from mpijob.objects import JSON
from mpijob.placement.model import PcieLevel, Topology
from mpijob.pods.predicates import terminal
from mpijob.shares.ledger import read_node
from mpijob.shares.request import PERCENT_MAX, Placed


@dataclass(frozen=True)
class GpuUse:
    """One GPU held by one pod of one job."""

    job: str
    """``namespace/name`` of the MPIJob (the pod's name when it belongs to no job)."""
    pod: str


def gpu_usage(pods: Iterable[JSON]) -> dict[int, GpuUse]:
    """GPU index -> who holds it, from the node's pods that have not finished."""
    usage: dict[int, GpuUse] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if terminal(pod):
            continue
        ids = (meta.get("annotations") or {}).get(keys.GPU_IDS)
        if not ids:
            continue
        job = (meta.get("labels") or {}).get(keys.LABEL_JOB_NAME) or meta.get("name")
        use = GpuUse(job=f"{meta.get('namespace')}/{job}", pod=str(meta.get("name")))
        for index in gpu_ids(str(ids)):
            usage[index] = use
    return usage


def jobs_of(usage: Mapping[int, GpuUse]) -> list[str]:
    """The jobs holding GPUs, sorted, so each gets the same colour in table and picture."""
    return sorted({use.job for use in usage.values()})


def link_code(topology: Topology, a: int, b: int) -> str:
    """``nvidia-smi topo -m``'s code of a pair: X, NV<k> (direct or switched), or the PCIe path."""
    if a == b:
        return "X"
    link = topology.link(a, b)
    if link.nvlinks:
        return f"NV{link.nvlinks}"
    return link.pcie.code if link.pcie is not None else "SYS"


def _link_style(topology: Topology, a: int, b: int) -> str:
    if a == b:
        return "dim"
    link = topology.link(a, b)
    if link.nvlinks:
        return "bold green" if link.nvlinks > 1 else "green"
    if link.pcie is not None and link.pcie <= PcieLevel.PXB:
        return "yellow"
    return "red" if link.pcie is PcieLevel.SYS else "dim"


#: Rich colour names for jobs, in the order of :func:`jobs_of` (cycled when there are more).
JOB_STYLES: Final = ("magenta", "cyan", "blue", "bright_red", "bright_green", "yellow")


def job_style(job: str, jobs: list[str]) -> str:
    return JOB_STYLES[jobs.index(job) % len(JOB_STYLES)]


def matrix_table(topology: Topology, usage: Mapping[int, GpuUse]) -> Table:
    """One row per GPU: its link code to every GPU, its NUMA node and the job holding it."""
    jobs = jobs_of(usage)
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    table.add_column("", style="bold", no_wrap=True)
    for gpu in topology.gpus:
        table.add_column(f"GPU{gpu.index}", justify="center", no_wrap=True)
    table.add_column("NUMA", justify="center", no_wrap=True)
    table.add_column("JOB", no_wrap=True)
    for gpu in topology.gpus:
        a = gpu.index
        cells = [
            Text(link_code(topology, a, b), style=_link_style(topology, a, b))
            for b in range(topology.size)
        ]
        use = usage.get(a)
        job = text(use.job, style=job_style(use.job, jobs)) if use else Text("-", style="dim")
        numa = "N/A" if gpu.numa_node is None else str(gpu.numa_node)
        table.add_row(f"GPU{a}", *cells, numa, job)
    return table


def summary(node: str, topology: Topology, usage: Mapping[int, GpuUse]) -> str:
    """One line: what the node is and how many GPUs are free."""
    free = topology.size - len([i for i in usage if i < topology.size])
    nvlink = f"NVLink gen {topology.nvlink_gen}" if topology.nvlink_gen else "no NVLink"
    return (
        f"Node {node}: {topology.name}, {topology.size} GPUs, {nvlink}, "
        f"PCIe gen {topology.pcie_gen}; {free} free"
    )


LEGEND: Final = (
    "NV<k> = k NVLinks (direct or through NVSwitch); PIX, PXB, PHB, NODE, SYS = PCIe path, "
    "nearest to farthest"
)


# --- GPU shares (core_mem nodes) -----------------------------------------------------------------


@dataclass(frozen=True)
class ShareUse:
    """One pod's share of one GPU, read from its ``mpijob.io/gpu-share`` annotation."""

    pod: str
    """``namespace/name``."""
    memory_gib: int
    percentage: int | None


def share_usage(pods: Iterable[JSON]) -> dict[int, list[ShareUse]]:
    """GPU index -> the shares held on it, from the node's pods that have not finished."""
    usage: dict[int, list[ShareUse]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if terminal(pod):
            continue
        placed = Placed.loads((meta.get("annotations") or {}).get(keys.GPU_SHARE))
        if placed is None:
            continue
        usage.setdefault(placed.gpu, []).append(
            ShareUse(
                f"{meta.get('namespace')}/{meta.get('name')}",
                placed.share.memory_gib,
                placed.share.percentage,
            )
        )
    for shares in usage.values():
        shares.sort(key=lambda s: s.pod)
    return usage


def shares_table(node: JSON, usage: Mapping[int, list[ShareUse]]) -> Table | None:
    """One row per GPU of a ``core_mem`` node: memory and compute held, and by whom; None for a
    node that shares no GPU (not opted in, or nothing advertised yet)."""
    read = read_node(node)
    if read is None:
        return None
    gpus, binpack = read
    table = Table(
        title=f"GPU shares ({'binpack' if binpack else 'spread'})",
        box=None,
        pad_edge=False,
        header_style="bold",
        show_edge=False,
        title_justify="left",
    )
    for column in ("GPU", "MEMORY GiB", "COMPUTE %", "SHARES"):
        table.add_column(column, no_wrap=column != "SHARES")
    for gpu in gpus:
        shares = usage.get(gpu.index, [])
        memory = sum(s.memory_gib for s in shares)
        compute = sum(s.percentage or 0 for s in shares)
        held = ", ".join(
            f"{s.pod} ({s.memory_gib} GiB"
            + (f", {s.percentage}%)" if s.percentage is not None else ", memory only)")
            for s in shares
        )
        table.add_row(
            f"GPU{gpu.index}",
            f"{memory}/{gpu.memory_gib}",
            f"{compute}/{PERCENT_MAX}",
            held or Text("-", style="dim"),
        )
    return table

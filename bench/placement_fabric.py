"""Fabric section of the placement benchmark: whole jobs over simulated GPU fabrics.

Run by ``bench/placement.py`` (``make bench-placement``), or alone as
``.venv/bin/python -m bench.placement_fabric [--quick]`` (writes ``.bench/placement_fabric.json``).

Fabrics (shipped levels and bandwidths of :mod:`mpijob.placement.fabric`):

* ``nvl72``: GB200 NVL72 racks, 18 trays of 4 GPUs per NVLink clique, racks in leaves and blocks;
* ``hgx-h100``: 8-GPU HGX H100 nodes on a rail-optimised leaf/spine network;
* ``mixed``: an NVL72 rack, HGX H100 and DGX-1 V100 nodes under one spine, two V100 nodes
  without any fabric label.

Every case is a fabric, a fragmentation state (all free; each node a uniformly random number of
used GPUs; each GPU used with probability 0.3) and a job; for every case the figure of merit
(the job's ring bottleneck, GB/s per direction, see :mod:`mpijob.placement.span`) of our choice
is compared with:

* up to 64 GPUs, the exhaustive optimum (every split of the workers over the nodes), also for a
  required and a preferred level;
* up to 512 GPUs, a certified upper bound (:func:`mpijob.placement.fabric_baselines.upper_bound`);
* a Kueue-TAS-like "fewest domains" policy and a Volcano-like "lowest tier first" policy on the
  same cases (both given our node allocator, so differences come from the nodes they choose).

Latency: decisions on a 5,000-node mixed cluster (2,502 GB200 trays in 139 NVL72 racks, 1,500
HGX H100 and 998 DGX-1 V100 nodes), GPUs in use drawn anew each round in two fills (per-node
fragmentation, and a saturated cluster: each GPU in use with probability 0.9), decision caches
cleared before every call (what depends on the hardware alone, its tables and the ring order of
a GPU set, is kept, as in the operator; node states are built outside the timing, as the
operator builds them once per pass), the garbage collector's youngest generation at the
operator's own threshold (:data:`mpijob.handlers.startup.GC_YOUNG_THRESHOLD`). Wall and CPU
time of each decision, and the load average. Three runs of each fill, interleaved; the reported
p99 is the median of the runs' p99. ``--latency-only`` skips the quality cases.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mpijob.placement import allocator, fabric, fabric_baselines, topologies
from mpijob.placement.fabric import Fabric, Location
from mpijob.placement.job import JobRequest, NodeState, NoFit
from mpijob.placement.model import Topology
from mpijob.placement.span import FabricPlacement, place_on_fabric
from mpijob.placement.tables import tables_for

OUT = Path(__file__).resolve().parent.parent / ".bench" / "placement_fabric.json"
NVL72 = fabric.load("nvl72")

Hardware = list[tuple[str, Topology]]
Where = dict[str, Location]
Policy = Callable[[JobRequest, Sequence[NodeState], Fabric, Where], dict[int, int] | None]


def _racks(hw: Hardware, where: Where, prefix: str, racks: list[Location]) -> None:
    for number, path in enumerate(racks):
        for tray in range(18):
            name = f"{prefix}{number:03d}-{tray:02d}"
            hw.append((name, topologies.for_node("gb200-tray", name)))
            where[name] = path


def _nodes(hw: Hardware, where: Where, kind: str, prefix: str, paths: list[Location]) -> None:
    for number, path in enumerate(paths):
        name = f"{prefix}{number:04d}"
        hw.append((name, topologies.for_node(kind, name)))
        where[name] = path


def nvl72_cluster(racks: int, per_leaf: int, per_block: int) -> tuple[Hardware, Where]:
    """``racks`` NVL72 racks, ``per_leaf`` racks per leaf, ``per_block`` leaves per block."""
    hw: Hardware = []
    where: Where = {}
    paths = [
        (f"b{r // (per_leaf * per_block)}", f"l{r // per_leaf}", f"clique-{r}")
        for r in range(racks)
    ]
    _racks(hw, where, "gb-", paths)
    return hw, where


def hgx_cluster(nodes: int, per_leaf: int, per_block: int) -> tuple[Hardware, Where]:
    hw: Hardware = []
    where: Where = {}
    paths = [(f"b{i // (per_leaf * per_block)}", f"l{i // per_leaf}") for i in range(nodes)]
    _nodes(hw, where, "dgx-h100", "h100-", paths)
    return hw, where


def mixed_cluster(scale: int) -> tuple[Hardware, Where]:
    """``scale`` NVL72 racks in block b0, as many HGX leaves in b1 and V100 leaves in b2 (four
    nodes each), two unlabelled V100 nodes."""
    hw: Hardware = []
    where: Where = {}
    _racks(hw, where, "gb-", [("b0", f"l{r // 2}", f"clique-{r}") for r in range(scale)])
    _nodes(hw, where, "dgx-h100", "h100-", [("b1", f"hl{i // 4}") for i in range(4 * scale)])
    _nodes(hw, where, "dgx1-v100", "v100-", [("b2", f"vl{i // 4}") for i in range(4 * scale)])
    _nodes(hw, where, "dgx1-v100", "loose-", [() for _ in range(2)])
    return hw, where


def fragment(hw: Hardware, kind: str, rnd: random.Random) -> list[NodeState]:
    states = []
    for name, topology in hw:
        size = topology.size
        if kind == "free":
            used: frozenset[int] = frozenset()
        elif kind == "per-node":
            used = frozenset(rnd.sample(range(size), rnd.randint(0, size)))
        elif kind == "busy":
            used = frozenset(gpu for gpu in range(size) if rnd.random() < 0.9)
        else:
            used = frozenset(gpu for gpu in range(size) if rnd.random() < 0.3)
        states.append(NodeState(name, topology, used))
    return states


def shares_of(result: FabricPlacement, nodes: Sequence[NodeState]) -> dict[int, int]:
    position = {node.name: index for index, node in enumerate(nodes)}
    shares: dict[int, int] = {}
    for assignment in result.placement.assignments:
        shares[position[assignment.node]] = shares.get(position[assignment.node], 0) + 1
    return shares


def ratio(ours: float, other: float) -> float:
    if math.isinf(ours) and math.isinf(other):
        return 1.0
    return ours / other


SMALL_JOBS = [(1, 1), (3, 1), (4, 1), (6, 1), (12, 1), (2, 2), (5, 2), (16, 2), (1, 4), (2, 4)]
SMALL_JOBS += [(3, 4), (8, 4), (16, 4), (1, 8), (3, 8), (8, 8), (64, 1), (32, 2)]
LARGE_JOBS = [(16, 4), (20, 4), (48, 4), (96, 4), (128, 4), (24, 8), (40, 8), (64, 8)]
LARGE_JOBS += [(256, 2), (512, 1), (100, 1)]


def quality(
    name: str,
    hw: Hardware,
    where: Where,
    jobs: list[tuple[int, int]],
    states: int,
    rnd: random.Random,
    *,
    exact: bool,
) -> dict[str, Any]:
    """Our figure against the optimum (``exact``) or the upper bound, and the two policies."""
    rows: list[dict[str, Any]] = []
    biggest = max(topology.size for _, topology in hw)
    kinds = ["free"] + [("per-node", "iid")[i % 2] for i in range(states)]
    levels = [level.name for level in NVL72.levels]
    for kind in kinds:
        nodes = fragment(hw, kind, rnd)
        for workers, per_worker in jobs:
            if per_worker > biggest:
                continue
            request = JobRequest(workers, per_worker)
            result = place_on_fabric(request, nodes, NVL72, where)
            reference = (
                fabric_baselines.exhaustive(request, nodes, NVL72, where)
                if exact
                else fabric_baselines.upper_bound(request, nodes, NVL72, where)
            )
            if isinstance(result, NoFit):
                if reference == 0.0:
                    continue  # fits nowhere: every policy agrees
                ours = 0.0  # a miss: shows as ratio 0
            else:
                ours = fabric_baselines.figure(
                    request, nodes, NVL72, where, shares_of(result, nodes)
                )
            row: dict[str, Any] = {
                "kind": kind,
                "job": f"{workers}x{per_worker}",
                "ours": ours,
                "reference": reference,
                "ratio": ratio(ours, reference),
            }
            for label, policy in (
                ("kueue", fabric_baselines.fewest_domains),
                ("volcano", fabric_baselines.lowest_tier_first),
            ):
                shares = policy(request, nodes, NVL72, where)
                theirs = (
                    fabric_baselines.figure(request, nodes, NVL72, where, shares) if shares else 0.0
                )
                row[label] = theirs
            if exact:
                # The required and preferred variants of the innermost level the job can span.
                level = levels[-1] if per_worker <= 4 else levels[-2]
                depth = NVL72.depth_of(level)
                best = fabric_baselines.exhaustive(request, nodes, NVL72, where, min_depth=depth)
                req = place_on_fabric(request, nodes, NVL72, where, required=level)
                pref = place_on_fabric(request, nodes, NVL72, where, preferred=level)
                got_req = (
                    0.0
                    if isinstance(req, NoFit)
                    else fabric_baselines.figure(
                        request, nodes, NVL72, where, shares_of(req, nodes)
                    )
                )
                assert isinstance(pref, FabricPlacement)  # it fits unconstrained
                got_pref = fabric_baselines.figure(
                    request, nodes, NVL72, where, shares_of(pref, nodes)
                )
                row["required_ratio"] = 1.0 if best == got_req == 0.0 else ratio(got_req, best)
                row["preferred_ratio"] = ratio(got_pref, best if best > 0.0 else reference)
            rows.append(row)
    return summarise(name, rows, exact=exact)


def summarise(name: str, rows: list[dict[str, Any]], *, exact: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "fabric": name,
        "cases": len(rows),
        "reference": "exhaustive optimum" if exact else "upper bound",
        "ratio_min": min(row["ratio"] for row in rows),
        "ratio_mean": statistics.fmean(row["ratio"] for row in rows),
    }
    for label in ("kueue", "volcano"):
        out[f"{label}_better"] = sum(row["ours"] > row[label] for row in rows)
        out[f"{label}_worse"] = sum(row["ours"] < row[label] for row in rows)
        gains = [ratio(row["ours"], row[label]) for row in rows if row[label] > 0]
        out[f"{label}_gain_max"] = max(gains, default=1.0)
    if exact:
        out["required_ratio_min"] = min(row["required_ratio"] for row in rows)
        out["preferred_ratio_min"] = min(row["preferred_ratio"] for row in rows)
    return out


LATENCY_JOBS: list[tuple[str, JobRequest, dict[str, str]]] = [
    ("4x1", JobRequest(4, 1), {}),
    ("16x4", JobRequest(16, 4), {}),
    ("16x4 required clique", JobRequest(16, 4), {"required": "clique"}),
    ("20x4 preferred clique", JobRequest(20, 4), {"preferred": "clique"}),
    ("64x4", JobRequest(64, 4), {}),
    ("8x8", JobRequest(8, 8), {}),
    ("64x8", JobRequest(64, 8), {}),
    ("512x1", JobRequest(512, 1), {}),
]


def latency(rounds: int, rnd: random.Random, fill: str) -> dict[str, Any]:
    """One run over the 5,000-node cluster with GPUs in use as ``fill`` says: per-job and
    overall percentiles, in ms."""
    hw: Hardware = []
    where: Where = {}
    _racks(hw, where, "gb-", [(f"b{r // 16}", f"l{r // 4}", f"clique-{r}") for r in range(139)])
    _nodes(hw, where, "dgx-h100", "h100-", [(f"hb{i // 256}", f"hl{i // 32}") for i in range(1500)])
    _nodes(hw, where, "dgx1-v100", "v100-", [(f"vb{i // 256}", f"vl{i // 32}") for i in range(998)])
    for _, topology in hw:
        tables_for(topology)
    from mpijob.handlers.startup import GC_YOUNG_THRESHOLD  # the operator's process runs so

    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *before[1:])
    warm = fragment(hw, fill, rnd)
    for _, request, level in LATENCY_JOBS:  # imports and first-use costs, paid once a process
        place_on_fabric(request, warm, NVL72, where, **level)
    every: list[float] = []
    cpu: list[float] = []
    per_job: dict[str, Any] = {}
    for label, request, level in LATENCY_JOBS:
        samples = []
        for _ in range(rounds):
            nodes = fragment(hw, fill, rnd)
            allocator.clear_cache()
            start, started_cpu = time.perf_counter(), time.process_time()
            place_on_fabric(request, nodes, NVL72, where, **level)
            samples.append((time.perf_counter() - start) * 1e3)
            cpu.append((time.process_time() - started_cpu) * 1e3)
        every += samples
        per_job[label] = percentiles(samples)
    gc.set_threshold(*before)
    # CPU time as well as wall time: on a shared machine the wall time includes waiting for a
    # core, which the load of other work decides.
    return {
        "nodes": len(hw),
        "fill": fill,
        "all": percentiles(every),
        "cpu": percentiles(cpu),
        "load_average": os.getloadavg(),
        "jobs": per_job,
    }


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(quantile: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)]

    return {"n": len(ordered), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0)}


#: GPUs in use in the latency runs: per-node random fragmentation, and a saturated cluster
#: (each GPU in use with probability 0.9: the large jobs wait, the search runs out of places).
FILLS = ("per-node", "busy")


def run(*, quick: bool, seed: int, quality_cases: bool = True) -> dict[str, Any]:
    rnd = random.Random(seed)
    began = time.perf_counter()
    states = 2 if quick else 5
    summary: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    if quality_cases:
        small = [
            quality("nvl72 4 racks", *nvl72_cluster(4, 2, 1), SMALL_JOBS, states, rnd, exact=True),
            quality(
                "hgx-h100 16 nodes", *hgx_cluster(16, 4, 2), SMALL_JOBS, states, rnd, exact=True
            ),
            quality("mixed 1 rack", *mixed_cluster(1), SMALL_JOBS, states, rnd, exact=True),
        ]
        print("fabric quality up to 64 GPUs: done", file=sys.stderr)
        large = [
            quality(
                "nvl72 16 racks", *nvl72_cluster(16, 2, 2), LARGE_JOBS, states, rnd, exact=False
            ),
            quality(
                "hgx-h100 128 nodes", *hgx_cluster(128, 16, 4), LARGE_JOBS, states, rnd, exact=False
            ),
            quality("mixed 4 racks", *mixed_cluster(4), LARGE_JOBS, states, rnd, exact=False),
        ]
        print("fabric quality up to 512 GPUs: done", file=sys.stderr)
        rows = small + large
        summary = {
            "fabric_optimum_ratio_min": min(row["ratio_min"] for row in small),
            "fabric_required_ratio_min": min(row["required_ratio_min"] for row in small),
            "fabric_preferred_ratio_min": min(row["preferred_ratio_min"] for row in small),
            "fabric_bound_ratio_min": min(row["ratio_min"] for row in large),
            "fabric_cases": sum(row["cases"] for row in rows),
            "fabric_kueue_better": sum(row["kueue_better"] for row in rows),
            "fabric_kueue_worse": sum(row["kueue_worse"] for row in rows),
            "fabric_volcano_better": sum(row["volcano_better"] for row in rows),
            "fabric_volcano_worse": sum(row["volcano_worse"] for row in rows),
        }
    # Three runs of each fill, interleaved, so a change in the machine's load hits both.
    runs = [latency(4 if quick else 25, rnd, fill) for _ in range(3) for fill in FILLS]
    print("fabric latency at 5,000 nodes: done", file=sys.stderr)
    for fill in FILLS:
        mine = [r for r in runs if r["fill"] == fill]
        tag = "" if fill == "per-node" else f"_{fill}"
        summary |= {
            f"fabric_p50_ms_5000{tag}": statistics.median(r["all"]["p50_ms"] for r in mine),
            f"fabric_p99_ms_5000{tag}": statistics.median(r["all"]["p99_ms"] for r in mine),
            f"fabric_p99_ms_5000{tag}_runs": [r["all"]["p99_ms"] for r in mine],
            f"fabric_cpu_p50_ms_5000{tag}": statistics.median(r["cpu"]["p50_ms"] for r in mine),
            f"fabric_cpu_p99_ms_5000{tag}": statistics.median(r["cpu"]["p99_ms"] for r in mine),
        }
    summary["fabric_load_average_1m"] = [r["load_average"][0] for r in runs]
    return {
        **summary,
        "quality": rows,
        "latency_runs": runs,
        "runtime_s": time.perf_counter() - began,
    }


def print_report(report: dict[str, Any]) -> None:
    head = f"{'fabric':<22}{'cases':>6}{'vs':>8}{'min':>7}{'mean':>7}"
    head += f"{'>K':>6}{'<K':>4}{'xK':>7}{'>V':>6}{'<V':>4}{'xV':>7}"
    print(head + "   (vs: exhaustive optimum 'opt' or upper bound 'ub'; >/< : cases better/worse")
    print(" " * len(head) + "    than the Kueue-like K and Volcano-like V; x: largest gain)")
    for row in report["quality"]:
        vs = "opt" if row["reference"].startswith("exhaustive") else "ub"
        print(
            f"{row['fabric']:<22}{row['cases']:>6}{vs:>8}{row['ratio_min']:>7.3f}"
            f"{row['ratio_mean']:>7.3f}{row['kueue_better']:>6}{row['kueue_worse']:>4}"
            f"{row['kueue_gain_max']:>7.2f}{row['volcano_better']:>6}{row['volcano_worse']:>4}"
            f"{row['volcano_gain_max']:>7.2f}"
        )
    for fill in FILLS:
        runs = [r for r in report["latency_runs"] if r["fill"] == fill]
        title = f"latency, 5,000 nodes, {fill}"
        print(f"\n{title:<34}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}   (median run)")
        for label in runs[0]["jobs"]:
            p50 = statistics.median(r["jobs"][label]["p50_ms"] for r in runs)
            p99 = statistics.median(r["jobs"][label]["p99_ms"] for r in runs)
            print(f"{label:<34}{runs[0]['jobs'][label]['n']:>6}{p50:>9.1f}{p99:>9.1f}")
    print()
    for key, value in report.items():
        if key.startswith("fabric_"):
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            if isinstance(value, list):
                shown = ", ".join(f"{v:.1f}" for v in value)
            print(f"{key:<30}{shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer states and rounds")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument(
        "--latency-only", action="store_true", help="only the decisions at 5,000 nodes"
    )
    args = parser.parse_args()
    report = run(quick=args.quick, seed=args.seed, quality_cases=not args.latency_only)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    print(f"\nwrote {OUT} in {report['runtime_s']:.0f} s")


if __name__ == "__main__":
    main()

"""Placement benchmark: decision quality against other allocators, and decision latency.

Run as ``.venv/bin/python -m bench.placement`` (``--quick`` for a smaller run). Prints a table and
writes ``.bench/placement.json``.

Quality: for every shipped topology, every request size and a set of fragmentation states (all
free, then seeded random states with 25/50/75% of GPUs used), the figure of merit (best ring
bottleneck, GB/s per direction) of our allocator against the exhaustive optimum, first-fit, and
a re-implementation of go-gpuallocator's BestEffort (skipped where it would score more than
``--besteffort-limit`` partitions). One-GPU requests count as ratio 1 (no ring either way).

Latency, measured uncached (decision caches cleared before every call; per-topology tables
built beforehand and timed separately): one 8-GPU node (every 8-GPU shipped topology), one
16-GPU node (dgx2), and a 1,000-node cluster of 8-GPU nodes (a mix of the 8-GPU topologies)
placing a 64x1 and a 16x8 job. Cluster fragmentation, 50% of GPUs used on average, comes in two
kinds: ``iid`` (each GPU used with probability 0.5) and ``per-node`` (each node has a uniformly
random number 0-8 of used GPUs, at random positions).

Then the fabric section (:mod:`placement_fabric`, beside this file; ``--no-fabric`` skips it):
whole jobs over NVL72, rail-optimised HGX H100 and mixed fabrics against the exhaustive optimum,
an upper bound and Kueue-like and Volcano-like policies, and decisions at 5,000 nodes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench import placement_fabric  # the fabric section
from mpijob.placement import allocator, baselines, topologies
from mpijob.placement.job import JobRequest, NodeState, Placement, place_job
from mpijob.placement.model import Topology
from mpijob.placement.tables import tables_for

OUT = Path(__file__).resolve().parent.parent / ".bench" / "placement.json"
T = TypeVar("T")
EIGHT_GPU = tuple(name for name in topologies.NAMES if topologies.load(name).size == 8)


def ratio(ours: float, other: float) -> float:
    """ours / other for ring figures, where two infinities (one GPU) compare as equal."""
    if math.isinf(ours) and math.isinf(other):
        return 1.0
    return ours / other


def states(size: int, rnd: random.Random, count: int) -> list[frozenset[int]]:
    found = [frozenset(range(size))]
    for index in range(count):
        used = round(size * (0.25, 0.5, 0.75)[index % 3])
        found.append(frozenset(range(size)) - frozenset(rnd.sample(range(size), used)))
    return found


def quality(name: str, rnd: random.Random, count: int, be_limit: int) -> dict[str, Any]:
    topology = topologies.load(name)
    per_size: dict[int, dict[str, list[float]]] = {}
    skipped = 0
    for free in states(topology.size, rnd, count):
        for size in range(1, len(free) + 1):
            ours = allocator.best_set(topology, free, size)
            best = baselines.brute_force(topology, free, size)
            first = baselines.first_fit(topology, free, size)
            assert ours and best and first  # noqa: PT018 - a benchmark, not validation
            row = per_size.setdefault(size, {"optimum": [], "firstfit": [], "besteffort": []})
            row["optimum"].append(ratio(ours.ring_gbps, best.ring_gbps))
            row["firstfit"].append(ratio(ours.ring_gbps, first.ring_gbps))
            if baselines.best_effort_partitions(len(free), size) <= be_limit:
                effort = baselines.best_effort_choice(topology, free, size)
                assert effort
                row["besteffort"].append(ratio(ours.ring_gbps, effort.ring_gbps))
            else:
                skipped += 1
    sizes = {}
    for size, row in sorted(per_size.items()):
        sizes[str(size)] = {
            "cases": len(row["optimum"]),
            "optimum_ratio_min": min(row["optimum"]),
            "firstfit_ratio_min": min(row["firstfit"]),
            "firstfit_ratio_geomean": statistics.geometric_mean(row["firstfit"]),
            "besteffort_cases": len(row["besteffort"]),
            "besteffort_ratio_min": min(row["besteffort"], default=None),
            "besteffort_ratio_max": max(row["besteffort"], default=None),
            "besteffort_beaten": sum(r > 1 for r in row["besteffort"]),
        }
    return {"sizes": sizes, "besteffort_skipped": skipped}


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)

    def pick(quantile: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)] / 1e6

    return {"n": len(ordered), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": pick(1.0)}


def timed(call: Callable[[], T]) -> tuple[int, T]:
    """Nanoseconds an uncached call takes, and its result."""
    allocator.clear_cache()
    start = time.perf_counter_ns()
    result = call()
    return time.perf_counter_ns() - start, result


def node_latency(topology: Topology, rnd: random.Random, queries: int) -> dict[str, float]:
    samples = []
    for _ in range(queries):
        used = rnd.randint(0, topology.size - 1)
        free = frozenset(range(topology.size)) - frozenset(rnd.sample(range(topology.size), used))
        size = rnd.randint(1, len(free))
        elapsed, _ = timed(functools.partial(allocator.best_set, topology, free, size))
        samples.append(elapsed)
    return percentiles(samples)


def cluster(rnd: random.Random, rounds: int) -> dict[str, Any]:
    names = [f"node-{i:04d}" for i in range(1000)]
    hardware = [
        topologies.for_node(EIGHT_GPU[i % len(EIGHT_GPU)], name) for i, name in enumerate(names)
    ]
    jobs = {"64x1": JobRequest(64, 1), "16x8": JobRequest(16, 8)}
    # First sight of a node's topology object (fingerprint, table lookup) is paid once per
    # annotation text, which the operator caches; time it apart from decisions.
    start = time.perf_counter()
    for topology in hardware:
        tables_for(topology)
    results: dict[str, Any] = {"first_sight_ms": (time.perf_counter() - start) * 1e3}
    all_samples: list[int] = []
    for kind in ("iid", "per-node"):
        for label, request in jobs.items():
            samples, outcomes = [], []
            for _ in range(rounds):
                nodes = [
                    NodeState(name, topology, _used(kind, rnd))
                    for name, topology in zip(names, hardware, strict=True)
                ]
                elapsed, outcome = timed(functools.partial(place_job, request, nodes))
                samples.append(elapsed)
                if isinstance(outcome, Placement):
                    outcomes.append(f"{len(outcome.nodes)} nodes, ring {outcome.ring_gbps:g}")
                else:
                    outcomes.append("no fit")
            all_samples += samples
            results[f"{kind} {label}"] = {
                **percentiles(samples),
                "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
            }
    results["all"] = percentiles(all_samples)
    return results


def _used(kind: str, rnd: random.Random) -> frozenset[int]:
    if kind == "iid":
        return frozenset(gpu for gpu in range(8) if rnd.random() < 0.5)
    return frozenset(rnd.sample(range(8), rnd.randint(0, 8)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer states and rounds")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--besteffort-limit", type=int, default=20_000)
    parser.add_argument("--no-fabric", action="store_true", help="skip the fabric section")
    args = parser.parse_args()
    began = time.perf_counter()
    rnd = random.Random(args.seed)

    tables_ms = {}
    for name in topologies.NAMES:
        start = time.perf_counter()
        tables_for(topologies.load(name))
        tables_ms[name] = (time.perf_counter() - start) * 1e3

    states_8, states_16 = (6, 2) if args.quick else (100, 12)
    per_topology = {}
    for name in topologies.NAMES:
        count = states_16 if topologies.load(name).size > 8 else states_8
        per_topology[name] = quality(name, rnd, count, args.besteffort_limit)
        print(f"quality {name}: done", file=sys.stderr)
    cases = [s for t in per_topology.values() for s in t["sizes"].values()]

    queries = 300 if args.quick else 2000
    node8 = {name: node_latency(topologies.load(name), rnd, queries) for name in EIGHT_GPU}
    node16 = node_latency(topologies.load("dgx2"), rnd, queries // 2)
    clustered = cluster(rnd, 5 if args.quick else 100)

    summary = {
        "optimum_ratio_min": min(c["optimum_ratio_min"] for c in cases),
        "besteffort_ratio_min": min(
            c["besteffort_ratio_min"] for c in cases if c["besteffort_ratio_min"] is not None
        ),
        "firstfit_ratio_geomean": statistics.geometric_mean(
            [c["firstfit_ratio_geomean"] for c in cases for _ in range(c["cases"])]
        ),
        "besteffort_beaten_cases": sum(c["besteffort_beaten"] for c in cases),
        "besteffort_cases": sum(c["besteffort_cases"] for c in cases),
        "quality_cases": sum(c["cases"] for c in cases),
        "p50_ms_node8": max(v["p50_ms"] for v in node8.values()),
        "p99_ms_node8": max(v["p99_ms"] for v in node8.values()),
        "p50_ms_node16": node16["p50_ms"],
        "p99_ms_node16": node16["p99_ms"],
        "p50_ms_cluster1000": clustered["all"]["p50_ms"],
        "p99_ms_cluster1000": clustered["all"]["p99_ms"],
    }
    report = {
        **summary,
        "per_topology": per_topology,
        "latency": {"node8": node8, "node16_dgx2": node16, "cluster1000": clustered},
        "tables_ms": tables_ms,
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "quick": args.quick,
            "seed": args.seed,
        },
        "runtime_s": time.perf_counter() - began,
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print_table(per_topology, node8, node16, clustered, summary, tables_ms)
    print(f"\nwrote {OUT} in {report['runtime_s']:.0f} s")
    if not args.no_fabric:
        fabric = placement_fabric.run(quick=args.quick, seed=args.seed)
        placement_fabric.OUT.write_text(json.dumps(fabric, indent=2) + "\n")
        print("\n--- fabric: whole jobs over the fabric between nodes ---\n")
        placement_fabric.print_report(fabric)
        print(f"\nwrote {placement_fabric.OUT} in {fabric['runtime_s']:.0f} s")


def print_table(
    per_topology: dict[str, Any],
    node8: dict[str, dict[str, float]],
    node16: dict[str, float],
    clustered: dict[str, Any],
    summary: dict[str, float],
    tables_ms: dict[str, float],
) -> None:
    print(f"{'topology':<20}{'size':>5}{'cases':>7}{'vs opt':>9}", end="")
    print(f"{'vs FF geo':>11}{'vs BE min':>11}{'BE beaten':>11}")
    for name, data in per_topology.items():
        for size, row in data["sizes"].items():
            be = row["besteffort_ratio_min"]
            print(
                f"{name:<20}{size:>5}{row['cases']:>7}{row['optimum_ratio_min']:>9.3f}"
                f"{row['firstfit_ratio_geomean']:>11.3f}"
                f"{'-' if be is None else f'{be:.3f}':>11}"
                f"{row['besteffort_beaten']:>5}/{row['besteffort_cases']:<5}"
            )
    print(f"\n{'latency (uncached)':<34}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    rows: dict[str, Any] = {f"node8 {k}": v for k, v in node8.items()}
    rows["node16 dgx2"] = node16
    rows |= {f"cluster1000 {k}": v for k, v in clustered.items() if isinstance(v, dict)}
    for label, row in rows.items():
        print(f"{label:<34}{row['n']:>6}{row['p50_ms']:>9.3f}", end="")
        print(f"{row['p99_ms']:>9.3f}{row['max_ms']:>9.3f}")
    for label, row in clustered.items():
        if isinstance(row, dict) and "outcomes" in row:
            print(f"  {label}: {row['outcomes']}")
    print(f"\ncluster first sight of 1,000 node topologies: {clustered['first_sight_ms']:.0f} ms")
    print("tables built (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in tables_ms.items()))
    print()
    for key, figure in summary.items():
        print(f"{key:<26}{figure:.4g}" if isinstance(figure, float) else f"{key:<26}{figure}")


if __name__ == "__main__":
    main()

"""Fractional-GPU admission latency per pod at 1,000 opted-in nodes (target: p99 < 10 ms).

Run as ``make bench-fractional`` (or ``.venv/bin/python bench/fractional.py [--quick]``). Prints
a table and writes ``.bench/fractional.json``.

Cluster: 1,000 ``core_mem`` nodes of 8 GPUs x 79 GiB (what the agent advertises for an H100
80GB), every other node ``binpack``, one in ten holding memory-only shares. Before timing, it is
filled with random shares to a target occupancy (30% and 85%; per GPU the busier of memory and
compute, averaged) so that decisions search a fragmented cluster. Each timed admission is what
the webhook does without I/O: read and validate the pod's request, place it in the ledger,
compute the pod edits and their JSON patch. Between admissions a random held pod is released,
keeping the occupancy steady. Also timed: an MPIJob's 16 workers x (2 GiB, 25%) placed
all-or-nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from mpijob import keys
from mpijob.admission.fractional import Ledger, NodeGpu
from mpijob.api.fractional import Placed, Share, read_request
from mpijob.desired.fractional import json_patch, pod_edits

NODES = 1000
GPUS = 8
MEMORY = 79


def cluster(rng: random.Random) -> Ledger:
    ledger = Ledger()
    for n in range(NODES):
        gpus = [NodeGpu(i, f"GPU-{n:04d}-{i}", MEMORY) for i in range(GPUS)]
        ledger.set_node(f"node-{n:04d}", gpus, binpack=n % 2 == 0)
    return ledger


def random_share(rng: random.Random, memory_only: bool) -> Share:
    memory = rng.choice([1, 2, 2, 4, 4, 8, 10, 16])
    return Share(memory, None if memory_only else rng.choice(range(5, 55, 5)))


def used(ledger: Ledger) -> float:
    """Occupancy: per GPU the busier of memory and compute, averaged over all GPUs."""
    total = 0.0
    for node in ledger.nodes.values():
        for gpu in node.gpus.values():
            total += max(gpu.memory_used / gpu.memory_gib, gpu.percentage_used / 100)
    return total / (NODES * GPUS)


def fill(ledger: Ledger, rng: random.Random, occupancy: float) -> list[str]:
    """Hold random shares until ``occupancy`` is reached; the pods held."""
    held: list[str] = []
    attempts = 0
    while attempts < 400_000:
        if attempts % 2000 == 0 and used(ledger) >= occupancy:
            break
        attempts += 1
        n = rng.randrange(NODES)
        share = random_share(rng, memory_only=n % 10 == 9)
        pod = f"fill-{attempts}"
        if isinstance(ledger.place(pod, share, nodes=(f"node-{n:04d}",)), Placed):
            held.append(pod)
    return held


def pod(share: Share) -> dict[str, Any]:
    limits = {keys.GPU_MEM_RESOURCE: str(share.memory_gib)}
    if share.percentage is not None:
        limits[keys.GPU_CORE_PERCENTAGE_RESOURCE] = str(share.percentage)
    return {
        "metadata": {"name": "p", "namespace": "bench"},
        "spec": {"containers": [{"name": "cuda", "resources": {"limits": limits}}]},
    }


def admit(ledger: Ledger, name: str, body: dict[str, Any]) -> bool:
    request = read_request(body["spec"])
    share = request.share
    if share is None:
        raise SystemExit(f"bench pod invalid: {request.errors}")
    placed = ledger.place(name, share)
    if not isinstance(placed, Placed):
        return False
    json_patch(body, pod_edits(body, placed))
    return True


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(occupancy: float, pods: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ledger = cluster(rng)
    held = fill(ledger, rng, occupancy)
    achieved = used(ledger)
    times: list[float] = []
    refused = 0
    for i in range(pods):
        body = pod(random_share(rng, memory_only=rng.random() < 0.1))
        start = time.perf_counter()
        ok = admit(ledger, f"bench-{i}", body)
        times.append((time.perf_counter() - start) * 1000)
        if ok:
            held.append(f"bench-{i}")
        else:
            refused += 1
        ledger.release(held.pop(rng.randrange(len(held))))
    assert ledger.overcommitted() == []
    jobs: list[float] = []
    for j in range(50):
        workers = [(f"job-{j}-w{w}", Share(2, 25)) for w in range(16)]
        start = time.perf_counter()
        result = ledger.place_all(workers)
        jobs.append((time.perf_counter() - start) * 1000)
        if isinstance(result, list):
            for name, _ in workers:
                ledger.release(name)
    return {
        "occupancy": occupancy,
        "achieved": achieved,
        "held_before": len(held),
        "pods": pods,
        "refused": refused,
        "p50_ms": percentile(times, 0.50),
        "p99_ms": percentile(times, 0.99),
        "max_ms": max(times),
        "mean_ms": statistics.fmean(times),
        "job16_p50_ms": percentile(jobs, 0.50),
        "job16_p99_ms": percentile(jobs, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 pods per case, not 5,000")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    pods = 1000 if args.quick else 5000
    results = [run(occupancy, pods, args.seed) for occupancy in (0.30, 0.85)]
    machine = f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"Fractional admission at {NODES} nodes x {GPUS} GPUs ({machine})")
    print(
        f"{'occupancy':>10} {'reached':>8} {'pods':>6} {'refused':>8} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'max ms':>8} {'16-worker job p50/p99 ms':>26}"
    )
    for r in results:
        print(
            f"{r['occupancy']:>10.0%} {r['achieved']:>8.1%} {r['pods']:>6} {r['refused']:>8}"
            f" {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} {r['max_ms']:>8.3f}"
            f" {r['job16_p50_ms']:>12.3f} / {r['job16_p99_ms']:.3f}"
        )
    verdict = all(r["p99_ms"] < 10 for r in results)
    print("p99 < 10 ms:", "yes" if verdict else "NO")
    out = Path(".bench")
    out.mkdir(exist_ok=True)
    (out / "fractional.json").write_text(
        json.dumps({"machine": machine, "nodes": NODES, "results": results}, indent=2)
    )


if __name__ == "__main__":
    main()

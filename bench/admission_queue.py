"""Admission-queue benchmark: passes over 10,000 waiting topology jobs on 1,000 nodes, no cluster.

Run as ``.venv/bin/python -m bench.admission_queue`` (``--jobs``/``--nodes``/``--passes`` change
the size). Prints a table and writes ``.bench/queue.json``.

The operator's own :class:`mpijob.gang.service.Admission` runs its passes on an asyncio
loop, against a snapshot as the caches would hold it: ``--nodes`` opted-in 8-GPU nodes
(dgx1-v100), each fully held by a running job's PlacementDecision, and ``--jobs`` waiting jobs
of one worker x 8 GPUs, each pinned to one node by a ``kubernetes.io/hostname``
nodeSelector (the case a single line handled worst: every one waits for its own node). Nothing
fits, so every pass considers every job, and no decision is written.

Measured, on the same loop and process as the operator runs them:

- **pass time**: the wall time of each ``run_pass`` (p50, p99, max over ``--passes``);
- **/healthz**: the operator's own ``/healthz`` server (:func:`mpijob.metrics.serve`, a thread,
  healthy while the loop's heartbeat is under 30 s old) probed every 50 ms from another thread
  while the passes run: latency p50/p99/max, and how many answers were not 200;
- **loop stall**: the gaps between two heartbeats of a 50 ms ticker on the loop (p99, max),
  i.e. how long any other work of the operator (an unrelated job's reconcile, its ``Created``)
  waited behind a pass. This bounds, but is not, an unrelated job's time to ``Created`` on a
  cluster, which also needs the API server and the watch (not measured here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mpijob import api, keys, metrics
from mpijob.gang import topology
from mpijob.gang.service import Admission
from mpijob.placement import codec, topologies
from mpijob.placement.job import WorkerAssignment

OUT = Path(__file__).resolve().parent.parent / ".bench" / "queue.json"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TOPOLOGY = codec.dumps(topologies.dgx1_v100())


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY,
                "kubernetes.io/hostname": name,
            },
            "annotations": {keys.GPU_TOPOLOGY: TOPOLOGY},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def job(name: str, namespace: str, created: datetime, pinned: str | None) -> api.MPIJob:
    worker: dict[str, Any] = {
        "containers": [
            {"name": "w", "image": "mpi", "resources": {"limits": {keys.GPU_RESOURCE: "8"}}}
        ]
    }
    if pinned:
        worker["nodeSelector"] = {"kubernetes.io/hostname": pinned}
    launcher = {"containers": [{"name": "l", "image": "mpi"}]}
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {keys.GPU_TOPOLOGY: "true"},
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": launcher}},
                "Worker": {"replicas": 1, "template": {"spec": worker}},
            }
        },
    }
    return api.with_defaults(api.parse(body))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scenario(args: argparse.Namespace) -> Admission:
    """Every node full, every job pinned to one of them: nothing fits, every job is considered."""
    rnd = random.Random(args.seed)
    names = [f"gpu-{i:04d}" for i in range(args.nodes)]
    nodes = [node(n) for n in names]
    decisions = {
        ("running", f"r{i}"): topology.Decision(
            f"uid-r{i}", (WorkerAssignment(n, tuple(range(8))),), 50.0, "8 GPUs"
        )
        for i, n in enumerate(names)
    }
    jobs = {}
    for i in range(args.jobs):
        ns = f"team-{i % 50}"
        j = job(f"j{i}", ns, T0 + timedelta(seconds=i), rnd.choice(names))
        jobs[(ns, j.name)] = j

    async def write(obj: dict[str, Any]) -> None:
        raise AssertionError(f"nothing fits, yet {obj['metadata']['name']} was admitted")

    async def read(*_: str) -> None:
        return None

    admission = Admission(
        write_decision=write,
        enqueue=lambda key: None,
        snapshot=lambda: topology.Snapshot(nodes, [], decisions),
        live=jobs.get,
        decision_of=lambda key: None,
        priority_values=dict,
        create_object=write,
        get_object=read,
        inter_node_gbps=25.0,
    )
    for key, j in jobs.items():
        admission.want(key, j)
    return admission


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    admission = scenario(args)
    heartbeat = [time.monotonic()]
    gaps: list[float] = []

    stalls: list[tuple[float, float]] = []
    """(gap, when it ended), for the phases of a pass a stall fell in."""

    async def ticker() -> None:
        while True:
            now = time.monotonic()
            gaps.append(now - heartbeat[0])
            stalls.append((now - heartbeat[0], now))
            heartbeat[0] = now
            await asyncio.sleep(0.05)

    port = free_port()
    metrics.serve(port, healthy=lambda: time.monotonic() - heartbeat[0] < 30.0)
    probes: list[tuple[float, int]] = []
    stop = threading.Event()

    def probe() -> None:
        url = f"http://127.0.0.1:{port}/healthz"
        while not stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            except OSError:
                code = 0
            probes.append((time.perf_counter() - started, code))
            stop.wait(0.05)

    tick = asyncio.create_task(ticker())
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    await asyncio.sleep(0.3)
    passes = []
    for _ in range(args.passes):
        started = time.perf_counter()
        await admission.run_pass()
        passes.append(time.perf_counter() - started)
        await asyncio.sleep(0.2)
    worst = sorted(stalls, reverse=True)[:3]
    stop.set()
    thread.join()
    tick.cancel()
    waiting = sum(1 for d in admission.last.values() if type(d).__name__ == "Wait")
    latencies = [p for p, _ in probes]
    return {
        "nodes": args.nodes,
        "jobs": args.jobs,
        "passes": args.passes,
        "jobs_left_waiting": waiting,
        "pass_seconds": {
            "p50": statistics.median(passes),
            "p99": pct(passes, 0.99),
            "max": max(passes),
            "all": passes,
        },
        "healthz_seconds": {
            "probes": len(probes),
            "p50": statistics.median(latencies),
            "p99": pct(latencies, 0.99),
            "max": max(latencies),
            "not_200": sum(1 for _, code in probes if code != 200),
        },
        "loop_stall_seconds_max": max(gaps),
        "loop_stall_seconds_p99": pct(gaps, 0.99),
        "loop_stalls_worst": [gap for gap, _ in worst],
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    p, h = result["pass_seconds"], result["healthz_seconds"]
    print(f"{result['jobs']} waiting jobs on {result['nodes']} nodes, {result['passes']} passes")
    print(f"  pass time      p50 {p['p50']:.3f} s  p99 {p['p99']:.3f} s  max {p['max']:.3f} s")
    print(
        f"  /healthz       p50 {h['p50'] * 1000:.1f} ms  p99 {h['p99'] * 1000:.1f} ms  "
        f"max {h['max'] * 1000:.1f} ms  ({h['probes']} probes, {h['not_200']} not 200)"
    )
    print(
        f"  loop stall     p99 {result['loop_stall_seconds_p99']:.3f} s  "
        f"max {result['loop_stall_seconds_max']:.3f} s (50 ms ticks)"
    )
    print(f"written to {OUT}")


if __name__ == "__main__":
    main()

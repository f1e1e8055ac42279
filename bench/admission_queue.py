"""Admission-queue benchmark: passes over 10,000 waiting topology jobs on 1,000 nodes.

Run as ``.venv/bin/python -m bench.admission_queue`` (``--jobs``/``--nodes``/``--passes`` change
the size). Prints a table and writes ``.bench/queue.json``.

The operator's own :class:`mpijob.gang.service.Admission` runs its passes on an asyncio
loop, against a snapshot as the caches would hold it: ``--nodes`` opted-in 8-GPU nodes
(dgx1-v100) advertising a kwok node's allocatable (96 CPUs, 768 GiB, 110 pods), each fully
held by a running job's PlacementDecision, and ``--jobs`` waiting jobs of one worker x 8 GPUs,
8 CPUs and 64 GiB (which the fit beyond GPUs weighs), each pinned to one node by a
``kubernetes.io/hostname`` nodeSelector (the case a single line handled worst: every one waits
for its own node). Nothing fits, so every pass considers every job, and no decision is written.

Measured, on the same loop and process as the operator runs them:

- **pass time**: the wall time of each ``run_pass`` (p50, p99, max over ``--passes``);
- **/healthz**: the liveness probe as the operator serves it, on the event loop (Kopf's probe
  server, an aiohttp server: here one of its own kind, healthy while the loop's heartbeat is
  under 30 s old), probed every 50 ms from another thread while the passes run: latency
  p50/p99/max, which is how long a probe waits for the loop, and how many answers were not 200;
- **loop stall**: the gaps between two heartbeats of a 50 ms ticker on the loop (p99, max),
  i.e. how long any other work of the operator (an unrelated job's reconcile, its ``Created``)
  waited behind a pass. This bounds, but is not, an unrelated job's time to ``Created`` on a
  cluster, which also needs the API server and the watch: ``--cluster`` measures that.

``--cluster`` (``make bench-queue-cluster``) measures the same on a real local cluster. It
starts its own (``hack/cluster.py`` with ``MPIJOB_CLUSTER_DIR=.bench/cluster-queue``, so neither
the tests' cluster nor ``make bench``'s is touched; the helpers of ``bench/reconcile.py``) with
``--nodes`` kwok dgx1-v100 nodes opted into topology placement and no real node, then:

1. one plain pod per node, bound by ``nodeName``, holds its 8 GPUs (namespace ``bench-hog``);
2. ``--jobs`` MPIJobs (namespace ``bench-queue``), each one worker x 8 GPUs with
   ``mpijob.io/gpu-topology: "true"``, pinned to one node by ``kubernetes.io/hostname``: none
   can fit. Created with ``kubectl apply --server-side``, 500 a request, two at a time;
3. the operator from source (``python -m mpijob run``, cluster-wide, the client limits raised
   to QPS 500 / burst 1000 for the intake), started after the jobs exist; the bench waits, by
   a watch, until every job's status says ``GangAdmitted=False`` with reason ``GangWaiting``
   and a pass's own message;
4. ``--runs`` times (3), one after the other: an unrelated MPIJob (launcher and one worker, no
   GPU, namespace ``bench-cpu``) is POSTed, and its time to ``Created=True`` is taken from an
   admin watch (POST to the event's arrival). Over a window of ``--window`` seconds from the
   POST, ``/healthz`` (Kopf's, on ``--health-port``) is probed every 100 ms (p99 latency,
   answers not 200), and the pass
   time p99 (and p50) is read from the operator's ``mpi_operator_admission_pass_seconds``
   histogram (the passes of the window, interpolated within buckets as
   ``histogram_quantile`` does);
5. the cluster goes down.

It prints each run and the medians, and writes ``.bench/queue-cluster.json`` (set-up times
per step, jobs waiting over the intake, the operator's peak RSS and CPU); the operator's log
goes to ``.bench/logs/queue-cluster.log``. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import queue
import random
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from bench import ours_env
from hack.common import free_port
from mpijob import api, keys
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
        # What a kwok node of the local cluster advertises: the fit weighs every worker on it.
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {
                "cpu": "96",
                "memory": "768Gi",
                "pods": "110",
                keys.GPU_RESOURCE: "8",
            },
        },
    }


def job(name: str, namespace: str, created: datetime, pinned: str | None) -> api.MPIJob:
    limits = {keys.GPU_RESOURCE: "8", "cpu": "8", "memory": "64Gi"}
    worker: dict[str, Any] = {
        "containers": [{"name": "w", "image": "mpi", "resources": {"limits": limits}}]
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
            "resourceVersion": "1",
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


async def serve_liveness(port: int, alive: Callable[[], bool]) -> web.AppRunner:
    """``/healthz`` as the operator's liveness probe is served: an aiohttp server on the event
    loop the passes run on (Kopf's probe server is one), 200 while ``alive``, else 500."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(status=200 if alive() else 500)

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz)])
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


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
    liveness = await serve_liveness(port, lambda: time.monotonic() - heartbeat[0] < 30.0)
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
    await asyncio.to_thread(thread.join)  # its last probe is answered on this loop
    await liveness.cleanup()
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


# --- on a real local cluster (--cluster) --------------------------------------------------------

CLUSTER_OUT = OUT.parent / "queue-cluster.json"
QUEUE_NS = "bench-queue"
"""The waiting topology jobs."""
HOG_NS = "bench-hog"
"""One plain pod per node holding all its GPUs, as another scheduler's workload would."""
CPU_NS = "bench-cpu"
"""The unrelated jobs: no GPUs, so no topology placement."""
LOCK_NS = "bench-operator"
NODE_GPUS = 8
PLACEHOLDER = "waiting for the next admission pass"
"""The message a topology job waits with until a pass has considered it."""
OPERATOR_LIMITS = {"--kube-api-qps": "500", "--kube-api-burst": "1000", "--threadiness": "8"}


def waiting_job(i: int, nodes: int) -> dict[str, Any]:
    """One worker x 8 GPUs, opted into topology placement, pinned to one node that is full."""
    worker = {
        "nodeSelector": {"kubernetes.io/hostname": f"gpu-node-{i % nodes}"},
        "containers": [
            {
                "name": "worker",
                "image": "mpioperator/mpi-pi:openmpi",
                "resources": {"limits": {keys.GPU_RESOURCE: str(NODE_GPUS)}},
            }
        ],
    }
    launcher = {"containers": [{"name": "launcher", "image": "mpioperator/mpi-pi:openmpi"}]}
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {
            "name": f"wait-{i:05d}",
            "namespace": QUEUE_NS,
            "annotations": {keys.GPU_TOPOLOGY: "true"},
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": launcher}},
                "Worker": {"replicas": 1, "template": {"spec": worker}},
            }
        },
    }


def hog_pod(i: int) -> dict[str, Any]:
    """Bound by nodeName (no scheduler), all 8 GPUs of its node; kwok runs it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"hog-{i:04d}", "namespace": HOG_NS},
        "spec": {
            "nodeName": f"gpu-node-{i}",
            "containers": [
                {
                    "name": "hog",
                    "image": "busybox",
                    "resources": {"limits": {keys.GPU_RESOURCE: str(NODE_GPUS)}},
                }
            ],
        },
    }


def apply_in_batches(rc: Any, objects: list[dict[str, Any]], batch: int, parallel: int) -> None:
    """Server-side apply, ``batch`` objects a request, ``parallel`` kubectl at a time."""
    chunks = [objects[i : i + batch] for i in range(0, len(objects), batch)]

    def one(chunk: list[dict[str, Any]]) -> None:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk})
        rc.kubectl("apply", "--server-side", "--field-manager=bench", "-f", "-", input=text)

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, chunks))


def is_waiting(obj: dict[str, Any]) -> bool:
    """``GangAdmitted=False`` with reason ``GangWaiting`` and a pass's own message."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == keys.COND_GANG_ADMITTED:
            return bool(
                c.get("status") == "False"
                and c.get("reason") == keys.REASON_GANG_WAITING
                and PLACEHOLDER not in (c.get("message") or "")
            )
    return False


def histogram(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts (le -> count) of one Prometheus histogram."""
    out = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            labels, _, value = line.rpartition(" ")
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(value)
    return out


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """``histogram_quantile`` over the observations between two scrapes: linear within the
    bucket the quantile falls in, as Prometheus computes it."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return str(r.read().decode())


class Prober:
    """``/healthz`` every 100 ms from a thread: (when, latency, status)."""

    def __init__(self, port: int) -> None:
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._url = f"http://127.0.0.1:{port}/healthz"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self._url, timeout=30) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            except OSError:
                code = 0
            self.samples.append((time.monotonic(), time.perf_counter() - started, code))
            self._stop.wait(0.1)

    def between(self, start: float, end: float) -> list[tuple[float, int]]:
        return [(lat, code) for when, lat, code in self.samples if start <= when <= end]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def cpu_job(name: str) -> dict[str, Any]:
    """An unrelated MPIJob: no GPUs, so it never enters the topology queue."""
    container = {"name": "c", "image": "mpioperator/mpi-pi:openmpi"}
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": name, "namespace": CPU_NS},
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [container]}}},
                "Worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}},
            }
        },
    }


def post(rc: Any, path: str, body: dict[str, Any]) -> None:
    state = rc.cluster.State.load()
    ctx = ssl.create_default_context(cafile=str(rc.cluster.state_dir() / "pki/apiserver.crt"))
    request = urllib.request.Request(
        rc.cluster.server_url(state) + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {rc.cluster.TOKEN}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, context=ctx, timeout=60) as r:
        r.read()


def time_to_created(rc: Any, watches: Any, name: str, timeout: float) -> float | None:
    """Seconds from just before the POST of ``name`` to the watch event showing Created=True."""
    path = f"/apis/{keys.API_VERSION}/namespaces/{CPU_NS}/mpijobs"
    t0 = time.monotonic()
    post(rc, path, cpu_job(name))
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(queue.Empty):
            arrival, _, kind, obj = watches.events.get(timeout=1)
            if kind != "SYNC" and obj["metadata"]["name"] == name and rc.created(obj):
                return float(arrival - t0)
    return None


def median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def load_reconcile() -> Any:
    # A cluster of its own, never the tests' (.cluster) or make bench's (.bench/cluster).
    os.environ.setdefault("MPIJOB_CLUSTER_DIR", str(OUT.parent / "cluster-queue"))
    from bench import reconcile  # the cluster, the watches, the operator's start

    return reconcile


def set_up(rc: Any, args: argparse.Namespace, setup: dict[str, float]) -> None:
    """The cluster, a plain pod filling every node's GPUs, then the waiting jobs."""
    t = time.monotonic()
    rc.run_cluster("up", "--nodes", str(args.nodes), "--real-nodes", "0")
    rc.kubectl("apply", "--server-side", "-f", str(rc.ROOT / "crds"))
    rc.kubectl("wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org")
    for ns in (QUEUE_NS, HOG_NS, CPU_NS, LOCK_NS):
        rc.kubectl("create", "namespace", ns)
    setup["cluster_up_seconds"] = time.monotonic() - t
    rc.say(f"cluster with {args.nodes} nodes up in {setup['cluster_up_seconds']:.0f} s")
    t = time.monotonic()
    apply_in_batches(rc, [hog_pod(i) for i in range(args.nodes)], 250, 2)
    setup["hog_pods_seconds"] = time.monotonic() - t
    t = time.monotonic()
    apply_in_batches(rc, [waiting_job(i, args.nodes) for i in range(args.jobs)], 500, 2)
    setup["apply_jobs_seconds"] = time.monotonic() - t
    rc.say(f"{args.jobs} MPIJobs applied in {setup['apply_jobs_seconds']:.0f} s")


def start_operator(rc: Any, port: int, health_port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Ours from source, cluster-wide, as shipped but for the client limits."""
    argv = [sys.executable, "-m", "mpijob", "run", "--lock-namespace", LOCK_NS]
    argv += ["--monitoring-port", str(port), "--health-port", str(health_port)]
    argv += [a for pair in OPERATOR_LIMITS.items() for a in pair]
    env = ours_env(KUBECONFIG=str(rc.cluster.state_dir() / "kubeconfig"))
    proc: subprocess.Popen[bytes] = rc.launch(argv, port, env, log_path, timeout=300)
    return proc


def wait_all_waiting(
    rc: Any,
    watches: Any,
    jobs: int,
    timeout: float,
    proc: subprocess.Popen[bytes],
    progress: list[tuple[float, int]],
) -> int:
    """Until every job says it waits in its status (or ``timeout``); how many do. Appends
    (seconds, jobs waiting) to ``progress`` every 10 s."""
    state: dict[str, bool] = {}
    t = last_said = time.monotonic()
    while sum(state.values()) < jobs and time.monotonic() - t < timeout and proc.poll() is None:
        with contextlib.suppress(queue.Empty):
            _, _, kind, obj = watches.events.get(timeout=1)
            if kind == "SYNC":
                state = {}
            for item in obj["items"] if kind == "SYNC" else [obj]:
                state[item["metadata"]["name"]] = kind != "DELETED" and is_waiting(item)
        if time.monotonic() - last_said > 10:
            last_said = time.monotonic()
            progress.append((round(last_said - t), sum(state.values())))
            rc.say(f"{progress[-1][1]} of {jobs} jobs say they wait")
    return sum(state.values())


def measure_run(
    rc: Any, cpus: Any, prober: Prober, port: int, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One unrelated job's time to Created, and the pass and /healthz figures of its window."""
    metric = "mpi_operator_admission_pass_seconds"
    before = histogram(scrape(port), metric)
    start = time.monotonic()
    seconds = time_to_created(rc, cpus, name, args.timeout)
    time.sleep(max(0.0, start + args.window - time.monotonic()))
    end = time.monotonic()
    after = histogram(scrape(port), metric)
    probes = prober.between(start, end)
    latencies = [lat for lat, _ in probes]
    return {
        "created_seconds": seconds,
        "pass_seconds_p99": quantile(before, after, 0.99),
        "pass_seconds_p50": quantile(before, after, 0.5),
        "passes": after.get(float("inf"), 0) - before.get(float("inf"), 0),
        "healthz_seconds_p99": pct(latencies, 0.99) if latencies else None,
        "healthz_seconds_max": max(latencies) if latencies else None,
        "healthz_probes": len(probes),
        "healthz_not_200": sum(1 for _, code in probes if code != 200),
        "load_average": os.getloadavg(),
    }


def cluster_bench(args: argparse.Namespace) -> int:
    rc = load_reconcile()
    setup: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    t_all = time.monotonic()
    (rc.BENCH / "logs").mkdir(parents=True, exist_ok=True)
    log_path = rc.BENCH / "logs" / "queue-cluster.log"
    rc.say(f"starting the benchmark cluster in {rc.cluster.state_dir()}")
    rc.run_cluster("down")  # a cluster left by an interrupted run still holds its objects
    proc = waits = cpus = prober = None
    usage: dict[str, float] = {}
    waiting = 0
    progress: list[tuple[float, int]] = []
    """(seconds since the operator's start, jobs waiting)."""
    try:
        set_up(rc, args, setup)
        waits = rc.Watches(QUEUE_NS, kinds=["mpijobs"])
        cpus = rc.Watches(CPU_NS, kinds=["mpijobs"])
        port = rc.free_port()
        health_port = next(p for p in iter(rc.free_port, None) if p != port)
        t = time.monotonic()
        proc = start_operator(rc, port, health_port, log_path)
        setup["operator_leading_seconds"] = time.monotonic() - t
        waiting = wait_all_waiting(rc, waits, args.jobs, args.timeout, proc, progress)
        setup["operator_to_all_waiting_seconds"] = time.monotonic() - t
        waits.stop()
        if waiting < args.jobs:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise SystemExit(
                f"[bench] error: only {waiting} of {args.jobs} jobs waiting after "
                f"{setup['operator_to_all_waiting_seconds']:.0f} s:\n{tail}"
            )
        rc.say(
            f"all {args.jobs} jobs waiting {setup['operator_to_all_waiting_seconds']:.0f} s "
            "after the operator started"
        )
        time.sleep(args.settle)
        prober = Prober(health_port)
        for i in range(args.runs):
            runs.append(measure_run(rc, cpus, prober, port, f"cpu-{i}", args))
            rc.say(f"run {i + 1}: {json.dumps(runs[-1])}")
        usage = rc.proc_usage(proc.pid)
    finally:
        for w in (waits, cpus):
            if w is not None:
                w.stop()
        if prober is not None:
            prober.stop()
        if proc is not None:
            rc.stop(proc)
        if not args.keep_cluster:
            rc.run_cluster("down")
    result = {
        "nodes": args.nodes,
        "jobs": args.jobs,
        "jobs_waiting": waiting,
        "runs": runs,
        "medians": {
            k: median_of([r[k] for r in runs])
            for k in ("created_seconds", "pass_seconds_p99", "healthz_seconds_p99")
        },
        "setup_seconds": setup,
        "waiting_progress": progress,
        "operator": {**usage, "flags": OPERATOR_LIMITS, "log": str(log_path.relative_to(rc.ROOT))},
        "window_seconds": args.window,
        "runtime_seconds": time.monotonic() - t_all,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    }
    CLUSTER_OUT.write_text(json.dumps(result, indent=2) + "\n")
    print_cluster(result)
    return 0 if len(runs) == args.runs and all(r["created_seconds"] for r in runs) else 1


def show(v: float | None, scale: float = 1.0, unit: str = "s") -> str:
    return "-" if v is None else f"{v * scale:.2f} {unit}"


def print_cluster(result: dict[str, Any]) -> None:
    runs, m = result["runs"], result["medians"]
    print(
        f"{result['jobs']} waiting topology jobs on {result['nodes']} kwok nodes, {len(runs)} runs"
    )
    for i, r in enumerate(runs, 1):
        print(
            f"  run {i}: Created {show(r['created_seconds'])}, pass p99 "
            f"{show(r['pass_seconds_p99'])} ({r['passes']:.0f} passes), /healthz p99 "
            f"{show(r['healthz_seconds_p99'], 1000, 'ms')} ({r['healthz_not_200']} of "
            f"{r['healthz_probes']} not 200), load {r['load_average'][0]:.1f}"
        )
    print(
        f"  median: Created {show(m['created_seconds'])}, pass p99 {show(m['pass_seconds_p99'])}, "
        f"/healthz p99 {show(m['healthz_seconds_p99'], 1000, 'ms')}"
    )
    print("  set-up: " + ", ".join(f"{k} {v:.0f}" for k, v in result["setup_seconds"].items()))
    print(f"written to {CLUSTER_OUT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a real local cluster of kwok nodes, with the operator running (see above)",
    )
    parser.add_argument("--runs", type=int, default=3, help="--cluster: unrelated jobs, in turn")
    parser.add_argument(
        "--window", type=float, default=30, help="--cluster: seconds measured per run"
    )
    parser.add_argument(
        "--settle", type=float, default=10, help="--cluster: seconds between set-up and run 1"
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="--cluster: seconds allowed per phase"
    )
    parser.add_argument("--keep-cluster", action="store_true", help="--cluster: leave it up")
    args = parser.parse_args()
    if args.cluster:
        sys.exit(cluster_bench(args))
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

"""One MPIJob of 8,192 GPUs: what scale the operator supports, against upstream's.

Run as ``make bench-bigjob`` (``.venv/bin/python -m bench.bigjob``; ``--help`` for the knobs;
``--nodes 64 --workers 64 --runs 1`` is a quick run). It starts its own local cluster
(``hack/cluster.py`` with ``MPIJOB_CLUSTER_DIR=.bench/bigjob-cluster``, free ports, an audit log,
no real node, no DRA driver) of ``--nodes`` kwok nodes, each the shipped ``dgx-h100`` topology
(8 GPUs on NVSwitch, the topology annotation as the node agent publishes it,
``hack.cluster.node_manifest``), opted into topology placement, then labels them into a fabric
(``--fabric FILE`` of the operator, levels outermost first):

* ``zone`` (``topology.kubernetes.io/zone``): every node, 12.5 GB/s;
* ``block`` (GKE's ``cloud.google.com/gce-topology-block``): a spine of ``--spine-nodes``
  (default nodes / ``--b-jobs``, 256 of 1,024), 25 GB/s;
* ``leaf`` (``cloud.google.com/gce-topology-subblock``): ``--leaf-nodes`` (32), 50 GB/s;
* in the second phase also ``clique`` (GFD's ``nvidia.com/gpu.clique``), NVL72-like NVLink
  domains of ``--clique-nodes`` (9) nodes x 8 GPUs = 72 GPUs, 900 GB/s, laid inside each leaf
  (a leaf of 32 holds three cliques of 9 and one of 5).

Workloads, each timed from the start of ``kubectl apply --server-side``:

* **A**: one MPIJob of ``--workers`` (1,024) workers x 8 GPUs, ``mpijob.io/gpu-topology: "true"``
  and ``mpijob.io/fabric-required-level: zone``: every GPU of the cluster;
* **B**: ``--b-jobs`` (4) MPIJobs of workers / 4 (256) x 8 GPUs applied together, each
  ``fabric-required-level: block`` (one spine each);
* **reference**: A's job without the annotations through ours (``ours``), upstream's Go
  mpi-operator v0.8.2 with default flags (``upstream``) and with its work-queue limit lifted
  (``upstream-fastqueue``), as ``bench/reconcile.py`` runs them (same client limits, QPS 100,
  burst 200, threadiness 8).

Each trial starts the operator in a namespace of its own (``bigjob-<operator>``, also its token
user in the audit log), waits until it leads, applies, and follows admin-user list+watch streams
of the namespace until every stage is reached: PlacementDecision written (topology runs),
every worker pod created, every worker bound (``spec.nodeName``), every worker Running (kwok),
launcher Job created, MPIJob condition ``Running``. Then it reads the operator's peak RSS
(VmHWM) and CPU time from /proc, the hostfile ConfigMap's and the PlacementDecision's sizes,
stops the operator, counts its API requests in the audit log and deletes the namespace.
``--runs`` (3) rounds; the medians go in the table and in ``.bench/bigjob.json``, with the load
average at the start and the end and each trial's. Operator logs: ``.bench/logs/bigjob-*.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import ours_env
from bench import reconcile as rc
from hack import cluster
from mpijob import keys
from mpijob.placement import fabric
from tests.support.jobs import mpijob  # the tests' job factory, the shape users write

ROOT, BENCH = rc.ROOT, rc.BENCH
CLUSTER_DIR = BENCH / "bigjob-cluster"
# hack.cluster reads MPIJOB_CLUSTER_DIR on every call, so setting it here, after the imports
# (bench.reconcile defaults it to its own cluster), holds: a cluster of its own.
os.environ["MPIJOB_CLUSTER_DIR"] = str(CLUSTER_DIR)
OUT = BENCH / "bigjob.json"
LOGS = BENCH / "logs"

TOPOLOGY = "dgx-h100"
GPUS = 8
ZONE_LABEL = "topology.kubernetes.io/zone"
JOB_A = "big"
SETTLE_SECONDS = 2.0
OPERATORS = ("ours-topology", "ours", "upstream", "upstream-fastqueue")
"""Namespaces ``bigjob-<operator>``; each also a token user of the audit log."""
STAGES = (
    "decision",
    "workers_created",
    "workers_bound",
    "workers_running",
    "launcher_created",
    "job_running",
)
STAGE_LABELS = {
    "decision": "PlacementDecision written",
    "workers_created": "all workers created",
    "workers_bound": "all workers bound",
    "workers_running": "all workers Running",
    "launcher_created": "launcher Job created",
    "job_running": "MPIJob Running",
}
EXTRA_PATHS = {
    "placementdecisions": (
        f"/apis/{keys.DECISION_API_VERSION}/namespaces/{{ns}}/{keys.DECISION_PLURAL}"
    ),
}
WATCHED = ("pods", "jobs", "mpijobs", "placementdecisions")


def say(msg: str) -> None:
    print(f"[bigjob] {msg}", file=sys.stderr, flush=True)


def kubectl(*args: str, input: str | None = None) -> str:
    return rc.kubectl(*args, input=input)


# --- the fabric ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    nodes: int
    leaf_nodes: int
    spine_nodes: int
    clique_nodes: int

    def labels(self, i: int, cliques: bool) -> dict[str, str]:
        """Node ``i``'s place: zone, spine, leaf (and, with ``cliques``, its NVLink clique)."""
        leaf, within = divmod(i, self.leaf_nodes)
        out = {
            ZONE_LABEL: "zone-0",
            fabric.BLOCK_LABEL: f"spine-{i // self.spine_nodes}",
            fabric.SUBBLOCK_LABEL: f"leaf-{leaf}",
        }
        if cliques:
            out[fabric.CLIQUE_LABEL] = f"bigjob-leaf{leaf}.{within // self.clique_nodes}"
        return out

    def spec(self, cliques: bool) -> dict[str, Any]:
        """The operator's ``--fabric`` file (``fabric_labels.fabric_from_spec``)."""
        levels: list[dict[str, Any]] = [
            {"name": "zone", "nodeLabel": ZONE_LABEL, "gbps": fabric.NIC_400G_GBPS / 4},
            {"name": "block", "nodeLabel": fabric.BLOCK_LABEL, "gbps": fabric.NIC_400G_GBPS / 2},
            {"name": "leaf", "nodeLabel": fabric.SUBBLOCK_LABEL, "gbps": fabric.NIC_400G_GBPS},
        ]
        if cliques:
            levels.append(
                {"name": "clique", "nodeLabel": fabric.CLIQUE_LABEL, "gbps": fabric.NVL72_GBPS}
            )
        return {"levels": levels, "outsideGbps": fabric.NIC_400G_GBPS / 8}

    def counts(self, cliques: bool) -> dict[str, int]:
        names = [self.labels(i, cliques) for i in range(self.nodes)]
        return {label: len({n[label] for n in names}) for label in names[0]}


def label_nodes(shape: Shape, cliques: bool) -> None:
    """Server-side apply of the nodes' fabric labels, 256 nodes a request, two at a time."""
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"{cluster.NODE_PREFIX}{i}",
                "labels": shape.labels(i, cliques),
            },
        }
        for i in range(shape.nodes)
    ]
    chunks = [nodes[i : i + 256] for i in range(0, len(nodes), 256)]

    def one(chunk: list[dict[str, Any]]) -> None:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk})
        kubectl("apply", "--server-side", "--field-manager=bigjob", "-f", "-", input=text)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, chunks))


# --- workloads ----------------------------------------------------------------------------------


def job(name: str, workers: int, level: str | None) -> dict[str, Any]:
    annotations = {keys.GPU_TOPOLOGY: "true", keys.FABRIC_REQUIRED_LEVEL: level} if level else {}
    body = mpijob(
        name, workers=workers, gpus=GPUS, annotations=annotations, spec={"slotsPerWorker": GPUS}
    )
    if not annotations:
        del body["metadata"]["annotations"]
    return body


@dataclass(frozen=True)
class Workload:
    name: str
    jobs: tuple[tuple[str, int], ...]
    """(job name, workers) of each MPIJob applied together."""
    level: str | None

    def manifests(self) -> str:
        items = [job(name, workers, self.level) for name, workers in self.jobs]
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


# --- progress, seen through watches -------------------------------------------------------------


def condition(obj: dict[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


@dataclass
class Tracker:
    """The first moment (seconds after ``t0``) each stage held for every job of a workload."""

    jobs: dict[str, int]
    topology: bool
    t0: float = 0.0
    at: dict[str, float] = field(default_factory=dict)
    sets: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workers = {f"{j}-worker-{i}": j for j, n in self.jobs.items() for i in range(n)}
        self.wanted = {
            "decision": len(self.jobs) if self.topology else 0,
            "workers_created": len(self.workers),
            "workers_bound": len(self.workers),
            "workers_running": len(self.workers),
            "launcher_created": len(self.jobs),
            "job_running": len(self.jobs),
        }
        self.sets = {stage: set() for stage in STAGES}

    def feed(self, arrival: float, kind: str, event: str, obj: dict[str, Any]) -> None:
        if event == "SYNC":
            for item in obj["items"]:
                self.feed(arrival, kind, "ADDED", item)
            return
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        gone = event == "DELETED"
        if kind == "pods" and self.workers.get(name) == rc.controller_job(obj):
            spec, status = obj.get("spec") or {}, obj.get("status") or {}
            self._mark("workers_created", name, not gone)
            self._mark("workers_bound", name, not gone and bool(spec.get("nodeName")))
            self._mark("workers_running", name, not gone and status.get("phase") == "Running")
        elif kind == "jobs" and name.endswith("-launcher") and rc.controller_job(obj) in self.jobs:
            self._mark("launcher_created", name, not gone)
        elif kind == "mpijobs" and name in self.jobs:
            self._mark("job_running", name, not gone and condition(obj, keys.COND_RUNNING))
        elif kind == "placementdecisions" and name in self.jobs:
            self._mark("decision", name, not gone)
        for stage in STAGES:
            if stage not in self.at and len(self.sets[stage]) >= self.wanted[stage] > 0:
                self.at[stage] = round(arrival - self.t0, 3)

    def _mark(self, stage: str, name: str, holds: bool) -> None:
        (self.sets[stage].add if holds else self.sets[stage].discard)(name)

    def done(self) -> bool:
        return all(s in self.at for s in STAGES if self.wanted[s])

    def short(self) -> dict[str, int]:
        return {
            s: self.wanted[s] - len(self.sets[s])
            for s in STAGES
            if self.wanted[s] and s not in self.at
        }


# --- one trial ----------------------------------------------------------------------------------


def sizes(namespace: str, jobs: Sequence[str], topology: bool) -> dict[str, Any]:
    """Bytes of each job's hostfile ConfigMap (the hostfile, all data, the object) and of its
    PlacementDecision, as the API server returns them (JSON)."""
    out: dict[str, Any] = {}
    for name in jobs:
        cm = json.loads(kubectl("get", "configmap", f"{name}-config", "-n", namespace, "-o=json"))
        data = cm.get("data") or {}
        hostfile = data.get("hostfile", "")
        lines = hostfile.count("\n")
        row = {
            "hostfile_bytes": len(hostfile.encode()),
            "hostfile_lines": lines,
            "hostfile_bytes_per_line": round(len(hostfile.encode()) / lines, 2) if lines else None,
            "configmap_data_bytes": sum(len(k) + len(v.encode()) for k, v in data.items()),
            "configmap_object_bytes": len(json.dumps(cm, separators=(",", ":")).encode()),
        }
        if topology:
            decision = kubectl("get", keys.DECISION_PLURAL, name, "-n", namespace, "-o=json")
            row["decision_object_bytes"] = len(
                json.dumps(json.loads(decision), separators=(",", ":")).encode()
            )
        out[name] = row
    return out


def start_operator(
    operator: str, namespace: str, extra: Sequence[str], log_path: Path
) -> tuple[subprocess.Popen[bytes], list[str], float]:
    """The operator leading in ``namespace``; its process, command line and start time."""
    port = rc.free_port()
    kubeconfig = cluster.state_dir() / f"kubeconfig-{namespace}"
    base = "ours" if operator.startswith("ours") else operator
    argv = [*rc.operator_argv(base, namespace, port, kubeconfig), *extra]
    if base != "ours" and rc.port_taken(rc.UPSTREAM_HEALTH_PORT):
        raise SystemExit(
            f"[bigjob] error: port {rc.UPSTREAM_HEALTH_PORT} is taken; upstream needs it"
        )
    env = ours_env() if base == "ours" else dict(os.environ)
    env["KUBECONFIG"] = str(kubeconfig)
    started = time.time()
    proc = rc.launch(argv, port, env, log_path, timeout=300)
    return proc, argv, started


def trial(
    operator: str,
    workload: Workload,
    extra: Sequence[str],
    tag: str,
    timeout: float,
) -> dict[str, Any]:
    namespace = f"bigjob-{operator}"
    kubectl("create", "namespace", namespace)
    topology = workload.level is not None
    tracker = Tracker(dict(workload.jobs), topology)
    kinds = WATCHED if topology else WATCHED[:3]
    watches = rc.Watches(namespace, kinds, paths=EXTRA_PATHS, whole=("pods", "mpijobs"))
    log_path = LOGS / f"bigjob-{tag}.log"
    proc, argv, started = start_operator(operator, namespace, extra, log_path)
    try:
        time.sleep(SETTLE_SECONDS)
        leading_after = time.time() - started
        load = os.getloadavg()
        manifests = workload.manifests()
        tracker.t0 = time.monotonic()
        kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=manifests)
        applied = time.monotonic() - tracker.t0
        while not tracker.done() and time.monotonic() - tracker.t0 < timeout:
            with contextlib.suppress(queue.Empty):
                arrival, kind, event, obj = watches.events.get(timeout=1)
                tracker.feed(arrival, kind, event, obj)
            if proc.poll() is not None:
                say(f"{operator} exited with {proc.returncode}; see {log_path}")
                break
        done = time.time()
        usage = rc.proc_usage(proc.pid) if proc.poll() is None else {}
        size = sizes(namespace, [j for j, _ in workload.jobs], topology) if tracker.done() else {}
    finally:
        rc.stop(proc)
        watches.stop()
    time.sleep(1)  # the audit lines of the last responses
    requests = rc.audit_requests(namespace, started, done)
    row: dict[str, Any] = {
        "operator": operator,
        "workload": workload.name,
        "seconds": {s: tracker.at.get(s) for s in STAGES if tracker.wanted[s]},
        "short_at_end": tracker.short(),
        "apply_seconds": round(applied, 2),
        "leading_seconds": round(leading_after, 1),
        **{k: round(v, 1) for k, v in usage.items()},
        "sizes": size,
        "api_requests": sum(requests.values()),
        "api_requests_by_kind": dict(requests.most_common(12)),
        "load_average_at_apply": load,
        "command": [Path(argv[0]).name, *argv[1:]],
        "log": str(log_path.relative_to(ROOT)),
    }
    t = time.monotonic()
    kubectl("delete", "namespace", namespace, "--wait=true", f"--timeout={timeout:.0f}s")
    row["namespace_deleted_seconds"] = round(time.monotonic() - t, 1)
    seconds = row["seconds"]
    shown = ", ".join(f"{s} {v}" for s, v in seconds.items())
    say(
        f"{tag}: {shown}; RSS {usage.get('peak_rss_mb', 0):.0f} MiB, CPU "
        f"{usage.get('cpu_seconds', 0):.1f} s, {row['api_requests']} requests, load "
        f"{load[0]:.1f}" + (f"; SHORT {row['short_at_end']}" if row["short_at_end"] else "")
    )
    return row


# --- report -------------------------------------------------------------------------------------


def median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of one variant; how many runs reached each stage."""
    first = rows[0]
    out: dict[str, Any] = {
        "runs": len(rows),
        "seconds": {s: median([r["seconds"].get(s) for r in rows]) for s in first["seconds"]},
        "reached": {
            s: sum(r["seconds"].get(s) is not None for r in rows) for s in first["seconds"]
        },
    }
    for key in ("peak_rss_mb", "cpu_seconds", "api_requests"):
        out[key] = median([r.get(key) for r in rows])
    for key in ("hostfile_bytes", "configmap_data_bytes", "configmap_object_bytes"):
        out[key] = median([max((s[key] for s in r["sizes"].values()), default=None) for r in rows])
    out["decision_object_bytes"] = median(
        [
            max((s.get("decision_object_bytes", 0) for s in r["sizes"].values()), default=None)
            or None
            for r in rows
        ]
    )
    return out


COLUMNS = {
    "ours-topology A (spine)": ("topology A", "spine"),
    "ours-topology B (spine)": ("topology B", "spine"),
    "ours-topology A (cliques)": ("topology A", "cliques"),
    "ours-topology B (cliques)": ("topology B", "cliques"),
    "ours": ("ours", "plain"),
    "upstream": ("upstream", "default"),
    "upstream-fastqueue": ("upstream", "fastqueue"),
}
"""Variant -> its column's two heading lines, in the table's order."""


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(result: dict[str, Any]) -> None:
    summary = result["summary"]
    columns = [c for c in COLUMNS if c in summary]
    print(
        f"\nOne MPIJob of {result['workers']} workers x {GPUS} GPUs ({result['workers'] * GPUS} "
        f"GPUs) on {result['nodes']} kwok nodes ({TOPOLOGY}); B: {result['b_jobs']} jobs of "
        f"{result['workers'] // result['b_jobs']} applied together. Medians of {result['runs']} "
        f"run(s); seconds from kubectl apply. {result['machine']['cpus']} CPUs, load "
        f"{result['load_average']['start'][0]:.1f} at the start, "
        f"{result['load_average']['end'][0]:.1f} at the end."
    )
    width = 11
    for line in (0, 1):
        heads = [COLUMNS[c][line] for c in columns]
        print(f"{'':28}" + "".join(f"{h:>{width}}" for h in heads))
    for stage in STAGES:
        cells = [fmt(summary[c]["seconds"].get(stage), ".1f") for c in columns]
        print(f"{STAGE_LABELS[stage]:28}" + "".join(f"{x:>{width}}" for x in cells))
    for label, key, spec in (
        ("peak RSS (MiB)", "peak_rss_mb", ".0f"),
        ("CPU (s)", "cpu_seconds", ".1f"),
        ("API requests", "api_requests", ".0f"),
        ("hostfile (bytes)", "hostfile_bytes", ".0f"),
        ("ConfigMap object (bytes)", "configmap_object_bytes", ".0f"),
        ("PlacementDecision (bytes)", "decision_object_bytes", ".0f"),
    ):
        cells = [fmt(summary[c][key], spec) for c in columns]
        print(f"{label:28}" + "".join(f"{x:>{width}}" for x in cells))
    for c in columns:
        missed = {
            s: summary[c]["runs"] - n
            for s, n in summary[c]["reached"].items()
            if n < summary[c]["runs"]
        }
        if missed:
            print(f"{c}: stages not reached in some runs: {missed}")
    print(f"\nwrote {result['out']}")


# --- main ---------------------------------------------------------------------------------------


def run_phases(
    args: argparse.Namespace,
    shape: Shape,
    rows: dict[str, list[dict[str, Any]]],
    setup: dict[str, float],
) -> None:
    """The spine phase (topology A and B, then the reference runs, each round), then the
    clique phase (topology A and B); rows appended per variant."""
    b_workers = args.workers // args.b_jobs
    a = Workload("A", ((JOB_A, args.workers),), "zone")
    b = Workload("B", tuple((f"{JOB_A}-b{i}", b_workers) for i in range(args.b_jobs)), "block")
    plain = Workload("A", ((JOB_A, args.workers),), None)
    phases = [False] if "cliques" in args.skip else [False, True]
    for cliques in phases:
        phase = "cliques" if cliques else "spine"
        t = time.monotonic()
        label_nodes(shape, cliques)
        setup[f"label_{phase}_seconds"] = round(time.monotonic() - t, 1)
        spec_path = BENCH / f"bigjob-fabric-{phase}.json"
        spec_path.write_text(json.dumps(shape.spec(cliques), indent=2) + "\n")
        say(f"{phase} fabric: {shape.counts(cliques)} domains per level")
        topo_flags = ["--fabric", str(spec_path), "--gpu-binding", "annotations"]
        for r in range(1, args.runs + 1):
            workloads = [a] if "b" in args.skip else [a, b]
            for w in workloads:
                key = f"ours-topology {w.name} ({phase})"
                tag = f"topology-{w.name}-{phase}-{r}"
                rows.setdefault(key, []).append(
                    trial("ours-topology", w, topo_flags, tag, args.timeout)
                )
            if cliques or "reference" in args.skip:
                continue
            for op in OPERATORS[1:]:
                flags = ["--gpu-binding", "annotations"] if op == "ours" else []
                rows.setdefault(op, []).append(trial(op, plain, flags, f"{op}-{r}", args.timeout))


def report(
    args: argparse.Namespace,
    shape: Shape,
    rows: dict[str, list[dict[str, Any]]],
    setup: dict[str, float],
    load_start: tuple[float, float, float],
    runtime: float,
) -> dict[str, Any]:
    return {
        "nodes": args.nodes,
        "workers": args.workers,
        "gpus_per_worker": GPUS,
        "b_jobs": args.b_jobs,
        "runs": args.runs,
        "fabric": {
            "leaf_nodes": shape.leaf_nodes,
            "spine_nodes": shape.spine_nodes,
            "clique_nodes": shape.clique_nodes,
            "spine": shape.spec(False),
            "cliques": shape.spec(True),
        },
        "summary": {k: summarise(v) for k, v in rows.items()},
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "setup": setup,
        "upstream_version": cluster.versions()["MPI_OPERATOR_VERSION"],
        "client_limits": rc.LIMITS,
        "trials": rows,
        "runtime_seconds": round(runtime, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1024, help="kwok 8-GPU nodes (1024)")
    parser.add_argument("--workers", type=int, default=1024, help="workload A's workers (1024)")
    parser.add_argument("--b-jobs", type=int, default=4, help="workload B's jobs (4)")
    parser.add_argument("--leaf-nodes", type=int, default=32, help="nodes per leaf (32)")
    parser.add_argument(
        "--spine-nodes", type=int, default=0, help="nodes per spine (default nodes / --b-jobs)"
    )
    parser.add_argument("--clique-nodes", type=int, default=9, help="nodes per clique (9)")
    parser.add_argument("--runs", type=int, default=3, help="rounds; medians reported (3)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed per trial")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("cliques", "reference", "b"),
        help="leave out the clique phase, the reference runs or workload B (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"results file ({OUT.name})")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    shape = Shape(
        args.nodes,
        min(args.leaf_nodes, args.nodes),
        args.spine_nodes or max(1, args.nodes // args.b_jobs),
        args.clique_nodes,
    )
    if args.workers > args.nodes:
        parser.error("workload A takes one node per worker: --workers must not exceed --nodes")
    if "reference" not in args.skip:
        rc.upstream_binary()
    LOGS.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    t_all = time.monotonic()
    say(f"starting the benchmark cluster in {cluster.state_dir()}")
    rc.run_cluster("down")  # a cluster left by an interrupted run still holds its objects
    rows: dict[str, list[dict[str, Any]]] = {}
    setup: dict[str, float] = {}
    try:
        t = time.monotonic()
        users = [a for op in OPERATORS for a in ("--user", f"bigjob-{op}")]
        rc.run_cluster(
            "up", "--nodes", str(args.nodes), "--topology", TOPOLOGY, "--gpus", str(GPUS),
            "--real-nodes", "0", "--no-dra", "--audit-log", *users,
        )  # fmt: skip
        kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org")
        setup["cluster_up_seconds"] = round(time.monotonic() - t, 1)
        run_phases(args, shape, rows, setup)
    finally:
        # Written even when a trial failed: what was measured up to it.
        result = report(args, shape, rows, setup, load_start, time.monotonic() - t_all)
        result["out"] = str(args.out)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        if not args.keep_cluster:
            rc.run_cluster("down")
            subprocess.run(["rm", "-rf", str(CLUSTER_DIR)], check=False)
    print_table(result)
    complete = all(
        n == s["runs"] for s in result["summary"].values() for n in s["reached"].values()
    )
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())

"""Topology-aware placement three ways on one cluster: ours, kube-scheduler's own, Kueue's.

Run as ``make bench-tas`` (``.venv/bin/python -m bench.native_tas``; ``--runs 1`` is a quick
run). It starts its own local cluster of the newest minor (``hack/cluster.py`` with
``MPIJOB_CLUSTER_DIR=.bench/tas-cluster``: the Workload API's gates on, Kueue running, the
simulated DRA driver, no real node) of ``--nodes`` (32) kwok nodes of the shipped ``dgx-h100``
topology, labelled into a fabric as ``bench/bigjob.py`` labels its clique phase: every node in
one zone, spines of 16 nodes (25 GB/s), leaves of 8 (50 GB/s), NVLink cliques of 4 (900 GB/s),
so each leaf holds two cliques.

The same MPIJobs (8-GPU workers, each asking for its workers within one fabric level) are
placed by:

* **ours**: ``mpijob.io/gpu-topology: "true"`` and ``mpijob.io/fabric-required-level``; the
  operator places the job (``--fabric``, ``--gpu-binding annotations``) and kube-scheduler binds
  it as one gang through the Workload API (``--gang-scheduling=workload-api``);
* **kube-scheduler**: ``mpijob.io/fabric-required-level`` only; the operator gives the PodGroup
  the level's node label as its topology constraint and kube-scheduler's topology-aware
  workload scheduling (``TopologyAwareWorkloadScheduling``) chooses the domain and the nodes;
* **kueue**: Kueue v(``KUEUE_VERSION``)'s topology-aware scheduling: a Topology of the same
  levels (and ``kubernetes.io/hostname``), a ResourceFlavor and ClusterQueue using it, the job
  queued with ``kueue.x-k8s.io/podset-required-topology`` on its workers; Kueue admits it,
  assigns each worker a node and ungates it; the operator runs without a gang backend.

A job of ours whose nodes share an NVLink clique gets a ComputeDomain, as on a GB200 rack: the
benchmark installs its CRD (``tests/data/computedomain-crd.yaml``), the channel DeviceClass and
each node's channel ResourceSlice (``hack/dra.py``), and answers each ComputeDomain with its
channel ResourceClaimTemplate as NVIDIA's controller would, within 0.1 s; that time is inside
ours' figure. kube-scheduler and Kueue make none: their jobs inside a clique would reach each
other over the network unless their users add one.

In two fills: every GPU **free**, and **fragmented** (the first node of each of the first six
cliques held whole by someone else's pod, so only the last leaf is empty). Each job runs alone on
the fill, timed from the start of its ``kubectl apply`` until every worker is bound, then
deleted; its figure of merit is its ring bottleneck (GB/s per direction: the slowest hop of a
ring through its nodes, or the 8-GPU ring inside a node) and the innermost level whose one
domain holds all its nodes. ``--runs`` (3) rounds; medians in the table and in
``.bench/native_tas.json``. Operator logs: ``.bench/logs/tas-*.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import bigjob
from bench import reconcile as rc
from hack import cluster, dra
from mpijob import keys
from mpijob.placement import fabric, fabric_labels, topologies
from mpijob.placement.tables import tables_for
from tests.support.jobs import mpijob

ROOT, BENCH = rc.ROOT, rc.BENCH
CLUSTER_DIR = BENCH / "tas-cluster"
os.environ["MPIJOB_CLUSTER_DIR"] = str(CLUSTER_DIR)  # read by hack.cluster at every call
OUT = BENCH / "native_tas.json"
LOGS = BENCH / "logs"

TOPOLOGY = "dgx-h100"
GPUS = 8
CONTENDERS = ("ours", "kube-scheduler", "kueue")
#: (job, workers, the fabric level that must hold them)
JOBS = (("a", 4, "leaf"), ("b", 2, "leaf"), ("c", 3, "leaf"), ("d", 8, "block"))
QUEUE = "bench-tas"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
HOSTNAME = "kubernetes.io/hostname"


def say(msg: str) -> None:
    print(f"[tas] {msg}", file=sys.stderr, flush=True)


def kubectl(*args: str, input: str | None = None) -> str:
    return rc.kubectl(*args, input=input)


# --- the cluster's fabric, fills and Kueue's topology -------------------------------------------


def held_nodes(shape: bigjob.Shape, fill: str) -> list[int]:
    """Nodes held whole in ``fill``: none, or the first of each clique but the last leaf's."""
    if fill == "free":
        return []
    last_leaf = shape.nodes - shape.leaf_nodes
    return list(range(0, last_leaf, shape.clique_nodes))


def hold(nodes: Sequence[int], namespace: str) -> None:
    """Someone else's pods, bound straight to their nodes, each taking all 8 GPUs: in the
    trial's namespace, the one the operator is started for (``--namespace``), so that ours sees
    them as kube-scheduler and Kueue do."""
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"holder-{i}",
                "namespace": namespace,
                "annotations": {keys.GPU_IDS: ",".join(map(str, range(GPUS)))},
            },
            "spec": {
                "nodeName": f"{cluster.NODE_PREFIX}{i}",
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "resources": {"limits": {keys.GPU_RESOURCE: str(GPUS)}},
                    }
                ],
            },
        }
        for i in nodes
    ]
    if pods:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
        kubectl("apply", "--server-side", "-f", "-", input=text)


def kueue_objects(shape: bigjob.Shape) -> list[dict[str, Any]]:
    """Kueue's Topology of the fabric's levels below the zone, a ResourceFlavor using it and a
    ClusterQueue with room for every GPU, so only the topology decides."""
    levels = [lv for lv in shape.spec(True)["levels"] if lv["name"] != "zone"]
    return [
        {
            "apiVersion": KUEUE_API,
            "kind": "Topology",
            "metadata": {"name": QUEUE},
            "spec": {
                "levels": [{"nodeLabel": lv["nodeLabel"]} for lv in levels]
                + [{"nodeLabel": HOSTNAME}]
            },
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "ResourceFlavor",
            "metadata": {"name": QUEUE},
            "spec": {"nodeLabels": {"mpijob.io/gpu-model": TOPOLOGY}, "topologyName": QUEUE},
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", keys.GPU_RESOURCE],
                        "flavors": [
                            {
                                "name": QUEUE,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100000"},
                                    {"name": "memory", "nominalQuota": "100000Ti"},
                                    {
                                        "name": keys.GPU_RESOURCE,
                                        "nominalQuota": str(shape.nodes * GPUS),
                                    },
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    ]


# --- the jobs -----------------------------------------------------------------------------------


def job(contender: str, name: str, workers: int, level: str, shape: bigjob.Shape) -> dict[str, Any]:
    """The same job as each contender is asked for it."""
    annotations: dict[str, str] = {}
    if contender in ("ours", "kube-scheduler"):
        annotations[keys.FABRIC_REQUIRED_LEVEL] = level
    if contender == "ours":
        annotations[keys.GPU_TOPOLOGY] = "true"
    body = mpijob(
        name,
        workers=workers,
        gpus=GPUS,
        annotations=annotations or None,
        spec={"slotsPerWorker": GPUS},
    )
    if contender == "kueue":
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
        label = next(lv["nodeLabel"] for lv in shape.spec(True)["levels"] if lv["name"] == level)
        for role, replica in body["spec"]["mpiReplicaSpecs"].items():
            template = replica["template"]
            meta = template.setdefault("metadata", {})
            extra = {KUEUE_REQUIRED: label} if role == "Worker" else {KUEUE_UNCONSTRAINED: "true"}
            meta["annotations"] = {**(meta.get("annotations") or {}), **extra}
            # Kueue assigns a PodSet a flavor by what it asks for: every pod asks for a CPU.
            container = template["spec"]["containers"][0]
            container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "1"
    return body


def workers_bound(namespace: str, name: str, workers: int) -> list[str] | None:
    """The workers' nodes by index once every one is bound; None before."""
    pods = json.loads(
        kubectl(
            "get", "pods", "-n", namespace, "-l",
            f"{keys.LABEL_JOB_NAME}={name},{keys.LABEL_JOB_ROLE}=worker", "-o", "json",
        )
    )["items"]  # fmt: skip
    nodes = {
        p["metadata"]["name"]: p["spec"].get("nodeName")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }
    wanted = [f"{name}-worker-{i}" for i in range(workers)]
    if all(nodes.get(w) for w in wanted):
        return [str(nodes[w]) for w in wanted]
    return None


def merit(fab: fabric.Fabric, shape: bigjob.Shape, nodes: Sequence[str]) -> tuple[float, str]:
    """The ring bottleneck (GB/s) of whole-node workers on ``nodes``, and the innermost level
    one of whose domains holds them all."""
    topo = topologies.for_node(TOPOLOGY, nodes[0])
    inside = float(tables_for(topo).best[GPUS][(1 << GPUS) - 1])
    if len(set(nodes)) == 1:
        return inside, "node"
    index = {f"{cluster.NODE_PREFIX}{i}": i for i in range(shape.nodes)}
    locations = [fab.location(shape.labels(index[n], True)) for n in nodes]
    depth = fabric.shared_depth(locations)
    return min(inside, fab.gbps_at(depth)), fab.level_at(depth)


def answer_compute_domains(namespace: str, answered: set[str]) -> None:
    """Each new ComputeDomain answered with its channel template, as NVIDIA's controller does."""
    domains = json.loads(kubectl("get", "computedomains", "-n", namespace, "-o", "json"))
    for domain in domains["items"]:
        uid = domain["metadata"]["uid"]
        if uid not in answered:
            text = json.dumps(dra.channel_template(domain))
            kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=text)
            answered.add(uid)


def imex_channels() -> None:
    """The ComputeDomain CRD, the channel DeviceClass and every node's channel slice."""
    kubectl("apply", "--server-side", "-f", str(ROOT / "tests/data/computedomain-crd.yaml"))
    kubectl("wait", "--for=condition=Established", "crd/computedomains.resource.nvidia.com")
    nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    items = [dra.channel_class()] + [
        dra.channel_slice(n["metadata"]["name"], n["metadata"]["uid"]) for n in nodes
    ]
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    kubectl("apply", "--server-side", "-f", "-", input=text)


def gone(namespace: str, name: str) -> bool:
    """Whether the job and every pod of it are gone."""
    pods = kubectl("get", "pods", "-n", namespace, "-l", f"{keys.LABEL_JOB_NAME}={name}", "-o=name")
    job = kubectl(
        "get", "mpijobs", "-n", namespace, f"--field-selector=metadata.name={name}", "-o=name"
    )
    return not pods.strip() and not job.strip()


def run_job(
    contender: str,
    namespace: str,
    spec: tuple[str, int, str],
    shape: bigjob.Shape,
    fab: fabric.Fabric,
    timeout: float,
) -> dict[str, Any]:
    name, workers, level = spec
    text = json.dumps(job(contender, name, workers, level, shape))
    t0 = time.monotonic()
    kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=text)
    nodes = None
    answered: set[str] = set()
    while nodes is None and time.monotonic() - t0 < timeout:
        if contender == "ours":
            answer_compute_domains(namespace, answered)
        nodes = workers_bound(namespace, name, workers)
        if nodes is None:
            time.sleep(0.1)
    seconds = round(time.monotonic() - t0, 2)
    row: dict[str, Any] = {"job": name, "workers": workers, "level": level}
    if nodes is None:
        row |= {"bound_seconds": None, "gbps": None, "within": None}
    else:
        gbps, within = merit(fab, shape, nodes)
        row |= {"bound_seconds": seconds, "gbps": gbps, "within": within, "nodes": nodes}
    kubectl("delete", "mpijob", name, "-n", namespace, "--wait=true")
    deadline = time.monotonic() + timeout
    while not gone(namespace, name) and time.monotonic() < deadline:
        time.sleep(0.2)
    return row


def trial(
    contender: str, fill: str, shape: bigjob.Shape, spec_path: Path, run: int, timeout: float
) -> list[dict[str, Any]]:
    namespace = f"tas-{contender}"
    kubectl("create", "namespace", namespace)
    hold(held_nodes(shape, fill), namespace)
    if contender == "kueue":
        local_queue = {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": namespace},
            "spec": {"clusterQueue": QUEUE},
        }
        kubectl("apply", "--server-side", "-f", "-", input=json.dumps(local_queue))
    flags = ["--fabric", str(spec_path), "--gpu-binding", "annotations"]
    if contender != "kueue":
        flags += ["--gang-scheduling", keys.WORKLOAD_GANG_FLAG]
    log_path = LOGS / f"tas-{contender}-{fill}-{run}.log"
    proc, _, _ = bigjob.start_operator("ours", namespace, flags, log_path)
    fab = fabric_labels.fabric_from_spec(json.loads(spec_path.read_text()))
    rows = []
    try:
        for spec in JOBS:
            row = run_job(contender, namespace, spec, shape, fab, timeout)
            row |= {"contender": contender, "fill": fill, "run": run}
            say(
                f"{contender} {fill} #{run} {spec[0]} ({spec[1]}x8 within a {spec[2]}): bound in "
                f"{row['bound_seconds']} s, {row['gbps']} GB/s within a {row['within']}"
            )
            rows.append(row)
    finally:
        rc.stop(proc)
        kubectl("delete", "namespace", namespace, "--wait=true", f"--timeout={timeout:.0f}s")
    return rows


# --- report -------------------------------------------------------------------------------------


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per (fill, job, contender): the medians over runs, and the levels seen."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = f"{row['fill']}/{row['job']}/{row['contender']}"
        out.setdefault(key, {"seconds": [], "gbps": [], "within": []})
        out[key]["seconds"].append(row["bound_seconds"])
        out[key]["gbps"].append(row["gbps"])
        out[key]["within"].append(row["within"])
    for entry in out.values():
        done = [s for s in entry["seconds"] if s is not None]
        rates = [g for g in entry["gbps"] if g is not None]
        entry["median_seconds"] = statistics.median(done) if done else None
        entry["median_gbps"] = statistics.median(rates) if rates else None
    return out


def print_table(summary: dict[str, dict[str, Any]]) -> None:
    print("| Fill | Job | " + " | ".join(CONTENDERS) + " |")
    print("|---|---|" + "---|" * len(CONTENDERS))
    fills = sorted({k.split("/")[0] for k in summary}, reverse=True)
    for fill in fills:
        for name, workers, level in JOBS:
            cells = []
            for contender in CONTENDERS:
                entry = summary.get(f"{fill}/{name}/{contender}")
                if entry is None or entry["median_seconds"] is None:
                    cells.append("not bound")
                    continue
                within = "/".join(sorted(set(map(str, entry["within"]))))
                gbps, seconds = entry["median_gbps"], entry["median_seconds"]
                cells.append(f"{gbps:.0f} GB/s in a {within}, {seconds:.1f} s")
            print(f"| {fill} | {name}: {workers}x8 in a {level} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=32, help="kwok 8-GPU nodes (32)")
    parser.add_argument("--runs", type=int, default=3, help="rounds; medians reported (3)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds allowed per job")
    parser.add_argument("--out", type=Path, default=OUT, help=f"results file ({OUT.name})")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    shape = bigjob.Shape(args.nodes, leaf_nodes=8, spine_nodes=16, clique_nodes=4)
    LOGS.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    t_all = time.monotonic()
    say(f"starting the benchmark cluster in {cluster.state_dir()}")
    rc.run_cluster("down")
    rows: list[dict[str, Any]] = []
    try:
        users = [a for c in CONTENDERS for a in ("--user", f"tas-{c}")]
        rc.run_cluster(
            "up", "--nodes", str(args.nodes), "--topology", TOPOLOGY, "--gpus", str(GPUS),
            "--real-nodes", "0", "--kueue", *users,
        )  # fmt: skip
        kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "crd/mpijobs.kubeflow.org")
        bigjob.label_nodes(shape, cliques=True)
        imex_channels()
        spec_path = BENCH / "tas-fabric.json"
        spec_path.write_text(json.dumps(shape.spec(True), indent=2) + "\n")
        kubectl(
            "apply", "--server-side", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": kueue_objects(shape)}),
        )  # fmt: skip
        for run in range(1, args.runs + 1):
            for fill in ("free", "fragmented"):
                for contender in CONTENDERS:
                    rows += trial(contender, fill, shape, spec_path, run, args.timeout)
    finally:
        summary = summarise(rows)
        result = {
            "nodes": args.nodes,
            "runs": args.runs,
            "jobs": JOBS,
            "fabric": shape.spec(True),
            "kube_version": cluster.versions()["KUBE_VERSION"],
            "kueue_version": cluster.versions()["KUEUE_VERSION"],
            "summary": summary,
            "trials": rows,
            "load_average": {"start": load_start, "end": os.getloadavg()},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "runtime_seconds": round(time.monotonic() - t_all, 1),
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        if not args.keep_cluster:
            rc.run_cluster("down")
            subprocess.run(["rm", "-rf", str(CLUSTER_DIR)], check=False)
    print_table(summary)
    return 0 if all(r["bound_seconds"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

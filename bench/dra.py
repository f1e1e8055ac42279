#!/usr/bin/env python3
"""What the dra GPU binding costs: 100 topology MPIJobs x 8 workers, annotations against dra.

Run as ``make bench-dra`` (``.venv/bin/python -m bench.dra``; ``--help`` for the knobs). It
starts its own local cluster (``MPIJOB_CLUSTER_DIR=.bench/cluster-dra``, ``--nodes`` simulated
DGX-1 V100 nodes with the simulated NVIDIA DRA driver), so the test cluster is never touched.

Each run, one mode after the other, ``--runs`` times: start our operator scoped to a fresh
namespace with ``--gpu-binding=<mode>`` and the same client limits (QPS 100, burst 200,
threadiness 8); create the jobs (8 workers x 1 GPU each, ``mpijob.io/gpu-topology: "true"``, so
each job takes one whole node); time until every worker pod is bound to a node (in dra mode the
scheduler binds a pod only after it allocated its claim, so bound means allocated); read the
operator's own request counter (``mpi_operator_api_requests_total``, by verb) from its
/metrics, and its CPU time (user + system, from its start and at its start) and peak RSS from
/proc; stop it, delete the namespace and wait until its pods and claims are gone.

Prints per mode the seconds, API requests per job, CPU and peak RSS, and what dra adds; writes
``.bench/dra.json``. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, config

from bench import ours_env
from bench import reconcile as rc
from hack import cluster
from hack.common import free_port
from tests.support.jobs import mpijob  # the tests' job factory, the shape users write

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_DIR = ROOT / ".bench" / "cluster-dra"

LIMITS = ["--kube-api-qps", "100", "--kube-api-burst", "200", "--threadiness", "8"]
MODES = ("annotations", "dra")


def requests_by_verb(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("mpi_operator_api_requests_total{"):
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] = float(line.rsplit(" ", 1)[1])
    return out


def wait_bound(core: client.CoreV1Api, ns: str, workers: int, deadline: float) -> int:
    """How many of the namespace's workers are bound to a node, once all are or at
    ``deadline`` (monotonic)."""
    bound = 0
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            ns, label_selector="training.kubeflow.org/job-role=worker"
        ).items
        bound = sum(1 for p in pods if p.spec.node_name)
        if bound == workers:
            break
        time.sleep(0.5)
    return bound


def run(mode: str, index: int, args: argparse.Namespace, kubeconfig: Path) -> dict[str, Any]:
    core, objects = client.CoreV1Api(), client.CustomObjectsApi()
    ns = f"bench-dra-{mode}-{index}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    port = free_port()
    log = (CLUSTER_DIR / "logs" / f"operator-{ns}.log").open("wb")
    argv = [sys.executable, "-m", "mpijob", "run", "-n", ns, "--no-leader-elect"]
    argv += ["--monitoring-port", str(port), "--health-port", "0", "--kubeconfig", str(kubeconfig)]
    argv += ["--gpu-binding", mode, *LIMITS]
    operator = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ours_env())
    workers = args.jobs * args.workers
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests_by_verb(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{mode}: the operator did not start") from None
                time.sleep(0.2)
        time.sleep(2)  # its watches are listed
        before = sum(requests_by_verb(port).values())
        started_cpu = rc.proc_usage(operator.pid)["cpu_seconds"]
        start = time.monotonic()
        for i in range(args.jobs):
            body = mpijob(
                f"job-{i:03d}",
                workers=args.workers,
                gpus=1,
                annotations={"mpijob.io/gpu-topology": "true"},
            )
            objects.create_namespaced_custom_object("kubeflow.org", "v2beta1", ns, "mpijobs", body)
        bound = wait_bound(core, ns, workers, start + args.timeout)
        seconds = time.monotonic() - start
        if bound != workers:
            raise SystemExit(f"{mode}: {bound} of {workers} workers bound in {args.timeout} s")
        time.sleep(3)  # writes still in flight at the last bind (status) are counted too
        verbs = requests_by_verb(port)
        usage = rc.proc_usage(operator.pid)
        total = sum(verbs.values()) - before
        return {
            "seconds": round(seconds, 1),
            "operator_cpu_seconds": round(usage["cpu_seconds"], 2),
            "start_up_cpu_seconds": round(started_cpu, 2),
            "peak_rss_mb": round(usage["peak_rss_mb"]),
            "api_requests": total,
            "api_requests_per_job": round(total / args.jobs, 2),
            "by_verb": verbs,
        }
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        core.delete_namespace(ns)
        listing = ["get", "resourceclaims,pods", "-n", ns, "-o", "name"]
        while True:
            left = subprocess.run(
                [str(kubectl_path()), "--kubeconfig", str(kubeconfig), *listing],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            if not left:
                break
            time.sleep(1)


def kubectl_path() -> Path:
    return Path(cluster.binaries()["kubectl"])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=100, help="simulated 8-GPU nodes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    env = {**os.environ, "MPIJOB_CLUSTER_DIR": str(CLUSTER_DIR)}
    up = [sys.executable, "-m", "hack.cluster", "up", "--nodes", str(args.nodes)]
    up += ["--real-nodes", "0"]  # simulated nodes only
    subprocess.run(up, cwd=ROOT, check=True, env=env)
    kubeconfig = CLUSTER_DIR / "kubeconfig"
    kubectl = [str(kubectl_path()), "--kubeconfig", str(kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(ROOT / "crds")], check=True)
    crds = ["crd/mpijobs.kubeflow.org", "crd/placementdecisions.mpijob.io"]
    subprocess.run([*kubectl, "wait", "--for=condition=Established", *crds], check=True)
    config.load_kube_config(config_file=str(kubeconfig))
    results: dict[str, Any] = {"jobs": args.jobs, "workers": args.workers, "nodes": args.nodes}
    try:
        for index in range(args.runs):
            for mode in MODES:
                row = run(mode, index, args, kubeconfig)
                results.setdefault(mode, []).append(row)
                print(
                    f"run {index + 1} {mode:12} {row['seconds']:6.1f} s to all "
                    f"{args.jobs * args.workers} workers bound, "
                    f"{row['api_requests_per_job']:.2f} API requests per job, operator CPU "
                    f"{row['operator_cpu_seconds']:.2f} s ({row['start_up_cpu_seconds']:.2f} s "
                    f"to start), peak RSS {row['peak_rss_mb']} MiB",
                    flush=True,
                )
    finally:
        if not args.keep:
            down = [sys.executable, "-m", "hack.cluster", "down"]
            subprocess.run(down, cwd=ROOT, check=True, env=env)
    summary = {}
    for mode in MODES:
        rows = results[mode]
        summary[mode] = {
            "median_seconds": statistics.median(r["seconds"] for r in rows),
            "median_api_requests_per_job": statistics.median(
                r["api_requests_per_job"] for r in rows
            ),
            "median_operator_cpu_seconds": statistics.median(
                r["operator_cpu_seconds"] for r in rows
            ),
            "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rows),
        }
    extra_seconds = summary["dra"]["median_seconds"] - summary["annotations"]["median_seconds"]
    extra_requests = (
        summary["dra"]["median_api_requests_per_job"]
        - summary["annotations"]["median_api_requests_per_job"]
    )
    results["summary"] = summary
    results["dra_adds"] = {
        "seconds_per_job": round(extra_seconds / args.jobs, 3),
        "seconds_total": round(extra_seconds, 1),
        "api_requests_per_job": round(extra_requests, 2),
        "operator_cpu_seconds": round(
            summary["dra"]["median_operator_cpu_seconds"]
            - summary["annotations"]["median_operator_cpu_seconds"],
            2,
        ),
    }
    out = ROOT / ".bench" / "dra.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"dra adds, per job: {results['dra_adds']}; wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

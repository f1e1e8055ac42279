#!/usr/bin/env python3
"""Training benchmark: img/s of examples/pytorch-cpu.yaml at 1, 2 and 4 workers on the real nodes.

Runs on the local cluster (``make bench-train`` starts it, with REAL_NODES=2 by default), with an
operator of its own watching namespace ``bench-train``. Each run is the example's job with that
many workers and ranks (one rank per worker, each worker limited to one CPU, spread over the real
nodes) and the benchmark's figure is what rank 0 prints: ``Total img/sec on N CPU(s)``. Three runs
per size; the median is reported, with the scaling efficiency against 1 worker
(total / (N x single)). The workers share the machine's cores with each other and with anything
else running, so the figures say what this machine gives, not what a cluster would. Writes
.bench/train.json. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from bench import realnodes
from hack import cluster, pytorch_image

ROOT = Path(__file__).resolve().parents[1]

NAMESPACE = "bench-train"
EXAMPLE = ROOT / "examples" / "pytorch-cpu.yaml"
TOTAL = re.compile(r"^Total img/sec on (\d+) CPU\(s\): ([\d.]+)", re.M)
TIMEOUT = 600
API = ("kubeflow.org", "v2beta1", NAMESPACE, "mpijobs")


def launcher_log(core: client.CoreV1Api, name: str) -> str:
    selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=launcher"
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    newest = max(pods, key=lambda p: p.metadata.creation_timestamp)
    return str(core.read_namespaced_pod_log(newest.metadata.name, NAMESPACE))


def one_run(core: client.CoreV1Api, api: client.CustomObjectsApi, workers: int, i: int) -> float:
    job = pytorch_image.on_real_nodes(yaml.safe_load(EXAMPLE.read_text()), workers=workers)
    name = f"train-{workers}-{i}"
    job["metadata"]["name"] = name
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for tsc in spec["template"]["spec"].get("topologySpreadConstraints", []):
            tsc["labelSelector"]["matchLabels"]["training.kubeflow.org/job-name"] = name
    api.create_namespaced_custom_object(*API, job)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        status = api.get_namespaced_custom_object(*API, name).get("status") or {}
        true = {c["type"] for c in status.get("conditions") or [] if c["status"] == "True"}
        if "Succeeded" in true or "Failed" in true:
            break
        time.sleep(1)
    log = launcher_log(core, name)
    api.delete_namespaced_custom_object(*API, name)
    found = TOTAL.findall(log)
    if "Succeeded" not in true or not found or int(found[0][0]) != workers:
        raise SystemExit(f"{name} did not finish with a figure (conditions {sorted(true)}):\n{log}")
    return float(found[0][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    kubeconfig = cluster.state_dir() / "kubeconfig"
    config.load_kube_config(config_file=str(kubeconfig))
    core, api = client.CoreV1Api(), client.CustomObjectsApi()
    nodes = [
        n.metadata.name
        for n in core.list_node(label_selector="mpijob.io/real-node=true").items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    ]
    if not nodes:
        raise SystemExit("no Ready real node: start the cluster with REAL_NODES=2 (make cluster)")
    results: dict[str, Any] = {"real_nodes": nodes, "runs": args.runs, "model": "convnet"}
    with realnodes.operator(core, NAMESPACE):
        single = None
        for workers in args.workers:
            samples = [one_run(core, api, workers, i) for i in range(args.runs)]
            median = statistics.median(samples)
            single = median if workers == 1 else single
            eff = f", {100 * median / (workers * single):.0f}% of linear" if single else ""
            results[str(workers)] = {"img_per_sec": samples, "median": median}
            print(
                f"{workers} worker(s) on {len(nodes)} real node(s): "
                f"{', '.join(f'{s:.1f}' for s in samples)} img/s (median {median:.1f}{eff})",
                flush=True,
            )
    realnodes.write("train", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Gang benchmark: seconds from submitting a 16-worker MPIJob until all of its pods are bound.

Measured on its own local cluster (4 simulated DGX-1 V100 nodes, 32 GPUs), twice per mode, for:
- ``coscheduling``: our operator with ``--gang-scheduling=default-scheduler``, binding done by the
  real scheduler-plugins Coscheduling scheduler (PodGroup minMember 17);
- ``admission``: our own all-or-nothing admission with topology-aware placement (no gang
  scheduler): the operator admits the whole job, then the default profile binds the pods.

Each worker asks for 1 GPU. The clock starts just before the MPIJob is created and stops when
the launcher pod and all 16 workers have a node (``spec.nodeName``), polled every 0.1 s, so each
figure is within 0.1 s. Writes .bench/gang.json. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from hack import cluster as local
from tests.support.jobs import mpijob  # the tests' job factory, the shape users write

ROOT = Path(__file__).resolve().parents[1]

WORKERS = 16
RUNS = 3
CLUSTER_DIR = ROOT / ".bench" / "cluster-gang"
MODES = {
    "coscheduling": (["--gang-scheduling", "default-scheduler"], {}),
    "admission": ([], {"mpijob.io/gpu-topology": "true"}),
}


def sh(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(args, cwd=ROOT, check=True, env={**os.environ, **(env or {})})


def all_bound(core: client.CoreV1Api, ns: str, name: str) -> bool:
    pods = core.list_namespaced_pod(ns, label_selector=f"training.kubeflow.org/job-name={name}")
    return len(pods.items) >= WORKERS + 1 and all(p.spec.node_name for p in pods.items)


def run(mode: str, index: int, kubeconfig: Path) -> float:
    flags, annotations = MODES[mode]
    core, objects = client.CoreV1Api(), client.CustomObjectsApi()
    ns = f"bench-{mode}-{index}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    log = (CLUSTER_DIR / "logs" / f"operator-{ns}.log").open("wb")
    operator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpijob",
            "run",
            "-n",
            ns,
            "--no-leader-elect",
            "--monitoring-port",
            "0",
            "--health-port",
            "0",
            "--kube-api-qps",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(3)  # the operator's watches are up (it lists before it watches)
        job = mpijob("gang", workers=WORKERS, gpus=1, annotations=annotations)
        start = time.monotonic()
        objects.create_namespaced_custom_object("kubeflow.org", "v2beta1", ns, "mpijobs", job)
        while time.monotonic() - start < 180:
            if all_bound(core, ns, "gang"):
                return time.monotonic() - start
            time.sleep(0.1)
        raise SystemExit(f"{mode} run {index}: not all pods bound within 180 s")
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        core.delete_namespace(ns)
        while any(p.metadata.namespace == ns for p in core.list_pod_for_all_namespaces().items):
            time.sleep(0.5)


def main() -> int:
    env = {"MPIJOB_CLUSTER_DIR": str(CLUSTER_DIR)}
    sh(
        sys.executable,
        "-m",
        "hack.cluster",
        "up",
        "--nodes",
        "4",
        "--real-nodes",
        "0",
        env=env,
    )
    kubeconfig = CLUSTER_DIR / "kubeconfig"
    config.load_kube_config(config_file=str(kubeconfig))
    kubectl = str(local.binaries()["kubectl"])
    sh(kubectl, "--kubeconfig", str(kubeconfig), "apply", "--server-side", "-f", str(ROOT / "crds"))
    sh(
        kubectl,
        "--kubeconfig",
        str(kubeconfig),
        "wait",
        "--for=condition=Established",
        "crd/mpijobs.kubeflow.org",
    )
    results: dict[str, Any] = {"workers": WORKERS, "runs": RUNS, "nodes": 4}
    try:
        for mode in MODES:
            samples = [run(mode, i, kubeconfig) for i in range(RUNS)]
            results[mode] = {"seconds": samples, "median_seconds": statistics.median(samples)}
            print(
                f"{mode:13} submission -> all {WORKERS + 1} pods bound: "
                f"{', '.join(f'{s:.1f}' for s in samples)} s "
                f"(median {statistics.median(samples):.1f} s)"
            )
    finally:
        sh(sys.executable, "-m", "hack.cluster", "down", env=env)
    out = ROOT / ".bench" / "gang.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

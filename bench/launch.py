#!/usr/bin/env python3
"""Launch benchmark: from the launcher's start to every rank running, over ssh and sshd against
the operator's launch agent, with 2 and 16 workers on the real nodes.

Runs on the local cluster (``make bench-launch`` starts it), with an operator of its own watching
namespace ``bench-launch`` and given the operator's image (hack/operator_image.py, imported into
the real nodes) as its launch image. Each run is one Open MPI 5 job of N workers, one slot each,
with ``launcherCreationPolicy: WaitForWorkersReady``, so the launcher starts once every worker is
Ready and what is timed is the launch alone: the launcher prints the time, then ``mpirun -n N``
runs ``date`` as each rank, which prints the time it started. The figure is the last rank's time
minus the launcher's (both clocks are this machine's). ``sshd``: upstream's wiring, the
``mpi-pi:openmpi`` image, sshd on 2222 with a readiness probe on it; ``agent``:
``mpijob.io/launch: agent`` and the same image without sshd (``mpi-pi-nosshd:openmpi``). The
median of ``--runs`` (5) per mode and size is reported. The pods share this machine's cores with
each other and with anything else running. Writes .bench/launch.json. A benchmark, not a test:
it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from kubernetes import client, config

from bench import realnodes
from hack import cluster, images, incluster, realnode

NAMESPACE = "bench-launch"
TIMEOUT = 600
API = ("kubeflow.org", "v2beta1", NAMESPACE, "mpijobs")
#: What each pod asks for: 16 workers and a launcher fit two real nodes of this machine's cores.
RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
STAMP = "date +%s.%N"


def job(name: str, mode: str, workers: int) -> dict[str, Any]:
    agent = mode == "agent"
    image = images.reference("openmpi-nosshd" if agent else "openmpi")
    security = {"runAsUser": 1000, "runAsGroup": 1000}
    worker: dict[str, Any] = {"name": "worker", "image": image, "resources": RESOURCES}
    if not agent:
        worker["command"] = ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
        worker["readinessProbe"] = {"tcpSocket": {"port": 2222}, "periodSeconds": 2}
    script = f'echo "launcher $({STAMP})"; mpirun -n {workers} sh -c \'echo "rank $({STAMP})"\''
    launcher = {
        "name": "launcher",
        "image": image,
        "command": ["sh", "-c", script],
        "resources": RESOURCES,
    }
    body: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "sshAuthMountPath": "/home/mpiuser/.ssh",
            "runPolicy": {"cleanPodPolicy": "All"},
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "template": {"spec": {"securityContext": security, "containers": [launcher]}},
                },
                "Worker": {
                    "replicas": workers,
                    "template": {"spec": {"securityContext": security, "containers": [worker]}},
                },
            },
        },
    }
    if agent:
        body["metadata"]["annotations"] = {"mpijob.io/launch": "agent"}
    placed = realnode.place_on_real_node(body, cpu="1")
    for spec in placed["spec"]["mpiReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c["resources"] = RESOURCES  # place_on_real_node's limits are for real work
    return placed


def launcher_log(core: client.CoreV1Api, name: str) -> str:
    selector = f"training.kubeflow.org/job-name={name},training.kubeflow.org/job-role=launcher"
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    newest = max(pods, key=lambda p: p.metadata.creation_timestamp)
    return str(core.read_namespaced_pod_log(newest.metadata.name, NAMESPACE))


def one_run(
    core: client.CoreV1Api, api: client.CustomObjectsApi, mode: str, workers: int, i: int
) -> float:
    name = f"launch-{mode}-{workers}-{i}"
    api.create_namespaced_custom_object(*API, job(name, mode, workers))
    deadline = time.monotonic() + TIMEOUT
    true: set[str] = set()
    while time.monotonic() < deadline:
        status = api.get_namespaced_custom_object(*API, name).get("status") or {}
        true = {c["type"] for c in status.get("conditions") or [] if c["status"] == "True"}
        if "Succeeded" in true or "Failed" in true:
            break
        time.sleep(1)
    log = launcher_log(core, name)
    api.delete_namespaced_custom_object(*API, name)
    stamps = [line.split() for line in log.splitlines() if line.startswith(("launcher ", "rank "))]
    start = [float(s[1]) for s in stamps if s[0] == "launcher"]
    ranks = [float(s[1]) for s in stamps if s[0] == "rank"]
    if "Succeeded" not in true or len(start) != 1 or len(ranks) != workers:
        raise SystemExit(
            f"{name} did not finish with its stamps (conditions {sorted(true)}):\n{log}"
        )
    # Let the job's pods go before the next one, so each run starts on an idle node.
    while core.list_namespaced_pod(
        NAMESPACE, label_selector=f"training.kubeflow.org/job-name={name}"
    ).items:
        time.sleep(1)
    return max(ranks) - start[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", nargs="+", default=["sshd", "agent"])
    args = parser.parse_args()
    kubeconfig = cluster.state_dir() / "kubeconfig"
    config.load_kube_config(config_file=str(kubeconfig))
    core, api = client.CoreV1Api(), client.CustomObjectsApi()
    image = incluster.load_image(incluster.nodes())
    results: dict[str, Any] = {"runs": args.runs, "launch_image": image}
    with realnodes.operator(core, NAMESPACE, "--launch-image", image):
        for workers in args.workers:
            for mode in args.modes:
                samples = [one_run(core, api, mode, workers, i) for i in range(args.runs)]
                median = statistics.median(samples)
                results[f"{mode}-{workers}"] = {"seconds": samples, "median": median}
                print(
                    f"{mode:6} {workers:3} workers: "
                    f"{', '.join(f'{s:.2f}' for s in samples)} s (median {median:.2f} s)",
                    flush=True,
                )
    realnodes.write("launch", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""``make demo``: the operator on the local cluster, running a topology-aware MPIJob to Succeeded.

Expects the cluster up and the CRD installed (the Makefile does both). Starts the operator in the
background, watching namespace ``demo`` only (log: .cluster/logs/operator.log; stopped by
``make cluster-down``), applies examples/pytorch-vgg16-topology.yaml in that namespace with the
launcher told to finish after a while (the simulated cluster runs no containers), and prints the
job and its pods as they progress; when the workers' GPUs are pinned by DRA claims, each worker's
line also shows the devices the scheduler allocated to its claim. When a real node is up
(hack/realnode.py), it then runs upstream's OpenMPI pi example there for real and prints the
launcher's log, and ends with data-parallel PyTorch training (examples/pytorch-cpu.yaml, image
hack/pytorch_image.py) with its 2 workers on the 2 real nodes, printing the benchmark's img/s lines
and each rank's parameter checksum. Running it again replaces the demo jobs.

With ``IN_CLUSTER=1`` the operator runs in-cluster instead: its image on the real node, installed
by the standalone overlay (hack/incluster.py; ``make undeploy-local`` removes it).

The operator is scoped so that it never reconciles anyone else's jobs on the shared cluster: the
integration tests run their own operator per test namespace, and refuse to start beside one that
watches all namespaces (hack/stray_operators.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from hack import cluster, incluster, pytorch_image, realnode, stray_operators
from mpijob import keys
from mpijob.desired.claims import allocated_devices

ROOT = Path(__file__).resolve().parents[1]

NAMESPACE = "demo"
# IN_CLUSTER=1: the operator from its image, installed by the standalone overlay on the real
# node (hack/incluster.py), instead of a process of this machine.
IN_CLUSTER = os.environ.get("IN_CLUSTER", "") == "1"
EXAMPLE = ROOT / "examples" / "pytorch-vgg16-topology.yaml"
REAL_EXAMPLE = ROOT / "examples" / "pi.yaml"
TRAIN_EXAMPLE = ROOT / "examples" / "pytorch-cpu.yaml"
RUN_SECONDS = "20s"
TIMEOUT = 180
BOLD, DIM, GREEN, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[0m") if sys.stdout.isatty() else ("", "", "", "")
)


#: The demo operator's /metrics: not 8080, the operator's default, which upstream's binary takes
#: for its health server whatever its flags say (``make bench`` runs it after the demo).
MONITORING_PORT = 8090
#: The demo operator's liveness probe (Kopf's): beside its /metrics, not the default 8081.
HEALTH_PORT = 8091


def start_operator(kubeconfig: Path) -> int:
    pid_file = cluster.state_dir() / "operator.pid"
    if pid_file.exists() and cluster.alive(pid := int(pid_file.read_text().strip() or 0)):
        watched = stray_operators.watched_namespaces(pid)
        if watched == [NAMESPACE]:
            return pid
        if watched is not None:
            # Left by an older `make demo`, which watched every namespace; it also holds port 8080.
            print(
                f"Stopping the earlier demo operator (pid {pid}): it is not scoped to {NAMESPACE}"
            )
            cluster.stop_demo_operator()
            deadline = time.monotonic() + 15
            while cluster.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if cluster.alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
    log = cluster.state_dir() / "logs" / "operator.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpijob",
                "run",
                "--no-leader-elect",
                "--namespace",
                NAMESPACE,
                "--monitoring-port",
                str(MONITORING_PORT),
                "--health-port",
                str(HEALTH_PORT),
                "--kubeconfig",
                str(kubeconfig),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    return proc.pid


def run_operator(core: client.CoreV1Api, kubeconfig: Path) -> str:
    """Starts the operator (a process here, or in-cluster); how to read its metrics."""
    if not IN_CLUSTER:
        pid = start_operator(kubeconfig)
        print(
            f"{BOLD}Operator{RESET} running (pid {pid}), watching namespace {NAMESPACE} only; "
            "log: .cluster/logs/operator.log"
        )
        return f"curl -s localhost:{MONITORING_PORT}/metrics | grep mpi_operator"
    cluster.stop_demo_operator()
    install = incluster.deploy("standalone", namespaces=(NAMESPACE,))
    print(
        f"{BOLD}Operator{RESET} running in-cluster (deployment/{install.deployment} in "
        f"namespace {install.namespace}, image {install.image}, on the real node), watching "
        f"namespace {NAMESPACE} only; log: kubectl logs deployment/{install.deployment} "
        f"-n {install.namespace}"
    )
    pod = core.list_namespaced_pod(
        install.namespace, label_selector="app.kubernetes.io/component=operator"
    ).items[0]
    return f"curl -s {pod.status.pod_ip}:8080/metrics | grep mpi_operator"


def demo_job() -> dict[str, Any]:
    job = yaml.safe_load(EXAMPLE.read_text())
    template = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[
        "mpijob.io/sim-succeed-after"
    ] = RUN_SECONDS
    return job


def conditions(job: dict[str, Any]) -> str:
    true = [
        c["type"]
        for c in (job.get("status") or {}).get("conditions") or []
        if c["status"] == "True"
    ]
    return ",".join(true) or "-"


def job_claims(name: str) -> dict[str, dict[str, Any]]:
    """The job's ResourceClaims by name; none where the API server serves no DRA."""
    group, version = keys.DRA_API_VERSION.split("/")
    try:
        result = client.CustomObjectsApi().list_namespaced_custom_object(
            group,
            version,
            NAMESPACE,
            "resourceclaims",
            label_selector=f"{keys.LABEL_JOB_NAME}={name}",
        )
    except client.ApiException as e:
        if e.status == 404:
            return {}
        raise
    return {c["metadata"]["name"]: c for c in result.get("items", [])}


def pods_table(core: client.CoreV1Api, name: str) -> list[str]:
    pods = sorted(
        core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.LABEL_JOB_NAME}={name}").items,
        key=lambda p: p.metadata.name,
    )
    claimed = any(keys.GPU_CLAIM in (p.metadata.annotations or {}) for p in pods)
    claims = job_claims(name) if claimed else {}
    rows = []
    for p in pods:
        annotations = p.metadata.annotations or {}
        gpus = annotations.get(keys.GPU_IDS, "")
        claim_name = annotations.get(keys.GPU_CLAIM)
        allocated = ""
        if claim_name:
            devices = [device for _, device in allocated_devices(claims.get(claim_name, {}))]
            allocated = f"  claim {claim_name}: " + (
                ",".join(devices) + " allocated" if devices else "not allocated yet"
            )
        rows.append(
            f"  {p.metadata.name:42} {p.status.phase:10} {p.spec.node_name or '-':12} "
            f"{('GPUs ' + gpus) if gpus else ''}{allocated}"
        )
    return rows


def main() -> int:
    kubeconfig = cluster.state_dir() / "kubeconfig"
    config.load_kube_config(config_file=str(kubeconfig))
    core = client.CoreV1Api()
    mpijobs = client.CustomObjectsApi()
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    except client.ApiException as e:
        if e.status != 409:
            raise
    metrics_hint = run_operator(core, kubeconfig)
    job = demo_job()
    name = job["metadata"]["name"]
    args = ("kubeflow.org", "v2beta1", NAMESPACE, "mpijobs")
    try:
        mpijobs.delete_namespaced_custom_object(*args, name)
        while pods_table(core, name) or _exists(mpijobs, args, name):
            time.sleep(0.5)
    except client.ApiException as e:
        if e.status != 404:
            raise
    mpijobs.create_namespaced_custom_object(*args, job)
    print(
        f"{BOLD}Applied{RESET} {EXAMPLE.relative_to(ROOT)} in namespace {NAMESPACE} "
        f"(the launcher finishes {RUN_SECONDS} after it starts)\n"
    )

    shown: tuple[str, tuple[str, ...]] | None = None
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        current = mpijobs.get_namespaced_custom_object(*args, name)
        state = conditions(current)
        rows = tuple(pods_table(core, name))
        if (state, rows) != shown:
            shown = (state, rows)
            print(
                f"{DIM}{time.strftime('%H:%M:%S')}{RESET} {BOLD}{name}{RESET} conditions: {state}"
            )
            placement = (current["metadata"].get("annotations") or {}).get("mpijob.io/placement")
            if placement:
                print(f"  placement: {placement}")
            print("\n".join(rows) or "  (no pods)")
        if "Succeeded" in state.split(","):
            print(f"\n{GREEN}{BOLD}{name} Succeeded.{RESET}")
            break
        if "Failed" in state.split(","):
            print(f"\n{name} Failed; see .cluster/logs/operator.log")
            return 1
        time.sleep(0.5)
    else:
        print(f"\n{name} did not finish within {TIMEOUT}s; see the operator's log")
        return 1

    if run_on_real_nodes(core, mpijobs, args) != 0:
        return 1

    kc = f"KUBECONFIG={kubeconfig}"
    print(f"""
Look around:
  export {kc}
  {cluster.binaries()["kubectl"]} get mpijobs,pods,jobs -n {NAMESPACE}
  .venv/bin/mpijob get {name} -n {NAMESPACE}
  .venv/bin/mpijob topology gpu-node-0
  {metrics_hint}
The operator keeps running, for namespace {NAMESPACE} only. Stop everything: make cluster-down""")
    return 0


def run_on_real_nodes(
    core: client.CoreV1Api, api: client.CustomObjectsApi, args: tuple[str, ...]
) -> int:
    """pi, then the training job, on the real nodes where there are any."""
    ready = real_nodes_ready(core)
    if not ready:
        print(f"\n{DIM}No real node is up (REAL_NODES=0?): no real MPI run.{RESET}")
        return 0
    pi = realnode.place_on_real_node(yaml.safe_load(REAL_EXAMPLE.read_text()))
    if run_real(core, api, args, pi, REAL_EXAMPLE, "mpioperator/mpi-pi:openmpi") != 0:
        return 1
    train = pytorch_image.on_real_nodes(yaml.safe_load(TRAIN_EXAMPLE.read_text()))
    if run_real(core, api, args, train, TRAIN_EXAMPLE, pytorch_image.REFERENCE) != 0:
        return 1
    if len(ready) < 2:
        print(f"{DIM}One real node (REAL_NODES=1): both workers ran on it.{RESET}")
    return 0


def real_nodes_ready(core: client.CoreV1Api) -> list[str]:
    return [
        node.metadata.name
        for node in core.list_node(label_selector=f"{realnode.ROLE}=true").items
        if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    ]


def run_real(
    core: client.CoreV1Api,
    api: client.CustomObjectsApi,
    args: tuple[str, ...],
    job: dict[str, Any],
    example: Path,
    image: str,
) -> int:
    """An example on the real nodes: real mpirun, real ranks; where they ran and the log."""
    name = job["metadata"]["name"]
    with contextlib.suppress(client.ApiException):
        api.delete_namespaced_custom_object(*args, name)
    while (
        _exists(api, args, name)
        or core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.LABEL_JOB_NAME}={name}").items
    ):
        time.sleep(0.5)
    api.create_namespaced_custom_object(*args, job)
    print(
        f"\n{BOLD}Applied{RESET} {example.relative_to(ROOT)} on the real nodes "
        f"(kubelet, containerd, runc), image {image}"
    )
    deadline = time.monotonic() + TIMEOUT
    state = "-"
    # Where the workers ran, seen while they run (cleanPodPolicy Running deletes them at the end).
    placed: dict[str, str] = {}
    selector = f"{keys.LABEL_JOB_NAME}={name},{keys.LABEL_JOB_ROLE}=worker"
    while time.monotonic() < deadline:
        state = conditions(api.get_namespaced_custom_object(*args, name))
        for p in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items:
            if p.spec.node_name:
                placed[p.metadata.name] = p.spec.node_name
        if "Succeeded" in state.split(",") or "Failed" in state.split(","):
            break
        time.sleep(0.5)
    launchers = sorted(
        core.list_namespaced_pod(
            NAMESPACE, label_selector=f"{keys.LABEL_JOB_NAME}={name},{keys.LABEL_JOB_ROLE}=launcher"
        ).items,
        key=lambda p: p.metadata.creation_timestamp,
    )
    for worker, node in sorted(placed.items()):
        print(f"  {worker:42} on {node}")
    if launchers:
        log = core.read_namespaced_pod_log(launchers[-1].metadata.name, NAMESPACE)
        print(f"{BOLD}Launcher log{RESET} ({launchers[-1].metadata.name}):")
        print("\n".join(f"  {line}" for line in log.splitlines()))
    if "Succeeded" not in state.split(","):
        print(f"\n{name} did not succeed (conditions: {state}); see .cluster/logs/operator.log")
        return 1
    print(f"{GREEN}{BOLD}{name} Succeeded{RESET} on real containers.")
    return 0


def _exists(api: client.CustomObjectsApi, args: tuple[str, ...], name: str) -> bool:
    try:
        api.get_namespaced_custom_object(*args, name)
    except client.ApiException:
        return False
    return True


if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    os.chdir(ROOT)
    sys.exit(main())

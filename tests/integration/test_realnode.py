"""Upstream's e2e scenarios with real processes: MPI jobs on the local cluster's real node.

Each job runs in real containers (kubelet, containerd, runc; hack/realnode.py) from the locally
built ``mpioperator/mpi-pi`` images, so what is checked is what MPI made of our wiring: the SSH
keys and their modes, the hostfile, discover_hosts.sh, the per-implementation environment, the
headless Service's DNS names. Assertions read exit codes, launcher logs and the job's conditions.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import keys
from support import realnode as realnode_support
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.realnode import (
    ROLE,
    exit_codes,
    launcher_log,
    on_real_node,
    pods,
    ready_real_node,
    with_image,
)
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

TIMEOUT = 180


@pytest.fixture
def real_node(cluster: Cluster) -> str:
    """A Ready real node (the test fails, naming why, when there is none)."""
    return ready_real_node(cluster)


def example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return body


def assert_pi_ran_on_all_hosts(log: str, hosts: list[str]) -> None:
    """pi's output: one rank on each of ``hosts`` and rank 0's estimate from all of them."""
    assert f"Workers: {len(hosts)}" in log, log
    ranks = [line.split() for line in log.splitlines() if line.startswith("Rank ")]
    assert sorted(r[-1] for r in ranks) == sorted(hosts), log
    assert sorted(int(r[1]) for r in ranks) == list(range(len(hosts))), log
    estimate = [line for line in log.splitlines() if line.startswith("pi is approximately")]
    assert len(estimate) == 1, log
    assert abs(float(estimate[0].split()[-1]) - 3.14159) < 0.01, log


def run_to_success(crds: Cluster, mpijobs: MPIJobs, namespace: str, body: dict[str, Any]) -> str:
    return realnode_support.run_to_success(crds, mpijobs, namespace, body, TIMEOUT)


def mpijob_logs(crds: Cluster, namespace: str, job: str, *flags: str) -> str:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mpijob"), "logs", job, *flags,
         "-n", namespace, "--kubeconfig", str(crds.kubeconfig)],
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.usefixtures("real_node")
def test_pi_with_openmpi_as_non_root(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    # Upstream's example as it is: its launcher may start before the workers' names resolve,
    # fail and be restarted (restartPolicy OnFailure); the run that counts is the last one.
    log = run_to_success(crds, mpijobs, namespace, on_real_node(example("pi.yaml")))
    assert_pi_ran_on_all_hosts(log, ["pi-worker-0", "pi-worker-1"])
    assert mpijob_logs(crds, namespace, "pi") == log


# One rank on each worker, never on the launcher: Open MPI 5's mpirun (PRRTE) ignores the
# ORTE-era variables and would run both ranks on the launcher, and the job would still succeed.
@pytest.mark.parametrize(
    ("example_file", "image", "version"),
    [
        ("pi.yaml", "mpioperator/mpi-pi:openmpi", "mpirun (Open MPI) 5."),
        ("pi.yaml", "mpioperator/mpi-pi:openmpi4", "mpirun (Open MPI) 4.1."),
        ("pi-intel.yaml", "mpioperator/mpi-pi:intel", "Intel(R) MPI Library"),
    ],
    ids=["openmpi5", "openmpi4", "intel"],
)
@pytest.mark.usefixtures("real_node")
def test_pi_runs_one_rank_on_each_worker(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
    example_file: str,
    image: str,
    version: str,
) -> None:
    name = "pi-" + image.rsplit(":", 1)[1]
    body = with_image(example(example_file), image, name)
    log = run_to_success(crds, mpijobs, namespace, on_real_node(body))
    assert version in log, log
    assert_pi_ran_on_all_hosts(log, [f"{name}-worker-0", f"{name}-worker-1"])


@pytest.mark.usefixtures("real_node")
def test_pi_with_mpich_streamed_by_mpijob_logs(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    # The image's entrypoint waits until every host resolves, so the launcher's first run is
    # the one that computes pi, and `mpijob logs --follow` streams it while it runs.
    crds.apply(on_real_node(example("pi-mpich.yaml")), namespace=namespace)
    wait_until(
        lambda: any(
            p.status.phase == "Running"
            for p in pods(crds, namespace, "pi-mpich", keys.ROLE_LAUNCHER)
        ),
        timeout=TIMEOUT,
        what="the launcher pod running",
    )
    streamed = mpijob_logs(crds, namespace, "pi-mpich", "--follow")
    mpijobs.wait_condition("pi-mpich", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    assert_pi_ran_on_all_hosts(streamed, ["pi-mpich-worker-0", "pi-mpich-worker-1"])
    assert streamed == launcher_log(crds, namespace, "pi-mpich")
    launcher = pods(crds, namespace, "pi-mpich", keys.ROLE_LAUNCHER)
    assert [exit_codes(p) for p in launcher] == [[0]]


@pytest.mark.usefixtures("real_node")
def test_pi_with_the_launcher_as_a_worker(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    body = example("pi.yaml")
    body["metadata"]["name"] = "pi-law"
    body["spec"]["runLauncherAsWorker"] = True
    body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 1
    log = run_to_success(crds, mpijobs, namespace, on_real_node(body))
    assert_pi_ran_on_all_hosts(log, ["pi-law-launcher", "pi-law-worker-0"])
    hostfile = crds.core.read_namespaced_config_map("pi-law-config", namespace).data["hostfile"]
    assert hostfile.splitlines()[0].startswith(f"pi-law-launcher.pi-law.{namespace}.svc"), hostfile


@pytest.mark.usefixtures("real_node")
def test_launcher_waits_for_ready_workers(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    body = example("pi.yaml")
    body["metadata"]["name"] = "pi-wait"
    body["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
    # The workers stay after the launcher ends, to be compared with it.
    body["spec"]["runPolicy"]["cleanPodPolicy"] = "None"
    worker = body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["readinessProbe"] = {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 3}
    log = run_to_success(crds, mpijobs, namespace, on_real_node(body))
    assert_pi_ran_on_all_hosts(log, ["pi-wait-worker-0", "pi-wait-worker-1"])
    launcher = crds.batch.read_namespaced_job("pi-wait-launcher", namespace)
    for worker_pod in pods(crds, namespace, "pi-wait", keys.ROLE_WORKER):
        ready = next(c for c in worker_pod.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        # Second resolution on both sides: the launcher is never older than a worker's readiness.
        assert launcher.metadata.creation_timestamp >= ready.last_transition_time, (
            worker_pod.metadata.name,
            launcher.metadata.creation_timestamp,
            ready.last_transition_time,
        )


@pytest.mark.usefixtures("real_node")
def test_a_launcher_exiting_non_zero_fails_the_job_after_its_backoff_limit(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    body = example("pi.yaml")
    body["metadata"]["name"] = "pi-bad"
    body["spec"]["runPolicy"]["backoffLimit"] = 1
    launcher = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["args"] = ["-n", "2", "/home/mpiuser/no-such-program"]
    # Never: each failed run is a pod of its own, kept with its exit code.
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] = "Never"
    crds.apply(on_real_node(body), namespace=namespace)
    mpijobs.wait_condition("pi-bad", keys.COND_FAILED, timeout=TIMEOUT)
    succeeded = mpijobs.condition("pi-bad", keys.COND_SUCCEEDED)
    assert succeeded is None or succeeded["status"] != "True", succeeded
    job = crds.batch.read_namespaced_job("pi-bad-launcher", namespace)
    assert any(c.type == "Failed" and c.status == "True" for c in job.status.conditions or [])
    # backoffLimit 1: the first failure is retried, the second ends the job.
    assert job.status.failed == 2, job.status
    launchers = pods(crds, namespace, "pi-bad", keys.ROLE_LAUNCHER)
    assert [p.status.phase for p in launchers] == ["Failed", "Failed"]
    codes = [c for p in launchers for c in exit_codes(p)]
    assert len(codes) == 2, codes
    assert 0 not in codes, codes
    assert "no-such-program" in launcher_log(crds, namespace, "pi-bad")


@pytest.mark.usefixtures("real_node")
def test_pi_restricted_runs_as_uid_1000_under_the_restricted_pod_security_standard(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    crds.core.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    # The namespace really enforces it: a root pod is refused.
    refused = crds.kubectl(
        "run", "root-probe", "-n", namespace, "--image=mpioperator/mpi-pi:openmpi",
        "--restart=Never", "--", "true", check=False,
    )  # fmt: skip
    assert "violates PodSecurity" in refused, refused
    body = on_real_node(example("pi-restricted.yaml"))
    launcher = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["command"] = ["sh", "-c", 'echo "uid $(id -u)"; exec mpirun "$@"', "mpirun"]
    log = run_to_success(crds, mpijobs, namespace, body)
    assert "uid 1000" in log, log
    assert_pi_ran_on_all_hosts(log, ["pi-restricted-worker-0", "pi-restricted-worker-1"])


@pytest.mark.usefixtures("real_node")
def test_scaling_workers_up_while_running_lists_the_new_host_in_discover_hosts(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    body = example("pi.yaml")
    body["metadata"]["name"] = "pi-scale"
    body["spec"]["runPolicy"].pop("ttlSecondsAfterFinished", None)
    launcher = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    # Wait (up to 3 min) for a third host in discover_hosts.sh, then run pi on all three.
    launcher["command"] = ["sh", "-c"]
    launcher["args"] = [
        "for i in $(seq 360); do"
        "  if [ $(/etc/mpi/discover_hosts.sh | wc -l) -ge 3 ]; then"
        "    echo discovered:; /etc/mpi/discover_hosts.sh; exec mpirun -n 3 /home/mpiuser/pi;"
        "  fi; sleep 0.5; done; echo never saw 3 hosts; exit 1"
    ]
    crds.apply(on_real_node(body), namespace=namespace)
    wait_until(
        lambda: len(
            [p for p in pods(crds, namespace, "pi-scale", keys.ROLE_WORKER)
             if p.status.phase == "Running"]
        ) == 2
        and any(p.status.phase == "Running"
                for p in pods(crds, namespace, "pi-scale", keys.ROLE_LAUNCHER)),
        timeout=TIMEOUT,
        what="2 workers and the launcher running",
    )  # fmt: skip
    assert "discovered:" not in launcher_log(crds, namespace, "pi-scale")
    mpijobs.patch("pi-scale", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 3}}}})
    mpijobs.wait_condition("pi-scale", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    log = launcher_log(crds, namespace, "pi-scale")
    discovered = log.split("discovered:", 1)[1].split("Workers:", 1)[0]
    assert f"pi-scale-worker-2.pi-scale.{namespace}.svc" in discovered, log
    assert_pi_ran_on_all_hosts(log, ["pi-scale-worker-0", "pi-scale-worker-1", "pi-scale-worker-2"])


def test_a_plain_pod_from_a_locally_built_image_runs_and_its_log_is_readable(
    crds: Cluster, namespace: str, real_node: str
) -> None:
    """No MPIJob, no operator: the node runs a container of an image built here from Debian
    packages, beside the kwok nodes, and the API server serves its log."""
    kwok = [n.metadata.name for n in crds.core.list_node(label_selector="type=kwok").items]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"mpijob.io/real-node": "true"},
            "tolerations": [
                {"key": "mpijob.io/real-node", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "mpioperator/mpi-pi:openmpi",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "echo hello from $(hostname); cat /etc/debian_version"],
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }
    crds.apply(body, namespace=namespace)
    pod = wait_until(
        lambda: (
            (p := crds.core.read_namespaced_pod("hello", namespace)).status.phase
            in ("Succeeded", "Failed")
            and p
        ),
        timeout=TIMEOUT,
        what="the pod to finish",
    )
    assert pod.status.phase == "Succeeded", pod.status
    # With more than one real node (REAL_NODES=2, the default) the scheduler picks any of them.
    real_nodes = {n.metadata.name for n in crds.core.list_node(label_selector=f"{ROLE}=true").items}
    assert real_node in real_nodes
    assert pod.spec.node_name in real_nodes, pod.spec.node_name
    assert exit_codes(pod) == [0]
    log = crds.kubectl("logs", "hello", "-n", namespace)
    assert "hello from hello" in log, log
    assert any(line[:2].isdigit() for line in log.splitlines()), log  # Debian's version
    ready = {
        n.metadata.name
        for n in crds.core.list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }
    assert real_node in ready
    assert kwok, "the kwok GPU nodes beside it"
    assert set(kwok) <= ready

"""Our admission cannot be stalled or fooled: a deleted waiting job leaves the line at once, GPUs
of a pod that is still terminating are not handed out until it is gone, and a job whose decision
the API server refuses says so without holding up the jobs behind it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from mpijob import keys
from support.gpus import hold
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

TOPOLOGY = {keys.GPU_TOPOLOGY: "true"}
#: The API server's limit on an object's annotations, keys and values together.
ANNOTATIONS_LIMIT = 256 * 1024


def topology_job(name: str, workers: int, gpus: int) -> dict[str, Any]:
    return mpijob(name, workers=workers, gpus=gpus, annotations=TOPOLOGY)


def worker_pods(cluster: Cluster, ns: str, job: str) -> list[Any]:
    return cluster.core.list_namespaced_pod(
        ns, label_selector=f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}=worker"
    ).items


def admission_message(mpijobs: MPIJobs, name: str) -> str:
    condition = mpijobs.condition(name, keys.COND_GANG_ADMITTED) or {}
    return str(condition.get("message", ""))


def test_a_job_deleted_while_it_waited_leaves_the_line_and_the_next_is_admitted(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    hold(crds, namespace, "gpu-node-0", "0,1")  # the 4x8 job cannot fit until this pod goes
    mpijobs.create(topology_job("head", workers=4, gpus=8))
    wait_until(lambda: "needs" in admission_message(mpijobs, "head"), what="head to wait")
    time.sleep(1.1)  # creationTimestamp has whole seconds: "behind" must be younger, not a tie
    mpijobs.create(topology_job("behind", workers=1, gpus=2))
    wait_until(
        lambda: (
            "queued behind" in admission_message(mpijobs, "behind")
            and "/head" in admission_message(mpijobs, "behind")
        ),
        what="behind says which job is ahead of it",
    )

    mpijobs.delete("head")
    mpijobs.wait_condition("behind", keys.COND_GANG_ADMITTED, status="True", timeout=30)
    assert len(worker_pods(crds, namespace, "behind")) == 1


def test_gpus_of_a_terminating_pod_are_not_given_away_until_it_is_gone(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    holder = hold(crds, namespace, "gpu-node-0")  # all 8 GPUs of the node
    linger = {"metadata": {"annotations": {keys.SIM_TERMINATE_AFTER: "15s"}}}
    crds.core.patch_namespaced_pod(holder, namespace, linger)
    crds.core.delete_namespaced_pod(holder, namespace)
    wait_until(
        lambda: crds.core.read_namespaced_pod(holder, namespace).metadata.deletion_timestamp,
        what="the holder to be terminating",
    )
    mpijobs.create(topology_job("after", workers=4, gpus=8))  # needs every GPU of 4 nodes
    # Placement's own answer, not the first sync's "waiting for the next admission pass".
    wait_until(
        lambda: "needs" in admission_message(mpijobs, "after"),
        what="the job to wait for the terminating pod's GPUs",
    )
    assert crds.core.read_namespaced_pod(holder, namespace).metadata.deletion_timestamp
    assert not worker_pods(crds, namespace, "after")

    mpijobs.wait_condition("after", keys.COND_GANG_ADMITTED, status="True", timeout=60)
    # Placement pins each worker to its node by affinity; the scheduler binds it a moment later.
    pods = wait_until(
        lambda: (
            (p := worker_pods(crds, namespace, "after"))
            and len(p) == 4
            and all(w.spec.node_name for w in p)
            and p
        ),
        what="the four workers bound",
    )
    assert {p.spec.node_name for p in pods} == {f"gpu-node-{i}" for i in range(4)}


def test_a_job_with_annotations_near_their_limit_is_admitted_its_decision_lives_apart(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    """Decisions were once annotations on the MPIJob, and a job with no room left stalled;
    a PlacementDecision needs no room on the job."""
    blob_key = "example.com/blob"
    room = ANNOTATIONS_LIMIT - len(keys.GPU_TOPOLOGY) - len("true") - len(blob_key)
    crowded = topology_job("crowded", workers=1, gpus=2)
    crowded["metadata"]["annotations"][blob_key] = "x" * (room - 10)
    mpijobs.create(crowded)
    mpijobs.wait_condition("crowded", keys.COND_GANG_ADMITTED, status="True", timeout=30)
    decision = mpijobs.decision("crowded")
    assert decision is not None
    assert decision["spec"]["job"]["uid"] == mpijobs.get("crowded")["metadata"]["uid"]
    wait_until(lambda: len(worker_pods(crds, namespace, "crowded")) == 1, what="the worker")

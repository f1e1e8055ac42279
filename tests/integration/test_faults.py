"""Faults and odd timings repeat nothing and lose nothing.

A finished job never runs again (``ttlSecondsAfterFinished: 0``); a job deleted and created
again under its name at once runs; a storm of SIGKILLs loses no ``MPIJobCreated``; a node lost
under a running topology job releases its GPUs and the job is placed again on healthy ones.
"""

from __future__ import annotations

import copy
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import stays, wait_until

pytestmark = pytest.mark.integration

TOPOLOGY = {keys.GPU_TOPOLOGY: "true"}


def launcher_job_uids(cluster: Cluster, namespace: str, job: str) -> set[str]:
    """Every launcher Job the Job controller ever acted on, by uid (its Events outlive it)."""
    events = cluster.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Job,involvedObject.name={job}-launcher"
    ).items
    return {e.involved_object.uid for e in events}


def test_a_job_with_a_ttl_of_zero_runs_once_and_ends_succeeded(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """The Job controller's TTL would delete the launcher before its success is read, and the
    next sync would run the job again; the operator applies the TTL itself, after the status."""
    mpijobs.create(
        mpijob(
            "once",
            workers=1,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"},
            run_policy={"ttlSecondsAfterFinished": 0},
        )
    )
    mpijobs.wait_condition("once", "Succeeded", timeout=90)
    wait_until(
        lambda: not crds.batch.list_namespaced_job(namespace).items,
        timeout=60,
        what="the operator deleting the finished launcher Job (TTL 0)",
    )
    # A later sync of the finished job (any change to it asks for one) creates nothing.
    mpijobs.patch("once", {"metadata": {"annotations": {"touched": "1"}}})
    stays(
        lambda: not crds.batch.list_namespaced_job(namespace).items,
        duration=5,
        what="no launcher Job",
    )
    assert len(launcher_job_uids(crds, namespace, "once")) == 1
    assert mpijobs.condition("once", "Succeeded")["status"] == "True"
    reasons = Counter(e["reason"] for e in mpijobs.events("once"))
    assert reasons["MPIJobSucceeded"] == 1


@pytest.mark.usefixtures("idle_gpus")
def test_a_job_deleted_and_created_again_at_once_runs(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """The earlier job's PlacementDecision goes as soon as its pods are gone, though no sync of
    the deleted job ever ran (its successor was there first)."""
    start_operator("--gpu-binding", "annotations")
    body = mpijob(
        "again",
        workers=2,
        gpus=2,
        annotations=TOPOLOGY,
        launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"},
    )
    first = mpijobs.create(copy.deepcopy(body))
    wait_until(lambda: mpijobs.decision("again"), timeout=60, what="the first job admitted")
    mpijobs.delete("again")
    wait_until(lambda: _created_again(mpijobs, body), interval=0.05, what="the job created again")
    second = mpijobs.get("again")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    mpijobs.wait_condition("again", "Succeeded", timeout=120)
    decision = mpijobs.decision("again")
    assert decision is None or decision["spec"]["job"]["uid"] == second["metadata"]["uid"]


def _created_again(mpijobs: MPIJobs, body: dict[str, Any]) -> bool:
    try:
        mpijobs.create(copy.deepcopy(body))
    except ApiException as e:
        if e.status == 409:  # the first one is still being deleted
            return False
        raise
    return True


def test_a_storm_of_sigkills_loses_no_created_event(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """Events wait behind the requests jobs wait for (a slow client makes them wait long), so
    kills land between status writes and their Events; every job still gets exactly one."""
    slow = ("--kube-api-qps", "4", "--kube-api-burst", "1")
    op: OperatorProcess = start_operator(*slow)
    names = [f"storm-{i}" for i in range(10)]
    kills = 0
    for i, name in enumerate(names):
        mpijobs.create(mpijob(name, workers=1, launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"}))
        if i % 3 == 2:
            wait_until(lambda n=name: mpijobs.condition(n, "Created"), what=f"{name} Created")
            op.kill(signal.SIGKILL)
            kills += 1
            op = start_operator(*slow)
    assert kills == 3
    op.kill(signal.SIGKILL)
    start_operator()
    for name in names:
        mpijobs.wait_condition(name, "Succeeded", timeout=180)

    def created_counts() -> dict[str, int]:
        counts = dict.fromkeys(names, 0)
        for e in crds.core.list_namespaced_event(namespace).items:
            if e.reason == keys.REASON_CREATED and e.involved_object.name in counts:
                counts[e.involved_object.name] += e.count or 1
        return counts

    wait_until(lambda: all(created_counts().values()), timeout=60, what="an MPIJobCreated per job")
    assert created_counts() == dict.fromkeys(names, 1)


# --- a node lost under a running job ---------------------------------------------------------


@pytest.fixture
def spare_nodes(cluster: Cluster) -> Iterator[tuple[str, list[str]]]:
    """Three simulated DGX-1 nodes only this test's job may use (a label its workers select),
    deleted afterwards: the suite's own nodes are never lost."""
    from hack import cluster as local

    label = f"mpijob.io/test-pool-{uuid.uuid4().hex[:6]}"
    names = [f"lost-{uuid.uuid4().hex[:5]}-{i}" for i in range(3)]
    for name in names:
        node = local.node_manifest(0, "dgx1-v100", 8)
        node["metadata"]["name"] = name
        node["metadata"]["labels"].update({"kubernetes.io/hostname": name, label: "true"})
        node["metadata"]["annotations"][local.TOPOLOGY_ANNOTATION] = local.topology_annotation(
            "dgx1-v100", name
        )
        cluster.core.create_node(node)

    def ready() -> bool:
        found = {n.metadata.name: n for n in cluster.core.list_node(label_selector=label).items}
        return len(found) == 3 and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            for n in found.values()
        )

    wait_until(ready, timeout=60, what="the spare nodes Ready")
    yield label, names
    for name in names:
        try:
            cluster.core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest.mark.usefixtures("idle_gpus")
def test_a_node_lost_under_a_running_job_releases_its_gpus_and_the_job_runs_elsewhere(
    crds: Cluster,
    namespace: str,
    start_operator: Any,
    mpijobs: MPIJobs,
    spare_nodes: tuple[str, list[str]],
) -> None:
    label, spares = spare_nodes
    start_operator("--gpu-binding", "annotations")
    body = mpijob("lost", workers=2, gpus=8, annotations=TOPOLOGY)
    replicas = body["spec"]["mpiReplicaSpecs"]
    replicas["Worker"]["template"]["spec"]["nodeSelector"] = {label: "true"}
    # The launcher stays off the spare nodes: it is the workers' node that is lost.
    replicas["Launcher"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": label, "operator": "DoesNotExist"}]}
                ]
            }
        }
    }
    mpijobs.create(body)
    mpijobs.wait_condition("lost", "Running", timeout=90)
    first = mpijobs.decision("lost")
    assert first is not None
    placed = sorted({w["node"] for w in first["spec"]["workers"]})
    assert len(placed) == 2
    assert set(placed) <= set(spares)
    victim = placed[0]

    # NotReady: the simulator stops heart-beating it and the node says so.
    crds.core.patch_node(victim, {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}})
    now = "2026-01-01T00:00:00Z"
    not_ready = {
        "type": "Ready",
        "status": "False",
        "reason": "KubeletNotReady",
        "message": "node lost (test)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    crds.core.patch_node_status(victim, {"status": {"conditions": [not_ready]}})
    crds.core.delete_node(victim)

    # Said once, why (the node may have evicted its worker before it was deleted).
    event = mpijobs.wait_event("lost", keys.REASON_NODE_LOST, timeout=60)
    assert event["type"] == "Warning"
    assert f"node {victim} " in event["message"]

    def placed_again() -> dict[str, Any] | None:
        d = mpijobs.decision("lost")
        if d is None or d["metadata"]["uid"] == first["metadata"]["uid"]:
            return None
        return d

    second = wait_until(placed_again, timeout=90, what="the job placed anew")
    nodes = {w["node"] for w in second["spec"]["workers"]}
    assert victim not in nodes
    assert nodes <= set(spares)

    def workers_running() -> list[Any] | None:
        pods = crds.core.list_namespaced_pod(
            namespace, label_selector=f"{keys.LABEL_JOB_NAME}=lost,{keys.LABEL_JOB_ROLE}=worker"
        ).items
        ok = len(pods) == 2 and all(
            p.status.phase == "Running" and p.spec.node_name in nodes for p in pods
        )
        return pods if ok else None

    wait_until(workers_running, timeout=120, what="both workers Running on healthy nodes")
    admitted = mpijobs.wait_condition("lost", keys.COND_GANG_ADMITTED, timeout=30)
    assert admitted["reason"] == keys.REASON_GANG_ADMITTED
    # Nothing is reserved on the node that no longer exists.
    everywhere = crds.resource(keys.DECISION_API_VERSION, keys.DECISION_KIND).get().to_dict()
    held = [w["node"] for d in everywhere["items"] for w in d["spec"]["workers"]]
    assert victim not in held
    # Its pods go before the spare nodes do.
    mpijobs.delete("lost")
    wait_until(
        lambda: not crds.core.list_namespaced_pod(namespace).items,
        timeout=120,
        what="the job's pods gone",
    )

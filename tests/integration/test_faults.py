"""Faults and odd timings repeat nothing and lose nothing.

A finished job never runs again (``ttlSecondsAfterFinished: 0``); a job deleted and created
again under its name at once runs; a storm of SIGKILLs loses no ``MPIJobCreated``; a node lost
under a running topology job releases its GPUs and the job is placed again on healthy ones; the
API server restarted under running topology jobs, their nodes not Ready meanwhile, deletes none
of their workers.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from mpijob import keys
from mpijob.gang import topology
from support import audit
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import stays, wait_until

pytestmark = pytest.mark.integration

TOPOLOGY = {keys.GPU_TOPOLOGY: "true"}
ROOT = Path(__file__).resolve().parents[2]


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


# --- the API server restarted under running jobs -----------------------------------------------

#: How long the API server stays away at each restart (a control-plane upgrade's restart).
OUTAGE_SECONDS = 20.0
#: How long the nodes stay not Ready after each restart: past the operator's grace, so that
#: only the pool's disruption (every node not Ready at once) keeps their jobs in place.
UNHEARD_SECONDS = topology.NODE_LOST_GRACE_SECONDS + 10
KWOK_NODE = "kwok.x-k8s.io/node"


def restart_api_server(outage: float) -> None:
    """SIGKILL the local cluster's kube-apiserver and start it again ``outage`` s later with the
    same arguments; returns when it answers.

    Holds the lock under which a test session starts or checks the cluster
    (:func:`support.kube.start_cluster`) meanwhile: a session starting beside this one would
    take the cluster without its API server for a dead one and start another."""
    from hack import cluster as local

    with (ROOT / ".test-logs" / "cluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = local.State.load()
        assert state is not None, "no local cluster state"
        pid = state.pids["kube-apiserver"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not local.alive(pid), timeout=30, interval=0.05, what="it gone")
        time.sleep(outage)
        local.start("kube-apiserver", [a.decode() for a in argv], state)
        wait_until(lambda: local.healthy(state), timeout=60, what="the API server back")


@contextlib.contextmanager
def heartbeats_lost(cluster: Cluster, names: list[str]) -> Iterator[None]:
    """``names`` not Ready as the node lifecycle controller marks a node whose heartbeats did
    not reach the API server (``Ready=Unknown``), and kept so (the simulator stops
    heart-beating them) until the block ends; then simulated again, and Ready."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": now,
    }
    try:
        for name in names:
            cluster.core.patch_node(name, {"metadata": {"annotations": {KWOK_NODE: None}}})
            cluster.core.patch_node_status(name, {"status": {"conditions": [unknown]}})
        yield
    finally:
        for name in names:
            wait_until(
                lambda n=name: cluster.core.patch_node(
                    n, {"metadata": {"annotations": {KWOK_NODE: "fake"}}}
                ),
                timeout=60,
                what=f"{name} simulated again",
            )

        def ready() -> bool:
            found = [cluster.core.read_node(n) for n in names]
            return all(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in found
            )

        wait_until(ready, timeout=60, what="the nodes Ready again")


def workers(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The namespace's live worker pods by name."""
    pods = cluster.core.list_namespaced_pod(
        namespace, label_selector=f"{keys.LABEL_JOB_ROLE}={keys.ROLE_WORKER}"
    ).items
    return {p.metadata.name: p for p in pods if not p.metadata.deletion_timestamp}


def operator_pod_deletes(namespace: str, since: datetime) -> list[str]:
    """The operator's deletes of pods in ``namespace`` since ``since``, by the audit log."""
    return [
        f"{(e.get('objectRef') or {}).get('name')} at {e['requestReceivedTimestamp']}"
        for e in audit.events(since)
        if e["verb"] == "delete"
        and (e.get("objectRef") or {}).get("resource") == "pods"
        and (e.get("objectRef") or {}).get("namespace") == namespace
        and str(e.get("userAgent", "")).startswith(audit.OPERATOR_AGENT)
    ]


@pytest.mark.usefixtures("idle_gpus")
def test_an_api_server_restart_deletes_no_running_worker(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """Killed and started again 20 s later, three times, with topology jobs running: the
    operator's caches lose their watches, and the jobs' nodes are then marked not Ready as the
    node lifecycle controller marks nodes whose heartbeats missed the API server, for longer
    than the operator's grace. Each time a worker of a job really vanishes too (evicted), and
    is created again at once on its node. No other worker is deleted and no job placed anew
    (the audit log: no delete of a pod by the operator)."""
    start_operator("--gpu-binding", "annotations")
    shapes = {"wide": (2, 8), "three": (3, 2), "pair": (2, 2), "one": (1, 4)}  # 30 of 32 GPUs
    for name, (count, gpus) in shapes.items():
        mpijobs.create(mpijob(name, workers=count, gpus=gpus, annotations=TOPOLOGY))
    for name in shapes:
        mpijobs.wait_condition(name, "Running", timeout=120)
    before = {name: p.metadata.uid for name, p in workers(crds, namespace).items()}
    assert len(before) == sum(count for count, _ in shapes.values())
    decisions = {name: mpijobs.decision(name)["metadata"]["uid"] for name in shapes}
    nodes = sorted({w["node"] for n in shapes for w in mpijobs.decision(n)["spec"]["workers"]})

    since = datetime.now(UTC)
    vanished: list[str] = []

    def placed_as_before() -> bool:
        now = {name: p.metadata.uid for name, p in workers(crds, namespace).items()}
        kept = all(now.get(n) == uid for n, uid in before.items() if n not in vanished)
        held = {
            name: (mpijobs.decision(name) or {}).get("metadata", {}).get("uid") for name in shapes
        }
        return kept and held == decisions

    for restart in range(3):
        restart_api_server(OUTAGE_SECONDS)
        with heartbeats_lost(crds, nodes):
            victim = f"three-worker-{restart}"
            crds.core.delete_namespaced_pod(victim, namespace, grace_period_seconds=0)
            vanished.append(victim)
            wait_until(
                lambda v=victim: (
                    (p := workers(crds, namespace).get(v)) is not None
                    and p.metadata.uid != before[v]
                ),
                timeout=30,
                what=f"{victim} created again",
            )
            stays(placed_as_before, duration=UNHEARD_SECONDS, interval=2, what="the placements")
    deleted = operator_pod_deletes(namespace, since)
    assert not deleted, f"the operator deleted running workers: {deleted}"
    assert {name: mpijobs.decision(name)["metadata"]["uid"] for name in shapes} == decisions

    def all_running() -> dict[str, Any] | None:
        now = workers(crds, namespace)
        ok = len(now) == len(before) and all(p.status.phase == "Running" for p in now.values())
        return now if ok else None

    after = wait_until(all_running, timeout=120, what="every worker Running again")
    kept = {name: p.metadata.uid for name, p in after.items() if name not in vanished}
    assert kept == {name: uid for name, uid in before.items() if name not in vanished}
    lost = [
        e for name in shapes for e in mpijobs.events(name) if e["reason"] == keys.REASON_NODE_LOST
    ]
    assert lost == []

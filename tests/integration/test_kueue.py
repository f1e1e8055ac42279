"""With the real Kueue: it queues and admits MPIJobs, this operator runs them.

Kueue (``hack/kueue.py``, started for this module by the ``kueue`` fixture) suspends a job
labelled ``kueue.x-k8s.io/queue-name`` through its webhook, creates a Workload from the
Launcher and Worker PodSets, admits it when its ClusterQueue's quota allows, patches the
ResourceFlavor's node labels into the pod templates and unsuspends the job; on preemption it
suspends the job again and waits until no replica is active. Each test has its own
ResourceFlavor, ClusterQueue and LocalQueue, so quotas are exact and tests never share them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from mpijob import keys
from mpijob.placement import allocator, codec
from mpijob.placement.scoring import ring_gbps
from support.gpus import hold, hold_by_claim
from support.jobs import mpijob
from support.kube import Cluster
from support.kueue import PRIORITY_LABEL, QUEUE_LABEL, Kueue, condition
from support.mpijobs import MPIJobs
from support.wait import stays, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

SUCCEED_AFTER = "mpijob.io/sim-succeed-after"
POOL = "mpijob.io/test-pool"
SCHED_POD_GROUP = ("scheduling.x-k8s.io/v1alpha1", "PodGroup")


def queued(
    name: str,
    queue: str,
    *,
    workers: int = 2,
    gpus: int = 4,
    runs_for: str = "3s",
    priority: str | None = None,
    topology: bool = False,
    run_policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A job for ``queue`` whose launcher succeeds ``runs_for`` after it starts; every pod asks
    for a CPU, so that Kueue assigns each PodSet (the launcher too) a flavor."""
    body = mpijob(
        name,
        workers=workers,
        gpus=gpus,
        launcher_annotations={SUCCEED_AFTER: runs_for},
        run_policy={"cleanPodPolicy": "Running", **(run_policy or {})},
        annotations={keys.GPU_TOPOLOGY: "true"} if topology else None,
    )
    body["metadata"]["labels"] = {QUEUE_LABEL: queue}
    if priority:
        body["metadata"]["labels"][PRIORITY_LABEL] = priority
    for replica in body["spec"]["mpiReplicaSpecs"].values():
        container = replica["template"]["spec"]["containers"][0]
        container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "1"
    return body


def pods_of(cluster: Cluster, ns: str, job: str) -> list[Any]:
    return [
        p
        for p in cluster.core.list_namespaced_pod(
            ns, label_selector=f"{keys.LABEL_JOB_NAME}={job}"
        ).items
        if p.metadata.deletion_timestamp is None
    ]


def when(c: dict[str, Any] | None) -> datetime:
    assert c is not None
    return datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))


def gpu_model(cluster: Cluster) -> str:
    return str(cluster.core.read_node("gpu-node-0").metadata.labels["mpijob.io/gpu-model"])


@pytest.fixture
def queue(kueue: Kueue, namespace: str) -> Iterator[Callable[..., str]]:
    """Make this test's ResourceFlavor (``node_labels``), ClusterQueue (``gpus`` of quota) and
    LocalQueue; returns the LocalQueue's name. Deleted afterwards (without waiting)."""
    made: list[tuple[str, str]] = []

    def make(node_labels: dict[str, str], gpus: int = 8, preempt: bool = False) -> str:
        kueue.flavor(namespace, node_labels)
        made.append(("ResourceFlavor", namespace))
        kueue.cluster_queue(namespace, namespace, gpus, preempt=preempt)
        made.append(("ClusterQueue", namespace))
        kueue.local_queue(namespace, "gpus", namespace)
        return "gpus"

    yield make
    for kind, name in reversed(made):
        kueue.delete(kind, name)


@pytest.fixture
def pool(cluster: Cluster, namespace: str) -> Iterator[Callable[..., dict[str, str]]]:
    """Label some simulated nodes as this test's pool; returns the label to select them."""
    labelled: list[str] = []

    def make(*nodes: str) -> dict[str, str]:
        for node in nodes:
            cluster.core.patch_node(node, {"metadata": {"labels": {POOL: namespace}}})
            labelled.append(node)
        return {POOL: namespace}

    yield make
    for node in labelled:
        cluster.core.patch_node(node, {"metadata": {"labels": {POOL: None}}})


def test_a_queued_job_is_suspended_by_kueue_admitted_and_runs_to_succeeded(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    operator: Any,
    mpijobs: MPIJobs,
) -> None:
    q = queue({"mpijob.io/gpu-model": gpu_model(crds)}, gpus=8)
    created = mpijobs.create(queued("pi", q))
    # Kueue's mutating webhook suspended it on the way in: no pod before admission.
    assert created["spec"]["runPolicy"]["suspend"] is True
    workload = kueue.workload(namespace, created["metadata"]["uid"])
    podsets = {p["name"]: p["count"] for p in workload["spec"]["podSets"]}
    assert podsets == {"launcher": 1, "worker": 2}

    wait_until(
        lambda: condition(kueue.workload(namespace, created["metadata"]["uid"]), "Admitted"),
        timeout=60,
        what="the Workload admitted",
    )
    mpijobs.wait_condition("pi", keys.COND_RUNNING, timeout=60)
    succeeded = mpijobs.wait_condition("pi", keys.COND_SUCCEEDED, timeout=90)
    assert succeeded["reason"] == "MPIJobSucceeded"

    def finished() -> dict[str, Any] | None:
        c = condition(kueue.workload(namespace, created["metadata"]["uid"]), "Finished")
        return c if c and c["status"] == "True" else None

    assert wait_until(finished, timeout=60, what="the Workload Finished")["reason"] == "Succeeded"


def test_kueues_node_selector_reaches_every_pod(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    pool: Callable[..., dict[str, str]],
    operator: Any,
    mpijobs: MPIJobs,
) -> None:
    """The flavor's node labels, merged into the templates by Kueue on admission, are on the
    launcher and on every worker, which run only on the flavor's nodes."""
    labels = pool("gpu-node-1", "gpu-node-2")
    q = queue(labels, gpus=16)
    mpijobs.create(queued("sel", q, workers=3, runs_for="30s"))
    mpijobs.wait_condition("sel", keys.COND_RUNNING, timeout=60)

    def bound() -> list[Any] | None:
        pods = pods_of(crds, namespace, "sel")
        return pods if len(pods) == 4 and all(p.spec.node_name for p in pods) else None

    pods = wait_until(bound, what="the launcher and 3 workers bound")
    for p in pods:
        assert (p.spec.node_selector or {}).get(POOL) == namespace, p.metadata.name
    assert {p.spec.node_name for p in pods} <= {"gpu-node-1", "gpu-node-2"}
    launcher_job = crds.batch.read_namespaced_job("sel-launcher", namespace)
    assert launcher_job.spec.template.spec.node_selector.get(POOL) == namespace


def test_with_quota_for_one_two_8_gpu_jobs_run_one_after_the_other(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    operator: Any,
    mpijobs: MPIJobs,
) -> None:
    q = queue({"mpijob.io/gpu-model": gpu_model(crds)}, gpus=8)
    first = mpijobs.create(queued("first", q, runs_for="5s"))
    second = mpijobs.create(queued("second", q, runs_for="2s"))
    mpijobs.wait_condition("first", keys.COND_RUNNING, timeout=60)
    # The second waits in the queue, suspended, without a single pod.
    assert mpijobs.get("second")["spec"]["runPolicy"]["suspend"] is True
    assert pods_of(crds, namespace, "second") == []
    waiting = kueue.workload(namespace, second["metadata"]["uid"])
    assert (condition(waiting, "QuotaReserved") or {}).get("status") != "True"

    done = mpijobs.wait_condition("first", keys.COND_SUCCEEDED, timeout=90)
    mpijobs.wait_condition("second", keys.COND_SUCCEEDED, timeout=120)
    # Never together: the second was admitted, created pods and ran only after the first ended.
    first_wl = kueue.workload(namespace, first["metadata"]["uid"])
    second_wl = kueue.workload(namespace, second["metadata"]["uid"])
    assert when(condition(second_wl, "QuotaReserved")) >= when(condition(first_wl, "Finished"))
    assert when(mpijobs.condition("second", keys.COND_RUNNING)) >= when(done)
    assert when(mpijobs.condition("second", keys.COND_CREATED)) <= when(done)


def test_a_higher_priority_job_preempts_a_running_one_which_runs_again_later(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    start_operator: Callable[..., Any],
    mpijobs: MPIJobs,
) -> None:
    """Preemption suspends the running job: its pods and PodGroup go, its GPU decision is
    given back; once the preemptor is done it is admitted and placed again, and succeeds."""
    start_operator("--gang-scheduling", "default-scheduler")
    low, high = f"low-{namespace}", f"high-{namespace}"
    kueue.priority_class(low, 100)
    kueue.priority_class(high, 1000)
    try:
        model = gpu_model(crds)
        q = queue({"mpijob.io/gpu-model": model}, gpus=8, preempt=True)
        victim = mpijobs.create(queued("victim", q, runs_for="30s", priority=low, topology=True))
        mpijobs.wait_condition("victim", keys.COND_RUNNING, timeout=60)
        wait_until(lambda: len(pods_of(crds, namespace, "victim")) == 3, what="victim's pods")
        group = crds.resource(*SCHED_POD_GROUP)
        assert group.get(name="victim", namespace=namespace)
        assert mpijobs.decision("victim") is not None

        mpijobs.create(queued("urgent", q, runs_for="3s", priority=high, topology=True))

        def evicted() -> dict[str, Any] | None:
            c = condition(kueue.workload(namespace, victim["metadata"]["uid"]), "Evicted")
            return c if c and c["status"] == "True" else None

        assert wait_until(evicted, timeout=60, what="the victim evicted")["reason"] == "Preempted"

        def stopped() -> bool:
            job = mpijobs.get("victim")
            return bool(
                job["spec"]["runPolicy"].get("suspend")
                and not pods_of(crds, namespace, "victim")
                and all(
                    g["metadata"]["name"] != "victim"
                    for g in group.get(namespace=namespace).to_dict()["items"]
                )
                and mpijobs.decision("victim") is None
            )

        wait_until(stopped, timeout=60, what="the victim suspended, without pods or PodGroup")
        mpijobs.wait_condition("urgent", keys.COND_SUCCEEDED, timeout=90)

        def running_again() -> list[Any] | None:
            pods = pods_of(crds, namespace, "victim")
            return pods if len(pods) == 3 and all(p.spec.node_name for p in pods) else None

        # Admitted again: Kueue merged its node selector into the templates anew, and the
        # relaunched pods (the launcher Job's too, resumed) carry it.
        for p in wait_until(running_again, timeout=90, what="the victim running again"):
            assert (p.spec.node_selector or {}).get("mpijob.io/gpu-model") == model
        mpijobs.wait_condition("victim", keys.COND_SUCCEEDED, timeout=120)
        # Kueue marks the Workload Finished from the job's status, in its own time.
        wait_until(
            lambda: condition(kueue.workload(namespace, victim["metadata"]["uid"]), "Finished"),
            timeout=60,
            what="the victim's Workload Finished",
        )
    finally:
        kueue.delete("WorkloadPriorityClass", low)
        kueue.delete("WorkloadPriorityClass", high)


def test_a_topology_job_admitted_by_kueue_gets_the_best_ring_inside_the_flavor(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    pool: Callable[..., dict[str, str]],
    operator: Any,
    mpijobs: MPIJobs,
) -> None:
    """Pool = gpu-node-2 (GPUs 0,3,4,7 taken) and gpu-node-3 (full). Nodes 0 and 1 are idle,
    but Kueue's flavor allows only the pool: the job gets node 2's free ring {1,2,5,6}."""
    labels = pool("gpu-node-2", "gpu-node-3")
    hold(crds, namespace, "gpu-node-3")
    # GPUs held through a claim: the cluster says which ones (a pod's annotation would not count).
    hold_by_claim(crds, namespace, "held", "gpu-node-2", [0, 3, 4, 7])
    q = queue(labels, gpus=8)
    mpijobs.create(queued("ring", q, workers=1, gpus=4, runs_for="30s", topology=True))
    mpijobs.wait_condition("ring", keys.COND_RUNNING, timeout=60)
    workers = wait_until(
        lambda: [
            p
            for p in pods_of(crds, namespace, "ring")
            if p.metadata.labels.get(keys.LABEL_JOB_ROLE) == "worker" and p.spec.node_name
        ],
        what="the worker bound",
    )
    (worker,) = workers
    assert worker.spec.node_name == "gpu-node-2"
    assert worker.spec.node_selector.get(POOL) == namespace
    gpus = {int(i) for i in worker.metadata.annotations[keys.GPU_IDS].split(",")}
    assert gpus == {1, 2, 5, 6}
    topology = codec.loads(
        crds.core.read_node("gpu-node-2").metadata.annotations[keys.GPU_TOPOLOGY]
    )
    best = allocator.best_set(topology, frozenset({1, 2, 5, 6}), 4)
    assert ring_gbps(topology, tuple(sorted(gpus))) == best.ring_gbps
    assert float(worker.metadata.annotations[keys.RING_BANDWIDTH]) == best.ring_gbps


def test_a_job_kueue_admitted_that_we_cannot_place_says_so(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    pool: Callable[..., dict[str, str]],
    operator: Any,
    mpijobs: MPIJobs,
) -> None:
    """Kueue counts quota, not which GPUs are free: with the flavor's nodes taken by pods it
    does not account for, Kueue admits the job and our placement waits, saying why."""
    labels = pool("gpu-node-3")
    hold(crds, namespace, "gpu-node-3")
    q = queue(labels, gpus=8)
    mpijobs.create(queued("stuck", q, workers=1, gpus=4, topology=True))
    waiting = mpijobs.wait_condition("stuck", keys.COND_GANG_ADMITTED, status="False", timeout=60)
    assert waiting["reason"] == keys.REASON_GANG_WAITING
    assert "Kueue" in waiting["message"], waiting
    assert mpijobs.get("stuck")["spec"]["runPolicy"].get("suspend") is False
    assert [
        p for p in pods_of(crds, namespace, "stuck") if p.metadata.labels.get(keys.LABEL_JOB_ROLE)
    ] == []


def test_a_queued_job_managed_by_multikueue_is_left_alone(
    crds: Cluster,
    namespace: str,
    kueue: Kueue,
    queue: Callable[..., str],
    operator: Any,
    mpijobs: MPIJobs,
) -> None:
    q = queue({"mpijob.io/gpu-model": gpu_model(crds)}, gpus=8)
    body = queued("remote", q, run_policy={"managedBy": "kueue.x-k8s.io/multikueue"})
    created = mpijobs.create(body)
    kueue.workload(namespace, created["metadata"]["uid"])
    stays(
        lambda: (
            not pods_of(crds, namespace, "remote")
            and not crds.batch.list_namespaced_job(namespace).items
            and not (mpijobs.get("remote").get("status") or {}).get("conditions")
        ),
        duration=5,
        what="no child and no status from this operator",
    )

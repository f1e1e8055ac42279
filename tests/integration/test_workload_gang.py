"""Kubernetes' own gang scheduling (``--gang-scheduling=workload-api``) on the local cluster of
the newest minor, whose control plane runs with ``GenericWorkload`` on (hack/versions.env):
the operator makes each job's Workload and PodGroup (``scheduling.k8s.io/v1beta1``), the real
kube-scheduler binds the gang all or nothing, and the job says where its gang stands.

The four simulated nodes have 8 GPUs each; two held whole leave room for two 8-GPU workers.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from mpijob import keys
from support.gpus import hold
from support.jobs import mpijob
from support.kube import ROOT, Cluster, wait_all_refused
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.tenants import TenantJobs, bind_tenant, can_i
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]
with_the_api = pytest.mark.usefixtures("workload_api")

NATIVE = ("--gang-scheduling", keys.WORKLOAD_GANG_FLAG)
POD_GROUP = (keys.WORKLOAD_API_VERSION, keys.POD_GROUP_KIND)
WORKLOAD = (keys.WORKLOAD_API_VERSION, keys.WORKLOAD_KIND)
HELD = ("gpu-node-0", "gpu-node-1")


def served(cluster: Cluster) -> bool:
    return keys.WORKLOAD_API_VERSION in cluster.kubectl("api-versions").split()


@pytest.fixture
def workload_api(crds: Cluster) -> None:
    """The local cluster of 1.37 serves the API (hack/versions.env FEATURE_GATES); those of 1.35
    and 1.36 (``make test-compat``) do not, and run the start-up refusal below instead."""
    if not served(crds):
        minor = os.environ.get("K8S_VERSION", "")
        assert minor in ("1.35", "1.36"), f"{keys.WORKLOAD_API_VERSION} is not served on {minor}"
        pytest.skip(f"Kubernetes {minor}: the Workload API is not served (make test-compat)")


def test_where_the_api_is_not_served_the_mode_stops_the_start_naming_the_fix(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """A downgrade (1.35, 1.36, or the gate off): ``workload-api`` exits at start-up in one line
    saying what to turn on, and the other backends keep working (test_gang.py)."""
    if served(crds):
        pytest.skip("the API is served here; make test-compat runs this on 1.35")
    refused = OperatorProcess(crds.kubeconfig, namespace, ROOT / ".test-logs", *NATIVE)
    status = refused.exit_status()
    log = refused.logs()
    assert status == 1, log
    assert "Traceback" not in log
    assert "does not serve scheduling.k8s.io/v1beta1 PodGroups" in log
    assert "GenericWorkload" in log
    coscheduling = start_operator("--gang-scheduling", "default-scheduler")
    assert "workload-api" not in coscheduling.logs().split("Gang backends served here:")[1]


def job_pods(cluster: Cluster, ns: str, job: str) -> list[Any]:
    return cluster.core.list_namespaced_pod(ns, label_selector=f"{keys.LABEL_JOB_NAME}={job}").items


def get(cluster: Cluster, kind: tuple[str, str], ns: str, name: str) -> dict[str, Any]:
    return wait_until(
        lambda: cluster.resource(*kind).get(name=name, namespace=ns).to_dict(),
        what=f"{kind[1]} {name}",
    )


def native_with_two_nodes_held(
    cluster: Cluster, namespace: str, start_operator: Any
) -> OperatorProcess:
    """The operator with Kubernetes' own gang, and two of the four nodes' GPUs held whole: room
    for two 8-GPU workers."""
    op: OperatorProcess = start_operator(*NATIVE)
    for node in HELD:
        hold(cluster, namespace, node)
    return op


def free_held(cluster: Cluster, namespace: str) -> None:
    for node in HELD:
        cluster.core.delete_namespaced_pod(f"holder-{node}", namespace, grace_period_seconds=0)


def schedulable_gang_bound_together(
    cluster: Cluster, namespace: str, mpijobs: MPIJobs, job: str, count: int
) -> list[Any]:
    """Every pod of the job bound, and ``GangScheduled=True`` with its Normal Event."""
    pods = wait_until(
        lambda: (
            (pods := job_pods(cluster, namespace, job))
            and len(pods) == count
            and all(p.spec.node_name for p in pods)
            and pods
        ),
        timeout=90,
        what=f"{job}'s {count} pods bound",
    )
    scheduled = mpijobs.wait_condition(job, keys.COND_GANG_SCHEDULED, timeout=30)
    assert scheduled["reason"] == keys.REASON_GANG_SCHEDULED
    assert mpijobs.wait_event(job, keys.REASON_GANG_SCHEDULED)["type"] == "Normal"
    return list(pods)


@with_the_api
def test_a_gang_that_cannot_fit_stays_pending_with_no_pod_bound_then_binds_all_at_once(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    op = native_with_two_nodes_held(crds, namespace, start_operator)
    assert "workload-api (scheduling.k8s.io/v1beta1)" in op.logs()
    # Three whole nodes for the workers, the launcher anywhere: two nodes are free.
    mpijobs.create(mpijob("gang", workers=3, gpus=8))

    group = get(crds, POD_GROUP, namespace, "gang")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}  # the launcher counts
    assert group["spec"]["workloadRef"] == {"workloadName": "gang", "templateName": "mpijob"}
    workload = get(crds, WORKLOAD, namespace, "gang")
    assert workload["spec"]["controllerRef"]["name"] == "gang"
    for obj in (group, workload):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("MPIJob", "gang", True)

    wait_until(lambda: len(job_pods(crds, namespace, "gang")) == 4, what="3 workers + launcher")
    for pod in job_pods(crds, namespace, "gang"):
        assert pod.spec.scheduling_group.pod_group_name == "gang"
        assert pod.spec.scheduler_name == "default-scheduler"
    wait_all_refused(lambda: job_pods(crds, namespace, "gang"), 4, "the gang of 4")
    waiting = wait_until(
        lambda: (
            (c := mpijobs.condition("gang", keys.COND_GANG_SCHEDULED))
            and "the scheduler:" in c["message"]
            and c
        ),
        what="GangScheduled=False quoting the scheduler",
    )
    assert (waiting["status"], waiting["reason"]) == ("False", keys.REASON_GANG_WAITING)
    assert waiting["message"].startswith("0 of the gang's 4 pods bound")

    free_held(crds, namespace)
    pods = schedulable_gang_bound_together(crds, namespace, mpijobs, "gang", 4)
    workers = [p.spec.node_name for p in pods if "worker" in p.metadata.name]
    assert len(set(workers)) == 3, "each 8-GPU worker on a node of its own"
    mpijobs.wait_condition("gang", "Running", timeout=60)


@with_the_api
def test_a_topology_job_binds_through_the_gang_on_the_gpus_its_placement_chose(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """Our admission chooses the GPUs (3 x 8 on three nodes) once they are free; the native gang
    binds the pods together; each worker lands where its decision says, on exactly its GPUs."""
    native_with_two_nodes_held(crds, namespace, start_operator)
    mpijobs.create(
        mpijob(
            "placed",
            workers=3,
            gpus=8,
            annotations={keys.GPU_TOPOLOGY: "true"},
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"},
        )
    )
    waiting = mpijobs.wait_condition("placed", keys.COND_GANG_ADMITTED, status="False")
    assert waiting["reason"] == keys.REASON_GANG_WAITING
    assert not job_pods(crds, namespace, "placed"), "no pod while the gang does not fit"

    free_held(crds, namespace)
    decision = wait_until(lambda: mpijobs.decision("placed"), timeout=60, what="the decision")
    places = [(w["node"], sorted(w["gpus"])) for w in decision["spec"]["workers"]]
    assert [gpus for _, gpus in places] == [list(range(8))] * 3
    group = get(crds, POD_GROUP, namespace, "placed")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    pods = schedulable_gang_bound_together(crds, namespace, mpijobs, "placed", 4)
    by_name = {p.metadata.name: p for p in pods}
    for index, (node, gpus) in enumerate(places):
        worker = by_name[f"placed-worker-{index}"]
        assert worker.spec.node_name == node
        assert worker.spec.scheduling_group.pod_group_name == "placed"
        pinned = worker.metadata.annotations.get(keys.GPU_IDS)
        claims = worker.spec.resource_claims or []
        assert pinned == ",".join(map(str, gpus)) or claims, "the decided GPUs are pinned"
    mpijobs.wait_condition("placed", "Succeeded", timeout=90)


@with_the_api
def test_min_available_is_the_quorum_and_the_job_runs_to_the_end(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """A job without topology, its quorum from ``minAvailable`` (the launcher left out)."""
    start_operator(*NATIVE)
    mpijobs.create(
        mpijob(
            "quorum",
            workers=2,
            gpus=1,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"},
            run_policy={"schedulingPolicy": {"minAvailable": 2}, "cleanPodPolicy": "Running"},
        )
    )
    group = get(crds, POD_GROUP, namespace, "quorum")
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    scheduled = mpijobs.wait_condition("quorum", keys.COND_GANG_SCHEDULED, timeout=60)
    assert scheduled["reason"] == keys.REASON_GANG_SCHEDULED
    mpijobs.wait_condition("quorum", "Succeeded", timeout=90)
    wait_until(
        lambda: not crds.resource(*POD_GROUP).get(namespace=namespace).items,
        what="the PodGroup deleted with the workers at the end",
    )


@with_the_api
def test_an_edited_min_available_reaches_the_pod_group_and_the_scheduler(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """``minCount`` is mutable: the same PodGroup takes the new quorum, and kube-scheduler binds
    the part of the gang that now makes one (two workers and the launcher of three workers)."""
    native_with_two_nodes_held(crds, namespace, start_operator)
    mpijobs.create(mpijob("edit", workers=3, gpus=8))
    wait_until(lambda: len(job_pods(crds, namespace, "edit")) == 4, what="the gang's pods")
    wait_all_refused(lambda: job_pods(crds, namespace, "edit"), 4, "the gang of 4")
    uid = get(crds, POD_GROUP, namespace, "edit")["metadata"]["uid"]
    mpijobs.patch("edit", {"spec": {"runPolicy": {"schedulingPolicy": {"minAvailable": 3}}}})
    group = wait_until(
        lambda: (
            (g := get(crds, POD_GROUP, namespace, "edit"))["spec"]["schedulingPolicy"]["gang"][
                "minCount"
            ]
            == 3
            and g
        ),
        what="minCount 3",
    )
    assert group["metadata"]["uid"] == uid, "the same PodGroup"
    bound = wait_until(
        lambda: (
            len(b := [p for p in job_pods(crds, namespace, "edit") if p.spec.node_name]) == 3 and b
        ),
        timeout=60,
        what="three of the four pods bound",
    )
    assert sum("worker" in p.metadata.name for p in bound) == 2
    mpijobs.wait_condition("edit", keys.COND_GANG_SCHEDULED, timeout=30)


@with_the_api
def test_a_gang_not_bound_within_its_timeout_fails_and_leaves_no_pod(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    native_with_two_nodes_held(crds, namespace, start_operator)
    mpijobs.create(
        mpijob(
            "late",
            workers=3,
            gpus=8,
            run_policy={"schedulingPolicy": {"scheduleTimeoutSeconds": 6}},
        )
    )
    wait_until(lambda: len(job_pods(crds, namespace, "late")) == 4, what="the gang's pods")
    failed = mpijobs.wait_condition("late", "Failed", timeout=60)
    assert failed["reason"] == keys.REASON_GANG_SCHEDULE_TIMEOUT
    assert "not bound within scheduleTimeoutSeconds=6 (0 of 4 pods bound)" in failed["message"]
    scheduled = mpijobs.condition("late", keys.COND_GANG_SCHEDULED)
    assert scheduled is not None
    assert (scheduled["status"], scheduled["reason"]) == ("False", "GangScheduleTimeout")
    assert mpijobs.wait_event("late", keys.REASON_GANG_SCHEDULE_TIMEOUT)["type"] == "Warning"
    # Nothing left to be bound later: workers, launcher pod and PodGroup go; the launcher Job
    # stays, suspended, as the record of the launcher.
    wait_until(lambda: not job_pods(crds, namespace, "late"), what="the gang's pods deleted")
    assert not crds.resource(*POD_GROUP).get(namespace=namespace).items
    assert crds.batch.read_namespaced_job("late-launcher", namespace).spec.suspend is True
    free_held(crds, namespace)
    assert mpijobs.get("late")["status"]["completionTime"]


TENANT = "gang-tenant@example.com"


@with_the_api
def test_a_tenant_can_neither_forge_the_gangs_state_nor_form_it_without_the_scheduler(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """What the job's gang state believes, tried by a tenant (``edit`` and the MPIJob role in
    their own namespace): the PodGroup's condition is the scheduler's to write; a look-alike
    bound pod and a forged ``GangScheduled=True`` count for nothing; a deleted PodGroup is made
    again and the gang still binds only when it fits."""
    start_operator(*NATIVE)
    bind_tenant(crds, namespace, TENANT)
    tenant = TenantJobs(crds, namespace, TENANT)
    assert can_i(crds, TENANT, namespace, "delete", "podgroups.scheduling.k8s.io")
    for verb in ("update", "patch"):
        assert not can_i(
            crds, TENANT, namespace, verb, "podgroups.scheduling.k8s.io", subresource="status"
        ), verb
    for node in (*HELD, "gpu-node-2"):
        hold(crds, namespace, node)
    tenant.create(mpijob("mine", workers=2, gpus=8))  # one node is free: the gang cannot fit
    wait_until(lambda: len(job_pods(crds, namespace, "mine")) == 3, what="the gang's pods")
    mpijobs.wait_condition("mine", keys.COND_GANG_SCHEDULED, status="False")

    # A bound pod labelled as the job's worker, and the job's status saying the gang formed.
    tenant.create_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "look-alike",
                "labels": {
                    keys.LABEL_JOB_NAME: "mine",
                    keys.LABEL_JOB_ROLE: "worker",
                    keys.LABEL_REPLICA_INDEX: "0",
                },
            },
            "spec": {
                "nodeName": "gpu-node-3",
                "containers": [{"name": "c", "image": "busybox"}],
            },
        }
    )
    forged = {
        "type": keys.COND_GANG_SCHEDULED,
        "status": "True",
        "reason": keys.REASON_GANG_SCHEDULED,
        "message": "forged",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "lastUpdateTime": "2026-01-01T00:00:00Z",
    }
    conditions = mpijobs.get("mine")["status"]["conditions"]
    kept = [c for c in conditions if c["type"] != keys.COND_GANG_SCHEDULED]
    tenant.patch_status("mine", {"status": {"conditions": [*kept, forged]}})
    set_back = wait_until(
        lambda: (
            (c := mpijobs.condition("mine", keys.COND_GANG_SCHEDULED))
            and c["status"] == "False"
            and c["message"] != "forged"
            and c
        ),
        what="the forged GangScheduled set back to the scheduler's truth",
    )
    assert set_back["reason"] == keys.REASON_GANG_WAITING
    assert set_back["message"].startswith("0 of the gang's 3 pods bound")

    # The PodGroup deleted: Kubernetes keeps it (its podgroup-protection finalizer) while the
    # pods name it, so the gang is not dissolved; the operator waits on it, writing nothing.
    crds.kubectl(
        "delete",
        "--wait=false",
        f"--as={TENANT}",
        "-n",
        namespace,
        "podgroups.scheduling.k8s.io/mine",
    )
    group = get(crds, POD_GROUP, namespace, "mine")
    assert group["metadata"]["deletionTimestamp"]
    assert "scheduling.k8s.io/podgroup-protection" in group["metadata"]["finalizers"]
    real = [p for p in job_pods(crds, namespace, "mine") if p.metadata.name != "look-alike"]
    assert not any(p.spec.node_name for p in real)

    crds.core.delete_namespaced_pod("look-alike", namespace, grace_period_seconds=0)
    free_held(crds, namespace)
    schedulable_gang_bound_together(crds, namespace, mpijobs, "mine", 3)

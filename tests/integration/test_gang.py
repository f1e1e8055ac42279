"""Gang scheduling on the local cluster: PodGroups for the real Coscheduling scheduler and the
real Volcano scheduler, and our own all-or-nothing admission when no gang scheduler runs.

Counterparts of upstream TestMPIJobWithSchedulerPlugins, TestMPIJobWithVolcanoScheduler and the
e2e "should create pending pods" cases, plus the WaitForWorkersReady deadlock (mpi-operator#608).
"""

from __future__ import annotations

from typing import Any

import pytest

from mpijob import keys
from support.gpus import hold
from support.jobs import mpijob
from support.kube import Cluster, wait_all_refused
from support.mpijobs import MPIJobs
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

SCHED = ("scheduling.x-k8s.io/v1alpha1", "PodGroup")
VOLCANO = ("scheduling.volcano.sh/v1beta1", "PodGroup")


def job_pods(cluster: Cluster, ns: str, job: str, role: str = "") -> list[Any]:
    selector = f"{keys.LABEL_JOB_NAME}={job}" + (f",{keys.LABEL_JOB_ROLE}={role}" if role else "")
    return cluster.core.list_namespaced_pod(ns, label_selector=selector).items


def pod_group(cluster: Cluster, kind: tuple[str, str], ns: str, name: str) -> dict[str, Any]:
    return wait_until(
        lambda: cluster.resource(*kind).get(name=name, namespace=ns).to_dict(),
        what=f"PodGroup {name}",
    )


TWO_NODES = ("gpu-node-0", "gpu-node-1")


def hold_two_nodes(cluster: Cluster, namespace: str) -> None:
    """Take every GPU of two of the four nodes: a gang of three whole nodes cannot fit."""
    for node in TWO_NODES:
        hold(cluster, namespace, node)


def free_two_nodes_and_see_the_gang_run(
    cluster: Cluster, namespace: str, mpijobs: MPIJobs, job: str
) -> None:
    for node in TWO_NODES:
        cluster.core.delete_namespaced_pod(f"holder-{node}", namespace, grace_period_seconds=0)
    wait_until(
        lambda: all(p.spec.node_name for p in job_pods(cluster, namespace, job)),
        timeout=90,
        what="the whole gang bound once capacity freed",
    )
    mpijobs.wait_condition(job, "Running", timeout=60)


def test_coscheduling_keeps_a_gang_that_cannot_fit_pending_then_binds_it_all(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """Counterpart of upstream e2e 'with scheduler-plugins ... should create pending pods'."""
    start_operator("--gang-scheduling", "default-scheduler")
    hold_two_nodes(crds, namespace)
    mpijobs.create(mpijob("gang", workers=3, gpus=8))  # needs three whole nodes; two are free
    group = pod_group(crds, SCHED, namespace, "gang")
    assert group["spec"]["minMember"] == 4
    wait_until(lambda: len(job_pods(crds, namespace, "gang")) == 4, what="3 workers + launcher")
    for p in job_pods(crds, namespace, "gang"):
        assert p.metadata.labels[keys.SCHED_PLUGINS_POD_GROUP_LABEL] == "gang"
        assert p.spec.scheduler_name == "default-scheduler"

    wait_all_refused(lambda: job_pods(crds, namespace, "gang"), 4, "the gang of 4")
    free_two_nodes_and_see_the_gang_run(crds, namespace, mpijobs, "gang")


def test_schedule_timeout_updates_reach_the_pod_group(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """Counterpart of upstream TestMPIJobWithSchedulerPlugins (900 -> 10)."""
    start_operator("--gang-scheduling", "default-scheduler")
    mpijobs.create(
        mpijob("pg", workers=2, run_policy={"schedulingPolicy": {"scheduleTimeoutSeconds": 900}})
    )
    assert pod_group(crds, SCHED, namespace, "pg")["spec"]["scheduleTimeoutSeconds"] == 900
    mpijobs.patch(
        "pg", {"spec": {"runPolicy": {"schedulingPolicy": {"scheduleTimeoutSeconds": 10}}}}
    )
    wait_until(
        lambda: pod_group(crds, SCHED, namespace, "pg")["spec"]["scheduleTimeoutSeconds"] == 10,
        what="scheduleTimeoutSeconds 10",
    )


def test_volcano_pod_group_and_decoration_follow_the_job(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """Counterpart of upstream TestMPIJobWithVolcanoScheduler."""
    start_operator("--gang-scheduling", "volcano")
    mpijobs.create(mpijob("vc", workers=2, run_policy={"schedulingPolicy": {"queue": "default"}}))
    group = pod_group(crds, VOLCANO, namespace, "vc")
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["queue"] == "default"
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("MPIJob", "vc", True)
    wait_until(lambda: len(job_pods(crds, namespace, "vc", "worker")) == 2, what="workers")
    for p in job_pods(crds, namespace, "vc", "worker"):
        assert p.spec.scheduler_name == "volcano"
        assert p.metadata.annotations[keys.VOLCANO_GROUP_NAME_ANNOTATION] == "vc"
    launcher = wait_until(
        lambda: crds.batch.read_namespaced_job("vc-launcher", namespace), what="launcher"
    )
    assert launcher.spec.template.spec.scheduler_name == "volcano"
    mpijobs.patch(
        "vc",
        {
            "spec": {
                "runPolicy": {"schedulingPolicy": {"minAvailable": 2, "queue": "queue-for-mpijob"}}
            }
        },
    )

    def updated() -> bool:
        spec = pod_group(crds, VOLCANO, namespace, "vc")["spec"]
        return spec["minMember"] == 2 and spec["queue"] == "queue-for-mpijob"

    wait_until(updated, what="minAvailable and queue propagated")


def test_volcano_keeps_a_gang_that_cannot_fit_pending_then_binds_it_all(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """The real Volcano scheduler (hack/volcano.py) with our PodGroup: it refuses the group while
    its minResources exceed what is free, binds no pod meanwhile, and binds every pod once the
    capacity frees."""
    start_operator("--gang-scheduling", "volcano")
    hold_two_nodes(crds, namespace)
    mpijobs.create(
        mpijob("vgang", workers=3, gpus=8, run_policy={"schedulingPolicy": {"queue": "default"}})
    )
    wait_until(lambda: len(job_pods(crds, namespace, "vgang")) == 4, what="3 workers + launcher")

    def refused() -> list[dict[str, Any]] | None:
        assert not [p.metadata.name for p in job_pods(crds, namespace, "vgang") if p.spec.node_name]
        status = pod_group(crds, VOLCANO, namespace, "vgang").get("status") or {}
        found = [
            c
            for c in status.get("conditions") or []
            if c["type"] == "Unschedulable" and c["status"] == "True"
        ]
        return found or None

    verdict = wait_until(refused, timeout=60, what="Volcano's verdict: the group does not fit")
    assert verdict[0]["reason"] == "NotEnoughResources", verdict
    free_two_nodes_and_see_the_gang_run(crds, namespace, mpijobs, "vgang")
    bound_by = {
        e.source.component or e.reporting_component
        for e in crds.core.list_namespaced_event(namespace).items
        if e.reason == "Scheduled" and e.involved_object.name.startswith("vgang-")
    }
    assert bound_by == {"volcano"}, bound_by


def test_wait_for_workers_ready_with_a_gang_completes(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """mpi-operator#608: the launcher is not counted in a quorum it cannot join yet."""
    start_operator("--gang-scheduling", "default-scheduler")
    mpijobs.create(
        mpijob(
            "wfr",
            workers=2,
            gpus=1,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"},
            spec={"launcherCreationPolicy": "WaitForWorkersReady"},
            run_policy={"cleanPodPolicy": "Running"},
        )
    )
    assert pod_group(crds, SCHED, namespace, "wfr")["spec"]["minMember"] == 2
    mpijobs.wait_condition("wfr", "Succeeded", timeout=120)
    # At completion the PodGroup goes with the workers (cleanPodPolicy Running), as upstream.
    wait_until(
        lambda: not crds.resource(*SCHED).get(namespace=namespace).items,
        what="PodGroup deleted at completion",
    )


# --- our own admission (no gang scheduler) ------------------------------------------------------

TOPOLOGY = {keys.GPU_TOPOLOGY: "true"}


def test_a_job_that_does_not_fit_waits_without_pods_then_is_admitted_when_another_finishes(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(
        mpijob(
            "big",
            workers=4,
            gpus=8,
            annotations=TOPOLOGY,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "8s"},
            run_policy={"cleanPodPolicy": "Running"},
        )
    )
    mpijobs.wait_condition("big", keys.COND_GANG_ADMITTED)
    mpijobs.create(
        mpijob(
            "next",
            workers=2,
            gpus=4,
            annotations=TOPOLOGY,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"},
        )
    )
    waiting = mpijobs.wait_condition("next", keys.COND_GANG_ADMITTED, status="False")
    assert waiting["reason"] == "GangWaiting"
    wait_until(
        lambda: "needs" in mpijobs.condition("next", keys.COND_GANG_ADMITTED)["message"],
        what="a message saying what is missing",
    )
    assert not job_pods(crds, namespace, "next")
    assert not crds.batch.list_namespaced_job(
        namespace, field_selector="metadata.name=next-launcher"
    ).items

    mpijobs.wait_condition("big", "Succeeded", timeout=90)
    admitted = mpijobs.wait_condition("next", keys.COND_GANG_ADMITTED, timeout=60)
    assert admitted["reason"] == "GangAdmitted"
    mpijobs.wait_event("next", "GangAdmitted")
    mpijobs.wait_condition("next", "Succeeded", timeout=90)


def test_a_job_waiting_past_its_timeout_fails_and_holds_nothing(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(
        mpijob(
            "late",
            workers=5,
            gpus=8,
            annotations=TOPOLOGY,
            run_policy={"schedulingPolicy": {"scheduleTimeoutSeconds": 4}},
        )
    )
    failed = mpijobs.wait_condition("late", "Failed", timeout=60)
    assert failed["reason"] == "GangScheduleTimeout"
    assert "scheduleTimeoutSeconds=4" in failed["message"]
    assert mpijobs.get("late")["status"]["completionTime"]
    warning = mpijobs.wait_event("late", "GangScheduleTimeout")
    assert warning["type"] == "Warning"
    assert not job_pods(crds, namespace, "late")
    assert mpijobs.decision("late") is None


def test_wait_for_workers_ready_under_our_admission_completes(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    """Our admission places the workers; the launcher follows once they are Ready."""
    mpijobs.create(
        mpijob(
            "wfr-own",
            workers=2,
            gpus=4,
            annotations=TOPOLOGY,
            worker_annotations={keys.SIM_READY_AFTER: "3s"},
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"},
            spec={"launcherCreationPolicy": "WaitForWorkersReady"},
        )
    )
    mpijobs.wait_condition("wfr-own", keys.COND_GANG_ADMITTED)
    mpijobs.wait_condition("wfr-own", "Succeeded", timeout=90)

"""MPIJob lifecycles against the real API server, scheduler, Job controller and kwok.

Counterparts of upstream's integration tests (test/integration/mpi_job_controller_test.go) and
of its e2e cases that do not need real images: the children of §2 per MPI implementation,
success with cleanPodPolicy, failure with BackoffLimitExceeded/<reason>, WaitForWorkersReady,
suspend/resume, and garbage collection on delete.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import stays, wait_until

pytestmark = pytest.mark.integration

WORKER_SELECTOR = "training.kubeflow.org/job-role=worker"


def pods(cluster: Cluster, ns: str, job: str, role: str | None = None) -> list[Any]:
    selector = f"{keys.LABEL_JOB_NAME}={job}"
    if role:
        selector += f",{keys.LABEL_JOB_ROLE}={role}"
    return cluster.core.list_namespaced_pod(ns, label_selector=selector).items


def owned_by(obj: Any, uid: str) -> bool:
    refs = obj.metadata.owner_references or []
    return any(
        r.controller and r.block_owner_deletion and r.uid == uid and r.kind == "MPIJob"
        for r in refs
    )


@pytest.mark.parametrize(
    ("implementation", "host_line"),
    [
        ("OpenMPI", "{w}.{job}.{ns}.svc slots=1"),
        ("Intel", "{w}.{job}.{ns}.svc:1"),
        ("MPICH", "{w}.{job}.{ns}.svc:1"),
    ],
)
def test_mpijob_success(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
    implementation: str,
    host_line: str,
) -> None:
    """Counterpart of upstream TestMPIJobSuccess and TestAllResourcesCreated/{impl}.

    Every child of §2 exists, owned by the job; workers run; the launcher runs, is told to
    succeed, and the job becomes Succeeded with upstream's reasons; cleanPodPolicy Running
    deletes the running workers.
    """
    job = mpijob(
        "pi",
        workers=2,
        implementation=implementation,
        launcher_annotations={keys.SIM_SUCCEED_AFTER: "3s"},
        run_policy={"cleanPodPolicy": "Running"},
    )
    uid = mpijobs.create(job)["metadata"]["uid"]
    created = mpijobs.wait_condition("pi", "Created")
    assert created["reason"] == "MPIJobCreated"
    assert created["message"] == f"MPIJob {namespace}/pi is created."

    core = crds.core
    svc = wait_until(lambda: core.read_namespaced_service("pi", namespace), what="Service")
    assert svc.spec.cluster_ip == "None"
    assert owned_by(svc, uid)
    assert svc.spec.selector == {
        keys.LABEL_OPERATOR_NAME: "mpi-operator",
        keys.LABEL_JOB_NAME: "pi",
    }
    cm = core.read_namespaced_config_map("pi-config", namespace)
    assert owned_by(cm, uid)
    expected_hosts = "".join(
        host_line.format(w=f"pi-worker-{i}", job="pi", ns=namespace) + "\n" for i in range(2)
    )
    assert cm.data["hostfile"] == expected_hosts
    secret = core.read_namespaced_secret("pi-ssh", namespace)
    assert secret.type == "kubernetes.io/ssh-auth"
    assert owned_by(secret, uid)
    assert set(secret.data) == {"ssh-privatekey", "ssh-publickey"}

    launcher = wait_until(
        lambda: crds.batch.read_namespaced_job("pi-launcher", namespace), what="launcher Job"
    )
    assert owned_by(launcher, uid)
    workers = wait_until(
        lambda: len(w := pods(crds, namespace, "pi", "worker")) == 2 and w, what="2 worker pods"
    )
    assert sorted(p.metadata.name for p in workers) == ["pi-worker-0", "pi-worker-1"]
    assert all(owned_by(p, uid) for p in workers)
    # The Secret is mounted in workers and the launcher; the ConfigMap in the launcher only.
    assert all(
        any(v.secret and v.secret.secret_name == "pi-ssh" for v in p.spec.volumes) for p in workers
    )
    launcher_volumes = launcher.spec.template.spec.volumes
    assert {v.name for v in launcher_volumes} >= {"ssh-auth", "mpi-job-config"}

    mpijobs.wait_event("pi", "MPIJobRunning", timeout=60)
    running = mpijobs.wait_condition("pi", "Running")
    assert running["message"] == f"MPIJob {namespace}/pi is running."
    # discover_hosts.sh follows the Running workers.
    wait_until(
        lambda: (
            core.read_namespaced_config_map("pi-config", namespace)
            .data["discover_hosts.sh"]
            .count("echo ")
            == 2
        ),
        what="discover_hosts.sh",
    )

    succeeded = mpijobs.wait_condition("pi", "Succeeded", timeout=60)
    assert succeeded["reason"] == "MPIJobSucceeded"
    assert succeeded["message"] == f"MPIJob {namespace}/pi successfully completed."
    status = mpijobs.get("pi")["status"]
    assert status["replicaStatuses"]["Launcher"] == {"succeeded": 1}
    assert status["completionTime"]
    assert status["lastReconcileTime"] >= status["completionTime"]
    assert mpijobs.condition("pi", "Running")["status"] == "False"
    mpijobs.wait_event("pi", "MPIJobSucceeded")
    # cleanPodPolicy Running: the running workers are deleted.
    wait_until(lambda: not pods(crds, namespace, "pi", "worker"), what="workers deleted")
    wait_until(
        lambda: mpijobs.get("pi")["status"]["replicaStatuses"].get("Worker") == {},
        what="Worker status reset",
    )
    assert operator.metric("mpi_operator_jobs_successful_total") == 1
    assert operator.metric("mpi_operator_jobs_created_total") == 1


def test_deleting_an_mpijob_garbage_collects_its_children(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
) -> None:
    mpijobs.create(mpijob("gc", workers=2))
    wait_until(lambda: len(pods(crds, namespace, "gc", "worker")) == 2, what="workers")
    wait_until(lambda: crds.batch.read_namespaced_job("gc-launcher", namespace), what="launcher")
    mpijobs.delete("gc")

    def gone() -> bool:
        core = crds.core
        return (
            not pods(crds, namespace, "gc")
            and not core.list_namespaced_service(namespace).items
            and not [
                c
                for c in core.list_namespaced_config_map(namespace).items
                if c.metadata.name == "gc-config"
            ]
            and not crds.batch.list_namespaced_job(namespace).items
        )

    wait_until(gone, timeout=90, what="children garbage-collected")


def test_mpijob_failure_reports_backoff_limit_exceeded_with_pod_reason(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
) -> None:
    """Counterpart of upstream TestMPIJobFailure and e2e 'has malformed command'.

    A failed launcher pod alone does not fail the job; once the Job's backoff limit is
    exceeded, the MPIJob is Failed with reason BackoffLimitExceeded/<pod reason>.
    """
    job = mpijob(
        "bad",
        workers=1,
        launcher_annotations={keys.SIM_FAIL_AFTER: "1s", keys.SIM_FAIL_REASON: "OOMKilled"},
        run_policy={"backoffLimit": 1},
    )
    mpijobs.create(job)
    failed = mpijobs.wait_condition("bad", "Failed", timeout=120)
    assert failed["reason"] == "BackoffLimitExceeded/OOMKilled"
    # Upstream's message, then (ours) the first pod failure the kubelet reported and the count
    # of the others: kwok's failed launcher containers exit 1 with reason Error.
    assert re.fullmatch(
        r"Job has reached the specified backoff limit: The pod failed: OOMKilled; "
        r"first failure: launcher pod bad-launcher-[a-z0-9]{5} container launcher Error "
        r"\(exit code 1\); 1 other pod failed",
        failed["message"],
    ), failed["message"]
    status = mpijobs.get("bad")["status"]
    assert status["replicaStatuses"]["Launcher"]["failed"] == 2
    assert status["completionTime"]
    warning = mpijobs.wait_event("bad", "BackoffLimitExceeded/OOMKilled")
    assert warning["type"] == "Warning"
    assert warning["component"] == "mpi-job-controller"
    assert operator.metric("mpi_operator_jobs_failed_total") == 1


def test_wait_for_workers_ready_creates_the_launcher_after_every_worker_is_ready(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
) -> None:
    """Counterpart of upstream TestMPIJobWaitWorkers: no launcher until workers are Ready."""
    job = mpijob(
        "wait",
        workers=2,
        worker_annotations={keys.SIM_READY_AFTER: "6s"},
        spec={"launcherCreationPolicy": "WaitForWorkersReady"},
    )
    mpijobs.create(job)

    def running_unready() -> bool:
        ws = pods(crds, namespace, "wait", "worker")
        return len(ws) == 2 and all(p.status.phase == "Running" for p in ws)

    wait_until(running_unready, what="workers Running (not Ready yet)")
    ws = pods(crds, namespace, "wait", "worker")
    assert not all(
        any(c.type == "Ready" and c.status == "True" for c in p.status.conditions) for p in ws
    )
    assert not crds.batch.list_namespaced_job(namespace).items
    status = mpijobs.get("wait").get("status") or {}
    assert "Launcher" not in (status.get("replicaStatuses") or {})

    launcher = wait_until(
        lambda: crds.batch.list_namespaced_job(namespace).items,
        timeout=60,
        what="the launcher Job once workers are Ready",
    )
    assert launcher[0].metadata.name == "wait-launcher"
    for p in pods(crds, namespace, "wait", "worker"):
        assert any(c.type == "Ready" and c.status == "True" for c in p.status.conditions)


def test_suspend_and_resume(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
) -> None:
    """Counterpart of upstream TestMPIJobResumingAndSuspending."""
    job = mpijob("sus", workers=2, run_policy={"suspend": True})
    mpijobs.create(job)
    suspended = mpijobs.wait_condition("sus", "Suspended")
    assert (suspended["reason"], suspended["message"]) == ("MPIJobSuspended", "MPIJob suspended")
    launcher = wait_until(
        lambda: crds.batch.read_namespaced_job("sus-launcher", namespace),
        what="suspended launcher Job",
    )
    assert launcher.spec.suspend is True
    assert not pods(crds, namespace, "sus", "worker")
    assert not mpijobs.get("sus")["status"].get("startTime")
    assert mpijobs.condition("sus", "Running")["message"] == f"MPIJob {namespace}/sus is suspended."

    # Scheduling directives injected while suspended (Kueue does this) reach the launcher.
    mpijobs.patch(
        "sus",
        {
            "spec": {
                "mpiReplicaSpecs": {
                    "Launcher": {
                        "template": {
                            "metadata": {"labels": {"kueue": "flavor-a"}},
                            "spec": {"nodeSelector": {"kubernetes.io/os": "linux"}},
                        }
                    }
                }
            }
        },
    )
    mpijobs.patch("sus", {"spec": {"runPolicy": {"suspend": False}}})
    resumed = mpijobs.wait_condition("sus", "Suspended", status="False")
    assert (resumed["reason"], resumed["message"]) == ("MPIJobResumed", "MPIJob resumed")
    mpijobs.wait_event("sus", "MPIJobResumed")
    wait_until(lambda: len(pods(crds, namespace, "sus", "worker")) == 2, what="workers created")
    launcher = wait_until(
        lambda: (
            (j := crds.batch.read_namespaced_job("sus-launcher", namespace)).spec.suspend is False
            and j
        ),
        what="launcher unsuspended",
    )
    assert launcher.spec.template.metadata.labels["kueue"] == "flavor-a"
    assert launcher.spec.template.spec.node_selector == {"kubernetes.io/os": "linux"}
    assert mpijobs.get("sus")["status"]["startTime"]
    mpijobs.wait_condition("sus", "Running")

    mpijobs.patch("sus", {"spec": {"runPolicy": {"suspend": True}}})
    mpijobs.wait_condition("sus", "Suspended")
    mpijobs.wait_condition("sus", "Running", status="False")
    wait_until(
        lambda: crds.batch.read_namespaced_job("sus-launcher", namespace).spec.suspend,
        what="launcher suspended again",
    )
    wait_until(lambda: not pods(crds, namespace, "sus", "worker"), what="workers deleted")


def test_managed_by_another_controller_is_left_alone(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
) -> None:
    """Counterpart of upstream TestMPIJobManagedExternally."""
    mpijobs.create(mpijob("ext", run_policy={"managedBy": "kueue.x-k8s.io/multikueue"}))
    mpijobs.create(mpijob("ours", run_policy={"managedBy": "kubeflow.org/mpi-operator"}))
    mpijobs.wait_condition("ours", "Created")
    stays(lambda: not mpijobs.get("ext").get("status"), duration=3, what="no status on ext")
    assert not [
        s for s in crds.core.list_namespaced_service(namespace).items if s.metadata.name == "ext"
    ]
    assert not pods(crds, namespace, "ext")


def test_scaling_workers_up_and_down_follows_the_spec(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """Scale up creates the missing workers; scale down deletes the extra ones by name; the
    hostfile follows the replicas and discover_hosts.sh the Running workers."""
    mpijobs.create(mpijob("scale", workers=2))

    def state() -> tuple[list[str], str, int]:
        names = sorted(
            p.metadata.name
            for p in pods(crds, namespace, "scale", "worker")
            if not p.metadata.deletion_timestamp
        )
        data = crds.core.read_namespaced_config_map("scale-config", namespace).data
        return names, data["hostfile"], data["discover_hosts.sh"].count("echo ")

    def at(n: int) -> bool:
        names, hostfile, running = state()
        return (
            names == [f"scale-worker-{i}" for i in range(n)]
            and hostfile.count("slots=1") == n
            and running == n
        )

    wait_until(lambda: at(2), what="2 workers")
    mpijobs.patch("scale", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 4}}}})
    wait_until(lambda: at(4), what="scaled up to 4")
    mpijobs.patch("scale", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 1}}}})
    wait_until(lambda: at(1), timeout=60, what="scaled down to 1")


def test_active_deadline_fails_the_job_with_deadline_exceeded(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """runPolicy.activeDeadlineSeconds goes to the launcher Job; its DeadlineExceeded fails
    the MPIJob with that reason, as upstream."""
    mpijobs.create(mpijob("slow", workers=1, run_policy={"activeDeadlineSeconds": 3}))
    failed = mpijobs.wait_condition("slow", "Failed", timeout=90)
    assert failed["reason"] == "DeadlineExceeded"
    assert (
        crds.batch.read_namespaced_job("slow-launcher", namespace).spec.active_deadline_seconds == 3
    )


def test_ttl_after_finished_deletes_the_launcher_job_only(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """ttlSecondsAfterFinished applies to the launcher Job (upstream #644): the MPIJob stays.
    The operator deletes the Job itself, once the status records the end."""
    mpijobs.create(
        mpijob(
            "ttl",
            workers=1,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"},
            run_policy={"ttlSecondsAfterFinished": 1},
        )
    )
    mpijobs.wait_condition("ttl", "Succeeded", timeout=90)
    wait_until(
        lambda: not crds.batch.list_namespaced_job(namespace).items,
        timeout=90,
        what="the operator deleting the launcher Job after its TTL",
    )
    assert mpijobs.condition("ttl", "Succeeded")["status"] == "True"


def test_clean_pod_policy_none_keeps_the_workers(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    mpijobs.create(
        mpijob(
            "keep",
            workers=2,
            launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"},
            run_policy={"cleanPodPolicy": "None"},
        )
    )
    mpijobs.wait_condition("keep", "Succeeded", timeout=90)
    stays(
        lambda: len(pods(crds, namespace, "keep", "worker")) == 2, duration=5, what="workers kept"
    )

"""Launcher Job and worker Pod shapes: counterpart of upstream ``TestNewLauncherAndWorker``."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.desired.launcher import build_launcher_job, sync_scheduling_directives
from mpijob.desired.worker import build_worker
from support.desired_jobs import OWNER, container, make_job

pytestmark = pytest.mark.unit

SSH_ITEMS = [
    {"key": "ssh-privatekey", "path": "id_rsa"},
    {"key": "ssh-publickey", "path": "id_rsa.pub"},
    {"key": "ssh-publickey", "path": "authorized_keys"},
]
CONFIG_VOLUME = {
    "name": "mpi-job-config",
    "configMap": {
        "name": "foo-config",
        "items": [
            {"key": "hostfile", "path": "hostfile", "mode": 0o444},
            {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555},
        ],
    },
}
OPENMPI_ENV = [
    {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
    {"name": "OMPI_MCA_orte_default_hostfile", "value": "/etc/mpi/hostfile"},
    {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
    {"name": "OMPI_MCA_orte_set_default_slots", "value": "1"},
    {"name": "PRTE_MCA_prte_keep_fqdn_hostnames", "value": "false"},
    {"name": "PRTE_MCA_prte_default_hostfile", "value": "/etc/mpi/hostfile"},
    {"name": "PRTE_MCA_plm_ssh_args", "value": "-o ConnectionAttempts=10"},
    {"name": "PRTE_MCA_prte_set_default_slots", "value": "1"},
]
NO_GPU_ENV = [
    {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": ""},
]


def _labels(role: str, index: str | None = None) -> dict[str, str]:
    labels = {
        "training.kubeflow.org/operator-name": "mpi-operator",
        "training.kubeflow.org/job-name": "foo",
        "training.kubeflow.org/job-role": role,
    }
    if index is not None:
        labels["training.kubeflow.org/replica-index"] = index
    return labels


def _launcher_job(template_labels: dict[str, str], env: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "foo-launcher",
            "namespace": "bar",
            "labels": {"app": "foo"},
            "ownerReferences": [OWNER],
        },
        "spec": {
            "template": {
                "metadata": {"labels": template_labels, "ownerReferences": [OWNER]},
                "spec": {
                    "containers": [
                        {
                            **container("launcher"),
                            "env": env,
                            "volumeMounts": [
                                {"name": "ssh-auth", "mountPath": "/root/.ssh"},
                                {"name": "mpi-job-config", "mountPath": "/etc/mpi"},
                            ],
                        }
                    ],
                    "hostname": "foo-launcher",
                    "subdomain": "foo",
                    "restartPolicy": "OnFailure",
                    "volumes": [
                        {
                            "name": "ssh-auth",
                            "secret": {
                                "secretName": "foo-ssh",
                                "items": SSH_ITEMS,
                                "defaultMode": 0o600,
                            },
                        },
                        CONFIG_VOLUME,
                    ],
                },
            },
            "podReplacementPolicy": "Failed",
        },
    }


def _worker(index: int, label_index: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"foo-worker-{index}",
            "namespace": "bar",
            "labels": _labels("worker", label_index),
            "ownerReferences": [OWNER],
        },
        "spec": {
            "containers": [
                {
                    **container("worker"),
                    "command": ["/usr/sbin/sshd", "-De"],
                    "env": [{"name": "K_MPI_JOB_ROLE", "value": "worker"}],
                    "volumeMounts": [{"name": "ssh-auth", "mountPath": "/root/.ssh"}],
                }
            ],
            "hostname": f"foo-worker-{index}",
            "subdomain": "foo",
            "dnsConfig": {"searches": ["foo.bar.svc.cluster.local"]},
            "restartPolicy": "Never",
            "volumes": [
                {
                    "name": "ssh-auth",
                    "secret": {"secretName": "foo-ssh", "items": SSH_ITEMS, "defaultMode": 0o600},
                }
            ],
        },
    }


def test_new_launcher_and_worker_defaults() -> None:
    """Counterpart of upstream TestNewLauncherAndWorker/defaults."""
    job = make_job()
    launcher, launcher_events = build_launcher_job(job)
    env = [{"name": "K_MPI_JOB_ROLE", "value": "launcher"}, *OPENMPI_ENV, *NO_GPU_ENV]
    assert launcher == _launcher_job(_labels("launcher"), env)
    assert launcher_events == []
    assert build_worker(job, 0) == _worker(0, "0")


def test_new_launcher_and_worker_launcher_as_worker() -> None:
    """Counterpart of upstream TestNewLauncherAndWorker/launcher-as-worker."""
    job = make_job(launcher_as_worker=True)
    launcher, _ = build_launcher_job(job)
    env = [{"name": "K_MPI_JOB_ROLE", "value": "launcher"}, *OPENMPI_ENV]
    assert launcher == _launcher_job(_labels("launcher", "0"), env)
    assert build_worker(job, 0) == _worker(0, "1")


def test_new_launcher_and_worker_overrides() -> None:
    """Counterpart of upstream TestNewLauncherAndWorker/overrides."""
    launcher_template = {
        "metadata": {"labels": {"foo": "bar"}, "annotations": {"foo": "bar"}},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Always",
            "containers": [
                container(
                    "launcher",
                    command=["cmd"],
                    env=[{"name": "FOO", "value": "bar"}],
                    volumeMounts=[{"name": "fool-vol", "mountPath": "/mnt/foo"}],
                ),
                container("sidecar"),
            ],
            "volumes": [{"name": "foo-vol", "emptyDir": {}}],
        },
    }
    worker_template = {
        "metadata": {"labels": {"foo": "bar"}, "annotations": {"foo": "bar"}},
        "spec": {
            "hostNetwork": True,
            "dnsConfig": {"nameservers": ["10.0.0.10"], "searches": ["corp.example"]},
            "containers": [container("worker", args=["run"])],
        },
    }
    job = make_job(
        workers=3,
        implementation="Intel",
        slots=5,
        sshAuthMountPath="/home/mpiuser/.ssh",
        run_policy={"ttlSecondsAfterFinished": 1, "activeDeadlineSeconds": 2, "backoffLimit": 3},
        launcher_template=launcher_template,
        worker_template=worker_template,
    )
    launcher, launcher_events = build_launcher_job(job)
    ssh_volume = {"name": "ssh-auth", "secret": {"secretName": "foo-ssh", "items": SSH_ITEMS}}
    # No ttlSecondsAfterFinished: the operator applies the TTL once the status records the end.
    assert launcher["spec"] == {
        "activeDeadlineSeconds": 2,
        "backoffLimit": 3,
        "template": {
            "metadata": {
                "labels": {"foo": "bar", **_labels("launcher")},
                "annotations": {"foo": "bar"},
                "ownerReferences": [OWNER],
            },
            "spec": {
                "hostNetwork": True,
                "dnsPolicy": "ClusterFirstWithHostNet",
                "restartPolicy": "OnFailure",
                "hostname": "foo-launcher",
                "subdomain": "foo",
                "containers": [
                    container(
                        "launcher",
                        command=["cmd"],
                        env=[
                            {"name": "FOO", "value": "bar"},
                            {"name": "K_MPI_JOB_ROLE", "value": "launcher"},
                            {"name": "I_MPI_HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
                            {
                                "name": "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS",
                                "value": "-o ConnectionAttempts=10",
                            },
                            {"name": "I_MPI_PERHOST", "value": "5"},
                            *NO_GPU_ENV,
                        ],
                        volumeMounts=[
                            {"name": "fool-vol", "mountPath": "/mnt/foo"},
                            {"name": "ssh-auth", "mountPath": "/home/mpiuser/.ssh"},
                            {"name": "mpi-job-config", "mountPath": "/etc/mpi"},
                        ],
                    ),
                    container("sidecar"),
                ],
                "volumes": [{"name": "foo-vol", "emptyDir": {}}, ssh_volume, CONFIG_VOLUME],
            },
        },
        "podReplacementPolicy": "Failed",
    }
    assert [(e.type, e.reason, e.message) for e in launcher_events] == [
        (
            "Warning",
            "SetPodTemplateRestartPolicy",
            "Restart policy in pod template overridden by restart policy in replica spec",
        )
    ]
    worker = build_worker(job, 2)
    assert worker["metadata"] == {
        "name": "foo-worker-2",
        "namespace": "bar",
        "labels": {"foo": "bar", **_labels("worker", "2")},
        "annotations": {"foo": "bar"},
        "ownerReferences": [OWNER],
    }
    assert worker["spec"] == {
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "dnsConfig": {
            "nameservers": ["10.0.0.10"],
            "searches": ["corp.example", "foo.bar.svc.cluster.local"],
        },
        "hostname": "foo-worker-2",
        "subdomain": "foo",
        "restartPolicy": "Never",
        "containers": [
            container(
                "worker",
                args=["run"],
                env=[{"name": "K_MPI_JOB_ROLE", "value": "worker"}],
                volumeMounts=[{"name": "ssh-auth", "mountPath": "/home/mpiuser/.ssh"}],
            )
        ],
        "volumes": [ssh_volume],
    }


def test_launcher_mpich_env_has_no_slots_variable() -> None:
    job = make_job(implementation="MPICH", slots=4)
    env = build_launcher_job(job)[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {"name": "K_MPI_JOB_ROLE", "value": "launcher"},
        {"name": "HYDRA_HOST_FILE", "value": "/etc/mpi/hostfile"},
        {"name": "HYDRA_LAUNCH_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
        *NO_GPU_ENV,
    ]


def test_suspended_job_gets_a_suspended_launcher_and_exit_code_becomes_never() -> None:
    job = make_job(run_policy={"suspend": True})
    job.spec.mpi_replica_specs["Launcher"].restart_policy = "ExitCode"  # type: ignore[index,union-attr]
    launcher, _ = build_launcher_job(job)
    assert launcher["spec"]["suspend"] is True
    assert launcher["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_worker_dns_search_follows_a_given_cluster_domain() -> None:
    worker = build_worker(make_job(), 1, cluster_domain="example.org")
    assert worker["spec"]["dnsConfig"]["searches"] == ["foo.bar.svc.example.org"]


def test_builders_never_modify_the_job() -> None:
    job = make_job(launcher_as_worker=True)
    before = job.model_dump()
    build_launcher_job(job)
    build_worker(job, 0)
    assert job.model_dump() == before


def test_resume_mpi_job_with_existing_launcher_directives() -> None:
    """Counterpart of upstream TestResumeMPIJobWithExistingLauncher (the directive sync)."""
    suspended = make_job(run_policy={"suspend": True})
    live, _ = build_launcher_job(suspended)
    live["spec"]["template"]["spec"]["nodeSelector"] = {"old": "node"}
    live["spec"]["template"]["metadata"]["labels"]["kept"] = "yes"
    launcher_template = {
        "metadata": {"annotations": {"kueue.x-k8s.io/workload": "my-workload"}},
        "spec": {
            "containers": [container("launcher")],
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "schedulingGates": [{"name": "kueue.x-k8s.io/topology"}],
        },
    }
    desired, _ = build_launcher_job(make_job(launcher_template=launcher_template))
    before = repr(live)
    synced = sync_scheduling_directives(live, desired)
    assert repr(live) == before
    template = synced["spec"]["template"]
    assert template["metadata"]["labels"]["kept"] == "yes"
    assert template["metadata"]["annotations"] == {"kueue.x-k8s.io/workload": "my-workload"}
    assert "nodeSelector" not in template["spec"]
    assert template["spec"]["tolerations"] == launcher_template["spec"]["tolerations"]
    assert template["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    assert synced["spec"]["suspend"] is True

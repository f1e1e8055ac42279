"""What ``mpijob get`` and ``mpijob list`` read from jobs and pods."""

from __future__ import annotations

import pytest

from mpijob import keys
from mpijob.console import jobs
from support.console_objects import (
    NOW,
    condition,
    decision_body,
    job_body,
    pod_body,
    topology_job_pods,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("conditions", "status"),
    [
        ([], "PENDING"),
        ([condition("Created")], "PENDING"),
        ([condition("Created"), condition("Running")], "RUNNING"),
        ([condition("Running"), condition("Succeeded")], "SUCCEEDED"),
        ([condition("Running", "False"), condition("Failed")], "FAILED"),
        ([condition("Created"), condition("Suspended")], "SUSPENDED"),
        ([condition("Restarting")], "RESTARTING"),
        ([condition("Running", "False")], "PENDING"),
    ],
)
def test_job_status(conditions: list[dict[str, str]], status: str) -> None:
    assert jobs.job_status(job_body(conditions=conditions)) == status


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m"),
        (192, "3m12s"),
        (600, "10m"),
        (3599, "59m"),
        (3600, "1h"),
        (3660 * 2, "2h2m"),
        (9 * 3600, "9h"),
        (26 * 3600, "1d2h"),
        (12 * 86400 + 5 * 3600, "12d"),
        (-5, "0s"),
    ],
)
def test_human_duration(seconds: float, text: str) -> None:
    assert jobs.human_duration(seconds) == text


def test_duration_runs_from_start_to_completion_or_now() -> None:
    assert jobs.job_duration(job_body(), NOW) == "1m30s"
    finished = job_body(completion="2026-03-01T11:59:00Z")
    assert jobs.job_duration(finished, NOW) == "30s"
    not_started = job_body(start=None)
    assert jobs.job_duration(not_started, NOW) == "2m"


def test_priority_from_the_scheduling_policy_else_the_launcher_else_none() -> None:
    assert jobs.job_priority(job_body(priority_class="high")) == "high"
    body = job_body()
    body["spec"]["mpiReplicaSpecs"] = {
        "Launcher": {"template": {"spec": {"priorityClassName": "low"}}}
    }
    assert jobs.job_priority(body) == "low"
    assert jobs.job_priority(job_body()) == "N/A"


def test_job_view_lists_the_launcher_first_then_workers_by_index() -> None:
    job = job_body()
    view = jobs.job_view(job, topology_job_pods(), NOW, decision=decision_body(job, "1 node"))
    assert [i.name for i in view.instances] == [
        "vgg16-launcher-x7k2p",
        "vgg16-worker-0",
        "vgg16-worker-1",
        "vgg16-worker-2",
        "vgg16-worker-3",
        "vgg16-worker-10",
    ]
    launcher, first = view.instances[0], view.instances[1]
    assert launcher.is_chief
    assert not first.is_chief
    assert (launcher.gpus, launcher.gpu_ids, launcher.node) == (0, "N/A", "gpu-node-1")
    assert (first.gpus, first.gpu_ids, first.node, first.age) == (1, "0", "gpu-node-0", "1m")
    # The spec's 4 workers x 1 GPU; the pods' own requests stay on their rows.
    assert view.gpus == 4
    assert view.launcher_node == "gpu-node-1"
    assert (view.name, view.namespace, view.trainer, view.placement) == (
        "vgg16",
        "team-a",
        "MPIJOB",
        "1 node",
    )


@pytest.mark.parametrize(
    ("changes", "status"),
    [
        ({"status": {"phase": "Running"}}, "Running"),
        ({"status": {"phase": "Succeeded"}}, "Completed"),
        ({"status": {"phase": "Failed", "reason": "Evicted"}}, "Evicted"),
        ({"status": {"phase": "Failed"}}, "Failed"),
        ({"status": {}}, "Pending"),
        (
            {
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull"}}}],
                }
            },
            "ErrImagePull",
        ),
    ],
)
def test_pod_status(changes: dict[str, object], status: str) -> None:
    assert jobs.pod_status({**pod_body("p"), **changes}) == status


def test_a_deleted_pod_is_terminating() -> None:
    pod = pod_body("p")
    pod["metadata"]["deletionTimestamp"] = "2026-03-01T11:59:59Z"
    assert jobs.pod_status(pod) == "Terminating"


def test_pod_gpus_sums_containers_and_falls_back_to_requests() -> None:
    pod = pod_body("p", gpus=2)
    pod["spec"]["containers"].append(
        {"name": "side", "resources": {"requests": {keys.GPU_RESOURCE: "1"}}}
    )
    assert jobs.pod_gpus(pod) == 3


def test_job_views_give_each_job_its_own_pods() -> None:
    pods = [*topology_job_pods(), pod_body("resnet-worker-0", job="resnet", gpus=2)]
    bodies = [job_body("vgg16"), job_body("resnet", workers=1, gpus=2), job_body("idle", gpus=0)]
    views = jobs.job_views(bodies, pods, NOW)
    assert [(v.name, v.gpus, len(v.instances)) for v in views] == [
        ("idle", 0, 0),
        ("resnet", 2, 1),
        ("vgg16", 4, 6),
    ]


def test_job_views_keep_same_named_jobs_of_two_namespaces_apart() -> None:
    pods = [
        pod_body("vgg16-worker-0", namespace="team-b", node="gpu-node-2"),
        pod_body("vgg16-launcher-b", namespace="team-b", role=keys.ROLE_LAUNCHER, gpus=0),
        *topology_job_pods(),
    ]
    bodies = [job_body("vgg16", namespace="team-b", workers=1), job_body("vgg16")]
    views = jobs.job_views(bodies, pods, NOW)
    assert [(v.namespace, v.name, v.gpus, len(v.instances)) for v in views] == [
        ("team-a", "vgg16", 4, 6),
        ("team-b", "vgg16", 1, 2),
    ]


@pytest.mark.parametrize(
    ("workers", "gpus", "launcher_gpus", "expected"),
    [(4, 1, 0, 4), (2, 8, 0, 16), (3, 2, 2, 8), (2, 0, 0, 0), (0, 4, 1, 1)],
)
def test_requested_gpus_are_workers_times_their_gpus_plus_the_launchers(
    workers: int, gpus: int, launcher_gpus: int, expected: int
) -> None:
    body = job_body(workers=workers, gpus=gpus, launcher_gpus=launcher_gpus)
    assert jobs.requested_gpus(body) == expected


def test_a_launcher_that_runs_ranks_counts_the_gpus_its_template_requests() -> None:
    body = job_body(workers=3, gpus=2, launcher_gpus=2)
    body["spec"]["runLauncherAsWorker"] = True
    assert jobs.requested_gpus(body) == 8


def test_requested_gpus_follow_upstream_replica_defaults_and_skip_bad_quantities() -> None:
    body = job_body(workers=2, gpus=1, launcher_gpus=1)
    specs = body["spec"]["mpiReplicaSpecs"]
    del specs[keys.REPLICA_LAUNCHER]["replicas"]  # the launcher defaults to 1
    assert jobs.requested_gpus(body) == 3
    del specs[keys.REPLICA_WORKER]["replicas"]  # workers default to 0
    assert jobs.requested_gpus(body) == 1
    specs[keys.REPLICA_WORKER]["replicas"] = 2
    worker = specs[keys.REPLICA_WORKER]["template"]["spec"]["containers"][0]
    worker["resources"] = {"requests": {keys.GPU_RESOURCE: "2"}}
    assert jobs.requested_gpus(body) == 5
    worker["resources"] = {"limits": {keys.GPU_RESOURCE: "lots"}}
    assert jobs.requested_gpus(body) == 1
    assert jobs.requested_gpus({"spec": {}}) == 0


def test_a_finished_job_whose_pods_are_gone_still_shows_the_gpus_it_requested() -> None:
    done = job_body(
        conditions=[condition("Running", "False"), condition("Succeeded")],
        completion="2026-03-01T11:59:40Z",
        workers=4,
        gpus=2,
    )
    view = jobs.job_view(done, [], NOW)
    assert (view.status, view.gpus, view.instances) == ("SUCCEEDED", 8, ())


def test_a_decision_written_for_an_earlier_job_of_the_same_name_is_not_shown() -> None:
    job = job_body()
    stale = decision_body(job, "1 node", uid="uid-earlier")
    assert jobs.job_view(job, [], NOW, decision=stale).placement is None

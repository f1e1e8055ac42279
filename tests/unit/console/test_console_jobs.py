"""What ``mpijob get`` and ``mpijob list`` read from jobs and pods."""

from __future__ import annotations

import pytest
from console_fixtures import NOW, condition, job_body, pod_body, topology_job_pods

from mpijob import keys
from mpijob.console import jobs

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
    view = jobs.job_view(job_body(placement="1 node"), topology_job_pods(), NOW)
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
    assert view.gpus == 5
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
    views = jobs.job_views([job_body("vgg16"), job_body("resnet"), job_body("idle")], pods, NOW)
    assert [(v.name, v.gpus, len(v.instances)) for v in views] == [
        ("idle", 0, 0),
        ("resnet", 2, 1),
        ("vgg16", 5, 6),
    ]

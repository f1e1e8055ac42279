"""PodGroup construction: counterparts of upstream ``pkg/controller/podgroup_test.go``."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.desired import podgroup
from mpijob.desired.gang_mode import OFF, GangKind, GangMode
from support.gang_jobs import job, template

pytestmark = pytest.mark.unit

VOLCANO = GangMode.from_flag("volcano")
SCHED = GangMode.from_flag("default-scheduler")
MIN_RESOURCES = {"cpu": "100", "memory": "512Gi", "example.com/gpu": "40"}
OWNER = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "name": "test",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}

NEW_POD_GROUP_CASES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "all schedulingPolicy fields are set": (
        job(
            annotations={"scheduling.volcano.sh/queue-name": "project-x"},
            policy={
                "minAvailable": 2,
                "queue": "project-y",
                "priorityClass": "high",
                "minResources": MIN_RESOURCES,
                "scheduleTimeoutSeconds": 100,
            },
            launcher=template({"cpu": "1", "memory": "2Gi"}),
            worker=template({"cpu": "10", "memory": "20Gi"}),
            workers=1000,
        ),
        {
            "minMember": 2,
            "queue": "project-y",
            "priorityClassName": "high",
            "minResources": MIN_RESOURCES,
        },
        {"minMember": 2, "minResources": MIN_RESOURCES, "scheduleTimeoutSeconds": 100},
    ),
    "schedulingPolicy is nil": (
        job(
            annotations={"scheduling.volcano.sh/queue-name": "project-x"},
            launcher=template({"cpu": "1", "memory": "2Gi"}, priority_class="high"),
            worker=template({"cpu": "10", "memory": "20Gi"}),
            workers=2,
        ),
        {
            "minMember": 3,
            "queue": "project-x",
            "priorityClassName": "high",
            "minResources": {"cpu": "21", "memory": "42Gi"},
        },
        {
            "minMember": 3,
            "scheduleTimeoutSeconds": 0,
            "minResources": {"cpu": "21", "memory": "42Gi"},
        },
    ),
    "no worker no MinResources": (
        job(
            annotations={"scheduling.volcano.sh/queue-name": "project-x"},
            runLauncherAsWorker=True,
            policy={
                "minAvailable": 1,
                "queue": "project-y",
                "priorityClass": "high",
                "scheduleTimeoutSeconds": 100,
            },
            launcher=template({"cpu": "1", "memory": "2Gi"}),
        ),
        {
            "minMember": 1,
            "queue": "project-y",
            "priorityClassName": "high",
            "minResources": {"cpu": "1", "memory": "2Gi"},
        },
        {
            "minMember": 1,
            "minResources": {"cpu": "1", "memory": "2Gi"},
            "scheduleTimeoutSeconds": 100,
        },
    ),
}


@pytest.mark.parametrize(
    ("mpi_job", "volcano_spec", "sched_spec"),
    NEW_POD_GROUP_CASES.values(),
    ids=NEW_POD_GROUP_CASES.keys(),
)
def test_new_pod_group(
    mpi_job: Any, volcano_spec: dict[str, Any], sched_spec: dict[str, Any]
) -> None:
    """Counterpart of upstream TestNewPodGroup (all three cases, both modes)."""
    volcano = podgroup.build_pod_group(mpi_job, mode=VOLCANO, priority_values={})
    sched = podgroup.build_pod_group(mpi_job, mode=SCHED, priority_values={})

    metadata = {"name": "test", "namespace": "default", "ownerReferences": [OWNER]}
    assert volcano == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": volcano_spec,
    }
    assert sched == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": sched_spec,
    }


@pytest.mark.parametrize(
    ("policy", "launcher", "worker", "expected"),
    [
        pytest.param({"priorityClass": "high"}, {}, None, "high", id="use schedulingPolicy"),
        pytest.param(
            None,
            template(priority_class="high"),
            template(priority_class="low"),
            "high",
            id="use launcher",
        ),
        pytest.param(None, template(), template(priority_class="low"), "low", id="use worker"),
        pytest.param(None, template(), template(), "", id="nothing"),
    ],
)
def test_calc_priority_class_name(
    policy: dict[str, Any] | None,
    launcher: dict[str, Any],
    worker: dict[str, Any] | None,
    expected: str,
) -> None:
    """Counterpart of upstream TestCalcPriorityClassName."""
    mpi_job = job(policy=policy, launcher=launcher, worker=worker, workers=1)
    assert podgroup.priority_class_name(mpi_job) == expected


def test_decorate_pod_template_spec() -> None:
    """Counterpart of upstream TestDecoratePodTemplateSpec: set schedulerName and podGroup name."""
    volcano = podgroup.decorate_pod({}, "test-mpijob", VOLCANO)
    sched = podgroup.decorate_pod({}, "test-mpijob", SCHED)

    assert volcano == {
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": "test-mpijob"}},
        "spec": {"schedulerName": "volcano"},
    }
    assert sched == {
        "metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "test-mpijob"}},
        "spec": {"schedulerName": "default-scheduler"},
    }


@pytest.mark.parametrize(
    ("mpi_job", "expected"),
    [
        pytest.param(
            job(policy={"minAvailable": 2}, workers=1000), 2, id="minAvailable isn't empty"
        ),
        pytest.param(job(workers=99), 100, id="minAvailable is empty"),
    ],
)
def test_calculate_min_available(mpi_job: Any, expected: int) -> None:
    """Counterpart of upstream TestCalculateMinAvailable."""
    assert podgroup.min_member(mpi_job) == expected


def test_min_member_counts_the_launcher_also_when_it_is_a_worker() -> None:
    """Upstream adds 1 for the launcher even with runLauncherAsWorker."""
    assert podgroup.min_member(job(workers=4, runLauncherAsWorker=True)) == 5


def test_queue_falls_back_to_the_annotation_then_empty() -> None:
    annotated = {"scheduling.volcano.sh/queue-name": "project-x"}
    assert podgroup.queue_name(job(annotations=annotated, policy={"queue": "y"})) == "y"
    assert podgroup.queue_name(job(annotations=annotated)) == "project-x"
    assert podgroup.queue_name(job()) == ""


def test_volcano_pod_group_leaves_out_empty_queue_priority_and_zero_min_member() -> None:
    """Go's omitempty: an unset queue, priority class or a zero minMember is not written."""
    built = podgroup.build_pod_group(
        job(policy={"minAvailable": 0}), mode=VOLCANO, priority_values={}
    )
    assert built["spec"] == {}


def test_sched_pod_group_leaves_out_empty_min_resources() -> None:
    """scheduler-plugins' minResources is a value with omitempty; Volcano's is a pointer."""
    bare = job(workers=2)
    assert podgroup.build_pod_group(bare, mode=SCHED, priority_values={})["spec"] == {
        "minMember": 3,
        "scheduleTimeoutSeconds": 0,
    }
    volcano = podgroup.build_pod_group(bare, mode=VOLCANO, priority_values={})
    assert volcano["spec"] == {"minMember": 3, "minResources": {}}


def test_build_pod_group_refuses_when_gang_scheduling_is_off() -> None:
    with pytest.raises(ValueError, match="off"):
        podgroup.build_pod_group(job(workers=1), mode=OFF, priority_values={})


def test_build_pod_group_reports_a_malformed_quantity() -> None:
    bad = job(policy={"minResources": {"cpu": "lots"}}, workers=1)
    with pytest.raises(ValueError, match="lots"):
        podgroup.build_pod_group(bad, mode=SCHED, priority_values={})


def test_gang_flag_values() -> None:
    """``--gang-scheduling``: empty is off, volcano is Volcano, anything else names a scheduler."""
    assert not GangMode.from_flag("").enabled
    assert GangMode.from_flag("volcano") == GangMode(GangKind.VOLCANO, "volcano")
    assert GangMode.from_flag("scheduler-plugins-scheduler") == GangMode(
        GangKind.SCHEDULER_PLUGINS, "scheduler-plugins-scheduler"
    )


def test_gang_mode_names_the_pod_group_api() -> None:
    assert VOLCANO.pod_group_api_version == "scheduling.volcano.sh/v1beta1"
    assert SCHED.pod_group_api_version == "scheduling.x-k8s.io/v1alpha1"
    assert OFF.pod_group_api_version is None


def test_malformed_min_resources_are_reported_with_their_field() -> None:
    """Upstream's CRD accepts any string in minResources; we name the field instead of failing."""
    bad = job(workers=1, policy={"minResources": {"cpu": "lots", "memory": "1Gi"}})
    errors = podgroup.min_resources_errors(bad)
    assert [e.path for e in errors] == ["spec.runPolicy.schedulingPolicy.minResources[cpu]"]
    assert "lots" in str(errors[0])

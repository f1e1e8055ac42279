"""Kubernetes' own gang (``--gang-scheduling=workload-api``): the objects, the pods' decoration,
the sync's writes, and the job's gang state read from the scheduler's work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.api.models import JobCondition
from mpijob.desired import observed, podgroup, status, sync
from mpijob.desired.gang_mode import GangKind, GangMode
from mpijob.desired.observed import Observed
from mpijob.gang import native
from mpijob.placement import fabric_labels
from support.gang_jobs import job

pytestmark = pytest.mark.unit

NATIVE = GangMode.from_flag("workload-api")
T0 = datetime(2026, 11, 29, tzinfo=UTC)


def _stored(**kw: Any) -> MPIJob:
    mpi_job = job(**kw)
    mpi_job.metadata.creation_timestamp = T0
    return mpi_job


def _pod(name: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    return {"metadata": {"name": name}, "spec": spec}


def _unschedulable(message: str) -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {
                    "type": "PodGroupInitiallyScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ]
        }
    }


def test_the_flag_value_selects_the_workload_api_and_no_scheduler_name() -> None:
    assert NATIVE.kind is GangKind.WORKLOAD_API
    assert NATIVE.scheduler_name == ""
    assert NATIVE.pod_group_api_version == "scheduling.k8s.io/v1beta1"
    # Any other name is still a scheduler-plugins profile, as upstream reads it.
    assert GangMode.from_flag("workload").kind is GangKind.SCHEDULER_PLUGINS


def test_workload_and_pod_group_carry_the_quorum_with_the_launcher_counted() -> None:
    mpi_job = job(workers=3)
    group = podgroup.build_pod_group(mpi_job, mode=NATIVE, priority_values={})
    workload = podgroup.build_workload(mpi_job)
    assert group["apiVersion"] == workload["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert group["spec"] == {
        "workloadRef": {"workloadName": "test", "templateName": "mpijob"},
        "schedulingPolicy": {"gang": {"minCount": 4}},
    }
    assert workload["spec"]["controllerRef"] == {
        "apiGroup": "kubeflow.org",
        "kind": "MPIJob",
        "name": "test",
    }
    assert workload["spec"]["podGroupTemplates"] == [
        {"name": "mpijob", "schedulingPolicy": {"gang": {"minCount": 4}}}
    ]
    for obj in (group, workload):
        assert obj["metadata"]["ownerReferences"][0]["controller"] is True


def test_min_available_is_the_quorum_and_zero_means_no_gang() -> None:
    two = podgroup.build_pod_group(
        job(workers=3, policy={"minAvailable": 2}), mode=NATIVE, priority_values={}
    )
    assert two["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    none = podgroup.build_pod_group(
        job(workers=3, policy={"minAvailable": 0}), mode=NATIVE, priority_values={}
    )
    assert none["spec"]["schedulingPolicy"] == {"basic": {}}


def test_wait_for_workers_ready_leaves_the_launcher_out_of_the_quorum() -> None:
    mpi_job = job(workers=3, launcherCreationPolicy="WaitForWorkersReady")
    group = podgroup.build_pod_group(mpi_job, mode=NATIVE, priority_values={})
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}


def test_pods_name_their_group_and_keep_their_scheduler() -> None:
    pod = {"metadata": {"labels": {"a": "b"}}, "spec": {"schedulerName": "my-scheduler"}}
    decorated = podgroup.decorate_pod(pod, "test", NATIVE)
    assert decorated["spec"] == {
        "schedulerName": "my-scheduler",
        "schedulingGroup": {"podGroupName": "test"},
    }
    assert decorated["metadata"] == {"labels": {"a": "b"}}
    assert "schedulingGroup" not in pod["spec"]


def test_what_the_api_server_fills_in_is_no_difference_but_a_quorum_is() -> None:
    mpi_job = job(workers=3)
    desired = podgroup.build_pod_group(mpi_job, mode=NATIVE, priority_values={})
    existing = {**desired, "spec": {**desired["spec"], "disruptionMode": {"all": {}}}}
    assert not podgroup.pod_group_needs_update(existing, desired)
    fewer = podgroup.build_pod_group(
        job(workers=3, policy={"minAvailable": 2}), mode=NATIVE, priority_values={}
    )
    assert podgroup.pod_group_needs_update(existing, fewer)


def _plan(mpi_job: MPIJob, seen: Observed) -> sync.Plan:
    return sync.plan(mpi_job, seen, T0, sync.Options(gang=NATIVE))


def _actions(plan: sync.Plan, kind: str) -> list[Any]:
    out = []
    for action in plan.actions:
        obj = getattr(action, "obj", None)
        if (obj or {}).get("kind") == kind or getattr(action, "kind", None) == kind:
            out.append(action)
    return out


def test_a_sync_creates_workload_pod_group_and_decorated_pods() -> None:
    plan = _plan(_stored(workers=2), Observed())
    (workload,) = _actions(plan, "Workload")
    (group,) = _actions(plan, "PodGroup")
    assert isinstance(workload, sync.Create)
    assert isinstance(group, sync.Create)
    pods = _actions(plan, "Pod")
    assert len(pods) == 2
    for create in pods:
        assert create.obj["spec"]["schedulingGroup"] == {"podGroupName": "test"}
    (launcher,) = _actions(plan, "Job")
    template = launcher.obj["spec"]["template"]
    assert template["spec"]["schedulingGroup"] == {"podGroupName": "test"}


def test_a_pod_group_of_another_quorum_gets_the_quorum_patched() -> None:
    """``minCount`` is the one mutable field (1.37): the PodGroup stays, its pods keep it."""
    old = podgroup.build_pod_group(job(workers=5), mode=NATIVE, priority_values={})
    (patch,) = _actions(_plan(_stored(workers=2), Observed(pod_group=old)), "PodGroup")
    assert isinstance(patch, sync.Patch)
    assert patch.patch == {"spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}}


def test_a_pod_group_that_differs_otherwise_is_deleted_to_be_made_again() -> None:
    mpi_job = _stored(workers=2, policy={"minAvailable": 0})  # no gang: a basic policy
    old = podgroup.build_pod_group(job(workers=5), mode=NATIVE, priority_values={})
    old["metadata"]["uid"] = "pg-1"
    (delete,) = _actions(_plan(mpi_job, Observed(pod_group=old)), "PodGroup")
    assert isinstance(delete, sync.Delete)
    assert delete.uid == "pg-1"
    old["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    # Kubernetes keeps a PodGroup its pods name (a finalizer): no second delete each sync.
    assert not _actions(_plan(mpi_job, Observed(pod_group=old)), "PodGroup")


def test_unbound_pods_wait_quoting_the_scheduler_and_requeue_for_the_deadline() -> None:
    mpi_job = _stored(workers=2, policy={"scheduleTimeoutSeconds": 60})
    group = _unschedulable("minCount (3) cannot be satisfied:  2 scheduled")
    state = native.gang_state(mpi_job, group, [_pod("w0"), _pod("w1"), _pod("l")], T0)
    assert state.outcome is not None
    (change,) = state.outcome.conditions
    assert (change.type, change.status, change.reason) == ("GangScheduled", "False", "GangWaiting")
    assert change.message.startswith("0 of the gang's 3 pods bound")
    assert change.message.endswith("the scheduler: minCount (3) cannot be satisfied: 2 scheduled")
    assert state.outcome.event is None
    assert state.requeue_after == 60


def test_a_long_scheduler_message_is_cut() -> None:
    mpi_job = _stored(workers=2)
    state = native.gang_state(mpi_job, _unschedulable("x" * 5000), [], T0)
    assert state.outcome is not None
    assert len(state.outcome.conditions[0].message) < 500
    assert state.requeue_after is None  # no timeout: no deadline


def test_the_bound_quorum_is_scheduled_and_stays_so_while_the_scheduler_says_it() -> None:
    mpi_job = _stored(workers=2)
    pods = [_pod("w0", "n0"), _pod("w1", "n1"), _pod("l", "n2")]
    state = native.gang_state(mpi_job, None, pods, T0)
    assert state.outcome is not None
    (change,) = state.outcome.conditions
    assert (change.status, change.reason) == ("True", "GangScheduled")
    assert state.outcome.event is not None
    assert state.outcome.event.reason == "GangScheduled"
    result = status.next_status(mpi_job, Observed(), T0, gang=state.outcome)
    assert result.status.condition("GangScheduled").status == "True"  # type: ignore[union-attr]

    # Its pods gone (finished), the scheduler's condition still says the gang was formed.
    group = {"status": {"conditions": [{"type": "PodGroupInitiallyScheduled", "status": "True"}]}}
    later = native.gang_state(mpi_job, group, [], T0)
    assert later.outcome is not None
    assert later.outcome.conditions[0].status == "True"


def test_the_jobs_own_condition_is_not_believed() -> None:
    """A tenant's GangScheduled=True on their job's status is set back to what the scheduler
    did; a look-alike pod of theirs is not counted (the caller passes the controlled pods)."""
    mpi_job = _stored(workers=2)
    mpi_job.status.conditions.append(
        JobCondition(type="GangScheduled", status="True", reason="GangScheduled", message="x")
    )
    state = native.gang_state(mpi_job, _unschedulable("no room"), [], T0)
    assert state.outcome is not None
    assert state.outcome.conditions[0].status == "False"
    result = status.next_status(mpi_job, Observed(), T0, gang=state.outcome)
    assert result.status.condition("GangScheduled").status == "False"  # type: ignore[union-attr]


def test_past_the_deadline_the_job_fails_and_its_pods_and_group_go() -> None:
    mpi_job = _stored(workers=2, policy={"scheduleTimeoutSeconds": 30})
    now = T0 + timedelta(seconds=30)
    state = native.gang_state(mpi_job, None, [_pod("w0", "n0")], now)
    assert state.outcome is not None
    assert state.outcome.failed
    assert [c.type for c in state.outcome.conditions] == ["GangScheduled", "Failed"]
    assert "not bound within scheduleTimeoutSeconds=30 (1 of 3 pods bound)" in (
        state.outcome.conditions[0].message
    )
    result = status.next_status(mpi_job, Observed(), now, gang=state.outcome)
    assert result.status.finished
    failed = mpi_job.model_copy(update={"status": result.status})
    workers = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"test-worker-{i}",
                "namespace": "default",
                "uid": f"u{i}",
                "labels": {
                    keys.LABEL_JOB_NAME: "test",
                    keys.LABEL_JOB_ROLE: "worker",
                    keys.LABEL_REPLICA_INDEX: str(i),
                },
                "ownerReferences": [{"uid": "uid-1", "controller": True, "kind": "MPIJob"}],
            },
            "spec": {},
            "status": {"phase": "Pending"},
        }
        for i in range(2)
    ]
    group = podgroup.build_pod_group(mpi_job, mode=NATIVE, priority_values={})
    assert native.expired(mpi_job, group, workers, now)
    launcher = {"metadata": {"name": "test-launcher"}, "spec": {}}
    seen = Observed(pods=workers, pod_group=group, launcher_job=launcher)
    plan = sync.plan(failed, seen, now, sync.Options(gang=NATIVE, gang_expired=True))
    assert len(_actions(plan, "Pod")) == 2  # cleanPodPolicy None would have kept them
    assert len(_actions(plan, "PodGroup")) == 1
    (suspend,) = _actions(plan, "Job")
    assert suspend.patch == {"spec": {"suspend": True}}


def test_expiry_is_read_from_the_scheduler_and_the_spec_never_the_status() -> None:
    """A gang past its deadline that formed, or whose PodGroup is already going, has not
    expired; and a status a tenant wrote (Failed with reason GangScheduleTimeout) on a job whose
    gang did not expire removes nothing."""
    mpi_job = _stored(workers=2, policy={"scheduleTimeoutSeconds": 30})
    now = T0 + timedelta(seconds=60)
    group = podgroup.build_pod_group(mpi_job, mode=NATIVE, priority_values={})
    assert not native.expired(mpi_job, group, [], T0 + timedelta(seconds=29))
    bound = [_pod("w0", "n0"), _pod("w1", "n1"), _pod("l", "n2")]
    assert not native.expired(mpi_job, group, bound, now)
    scheduled = {**group, "status": {"conditions": [
        {"type": "PodGroupInitiallyScheduled", "status": "True"}
    ]}}  # fmt: skip
    assert not native.expired(mpi_job, scheduled, [], now)
    going = {
        **group,
        "metadata": {**group["metadata"], "deletionTimestamp": "2026-11-29T00:00:00Z"},
    }
    assert not native.expired(mpi_job, going, [], now)
    assert not native.expired(mpi_job, None, [], now)

    forged = _stored(workers=2)
    for type_ in ("GangScheduled", "Failed"):
        forged.status.conditions.append(
            JobCondition(type=type_, status="False" if type_ == "GangScheduled" else "True",
                         reason="GangScheduleTimeout", message="forged")
        )  # fmt: skip
    forged.status.completion_time = T0
    seen = Observed(pod_group=group, pods=[], launcher_job={"metadata": {"name": "test-launcher"}})
    plan = sync.plan(forged, seen, now, sync.Options(gang=NATIVE))
    assert not _actions(plan, "PodGroup")
    assert not _actions(plan, "Job")


def test_a_finished_or_suspended_job_has_nothing_to_say() -> None:
    mpi_job = _stored(workers=2, policy={"minAvailable": 3})
    mpi_job.spec.run_policy.suspend = True
    assert native.gang_state(mpi_job, None, [], T0).outcome is None
    done = _stored(workers=2)
    done.status.conditions.append(
        JobCondition(type="Succeeded", status="True", reason="x", message="y")
    )
    done.status.completion_time = T0
    assert native.gang_state(done, None, [], T0).outcome is None


def _member(name: str, role: str, owner_uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {keys.LABEL_JOB_NAME: "test", keys.LABEL_JOB_ROLE: role},
            "ownerReferences": [{"uid": owner_uid, "controller": True}],
        },
        "spec": {"nodeName": "n0"},
    }


def test_gang_members_are_the_pods_the_job_and_its_launcher_job_control() -> None:
    mpi_job = _stored(workers=1)
    launcher_job = {"metadata": {"name": "test-launcher", "uid": "job-uid"}}
    pods = [
        _member("test-worker-0", "worker", "uid-1"),
        _member("test-launcher-abc", "launcher", "job-uid"),
        _member("look-alike-worker", "worker", "someone-else"),
        _member("look-alike-launcher", "launcher", "someone-else"),
    ]
    members = observed.gang_members(mpi_job, pods, launcher_job)
    assert [m["metadata"]["name"] for m in members] == ["test-worker-0", "test-launcher-abc"]
    assert [m["metadata"]["name"] for m in observed.gang_members(mpi_job, pods, None)] == [
        "test-worker-0"
    ]


FABRIC = fabric_labels.fabric_from_spec(
    {
        "levels": [
            {"name": "block", "nodeLabel": "example.com/block", "gbps": 25},
            {"name": "leaf", "nodeLabel": "example.com/leaf", "gbps": 50},
        ]
    }
)


@pytest.mark.parametrize(
    ("annotations", "key"),
    [
        ({keys.FABRIC_REQUIRED_LEVEL: "leaf"}, "example.com/leaf"),
        ({keys.FABRIC_REQUIRED_LEVEL: "node"}, "kubernetes.io/hostname"),
        ({keys.FABRIC_PREFERRED_LEVEL: "leaf"}, ""),  # kube-scheduler's constraint is required
        ({}, ""),
    ],
)
def test_a_required_fabric_level_becomes_kube_schedulers_topology_constraint(
    annotations: dict[str, str], key: str
) -> None:
    mpi_job = job(workers=2, annotations=annotations)
    assert native.topology_key(mpi_job, FABRIC) == key
    assert native.topology_key(mpi_job, None) == ""
    group = podgroup.build_pod_group(mpi_job, mode=NATIVE, priority_values={}, topology_key=key)
    workload = podgroup.build_workload(mpi_job, key)
    (template,) = workload["spec"]["podGroupTemplates"]
    if key:
        constraint = {"topology": [{"key": key}]}
        assert group["spec"]["schedulingConstraints"] == constraint
        assert template["schedulingConstraints"] == constraint
    else:
        assert "schedulingConstraints" not in group["spec"]
        assert "schedulingConstraints" not in template

"""Comparing an existing PodGroup with the desired one, and decorating pods."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.desired import podgroup
from mpijob.desired.gang_mode import OFF, GangMode
from support.gang_jobs import job, template

pytestmark = pytest.mark.unit

VOLCANO = GangMode.from_flag("volcano")
SCHED = GangMode.from_flag("scheduler-plugins-scheduler")


def _pg(api_version: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "PodGroup", "spec": spec}


def _sched(**spec: Any) -> dict[str, Any]:
    return _pg("scheduling.x-k8s.io/v1alpha1", **spec)


def _volcano(**spec: Any) -> dict[str, Any]:
    return _pg("scheduling.volcano.sh/v1beta1", **spec)


def test_quantities_compare_by_value() -> None:
    existing = _sched(minMember=3, minResources={"cpu": "1000m", "memory": "1024Mi"})
    desired = _sched(minMember=3, minResources={"cpu": "1", "memory": "1Gi"})
    assert not podgroup.pod_group_needs_update(existing, desired)


def test_a_changed_quantity_needs_an_update() -> None:
    existing = _sched(minMember=3, minResources={"cpu": "2"})
    assert podgroup.pod_group_needs_update(existing, _sched(minMember=3, minResources={"cpu": "3"}))


def test_a_changed_schedule_timeout_needs_an_update() -> None:
    """As upstream's integration test: scheduleTimeoutSeconds 900 -> 10 reaches the PodGroup."""
    existing = _sched(minMember=3, scheduleTimeoutSeconds=900)
    assert podgroup.pod_group_needs_update(existing, _sched(minMember=3, scheduleTimeoutSeconds=10))


def test_volcano_min_available_and_queue_changes_need_an_update() -> None:
    existing = _volcano(minMember=3, queue="default")
    assert podgroup.pod_group_needs_update(existing, _volcano(minMember=2, queue="default"))
    assert podgroup.pod_group_needs_update(
        existing, _volcano(minMember=3, queue="queue-for-mpijob")
    )


def test_the_queue_volcano_defaults_equals_an_empty_one() -> None:
    """The API server fills in queue "default"; writing it back every sync would never settle."""
    assert not podgroup.pod_group_needs_update(
        _volcano(minMember=3, queue="default"), _volcano(minMember=3)
    )


def test_empty_fields_equal_absent_ones() -> None:
    existing = _sched(minMember=3, scheduleTimeoutSeconds=0)
    desired = _sched(minMember=3, scheduleTimeoutSeconds=0, minResources={})
    assert not podgroup.pod_group_needs_update(existing, desired)


def test_fields_we_do_not_write_are_replaced() -> None:
    """Upstream replaces the whole spec, so a foreign field counts as a difference."""
    existing = _volcano(minMember=3, minTaskMember={"worker": 2})
    assert podgroup.pod_group_needs_update(existing, _volcano(minMember=3))


def test_an_unreadable_quantity_needs_an_update() -> None:
    existing = _sched(minMember=1, minResources={"cpu": "many"})
    assert podgroup.pod_group_needs_update(existing, _sched(minMember=1, minResources={"cpu": "1"}))


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


UNSCHEDULABLE = {"cpu": "100000", "memory": "100000Gi"}


@pytest.mark.parametrize("mode", [VOLCANO, SCHED], ids=["volcano", "scheduler-plugins"])
def test_removing_min_resources_from_the_job_drops_them_from_the_pod_group(mode: GangMode) -> None:
    """Upstream's e2e "should create pending pods": the suite removes an unschedulable
    ``schedulingPolicy.minResources``; the minimum recomputed from pods that request nothing
    must replace it, or the group never schedules."""
    spec: dict[str, Any] = {"launcher": template({}), "worker": template({}), "workers": 2}
    with_policy = job(**spec, policy={"minResources": UNSCHEDULABLE})
    without = job(**spec, policy={})
    existing = podgroup.build_pod_group(with_policy, mode=mode, priority_values={})
    desired = podgroup.build_pod_group(without, mode=mode, priority_values={})
    assert podgroup.pod_group_needs_update(existing, desired)

    patched = _merge(existing, podgroup.update_patch(existing, desired))

    assert not podgroup.pod_group_needs_update(patched, desired)
    assert not patched["spec"].get("minResources")


def test_a_resource_no_longer_named_is_removed_and_the_others_replaced() -> None:
    existing = _volcano(minMember=3, queue="q", minResources={"cpu": "4", "nvidia.com/gpu": "8"})
    desired = _volcano(minMember=2, minResources={"cpu": "2"})

    patch = podgroup.update_patch(existing, desired)

    assert patch == {
        "spec": {
            "minMember": 2,
            "queue": None,
            "minResources": {"cpu": "2", "nvidia.com/gpu": None},
        }
    }
    assert _merge(existing, patch)["spec"] == {"minMember": 2, "minResources": {"cpu": "2"}}


def test_the_update_patch_does_not_modify_its_inputs() -> None:
    existing = _sched(minMember=3, minResources={"cpu": "4"})
    desired = _sched(minMember=3, minResources={"memory": "1Gi"})
    before = (repr(existing), repr(desired))
    podgroup.update_patch(existing, desired)
    assert (repr(existing), repr(desired)) == before


def test_decorate_pod_keeps_labels_and_annotations_and_does_not_modify_its_input() -> None:
    pod = {
        "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
        "spec": {"containers": []},
    }
    sched = podgroup.decorate_pod(pod, "job", SCHED)
    volcano = podgroup.decorate_pod(pod, "job", VOLCANO)

    assert sched["metadata"]["labels"] == {"app": "x", "scheduling.x-k8s.io/pod-group": "job"}
    assert sched["metadata"]["annotations"] == {"a": "b"}
    assert volcano["metadata"]["annotations"] == {"a": "b", "scheduling.k8s.io/group-name": "job"}
    assert volcano["metadata"]["labels"] == {"app": "x"}
    assert pod == {
        "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
        "spec": {"containers": []},
    }


def test_decorate_pod_does_nothing_when_gang_scheduling_is_off() -> None:
    pod = {"metadata": {}, "spec": {"schedulerName": "mine"}}
    assert podgroup.decorate_pod(pod, "job", OFF) == pod


def test_a_users_scheduler_name_is_overwritten() -> None:
    pod = {"spec": {"schedulerName": "mine"}}
    assert podgroup.decorate_pod(pod, "job", SCHED)["spec"]["schedulerName"] == (
        "scheduler-plugins-scheduler"
    )

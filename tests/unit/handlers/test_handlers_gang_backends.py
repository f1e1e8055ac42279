"""The start-up check of the gang backends: what the cluster serves is logged, and the Workload
API chosen where it is not served stops the start with the fix named."""

from __future__ import annotations

import logging

import pytest

from mpijob.handlers.startup import StartupFailed, detect_gang_backends
from support.fake_kube import FakeKube

PODGROUPS = {"kind": "APIResourceList", "resources": [{"name": "podgroups"}]}


def cluster(*group_versions: str) -> FakeKube:
    kube = FakeKube()
    for group_version in group_versions:
        kube.served[f"/apis/{group_version}"] = PODGROUPS
    return kube


async def test_the_served_backends_and_the_chosen_one_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = cluster("scheduling.k8s.io/v1beta1", "scheduling.volcano.sh/v1beta1")
    with caplog.at_level(logging.INFO, logger="mpijob.handlers.startup"):
        await detect_gang_backends(kube, "workload-api")
    assert caplog.messages[-1] == (
        "Gang backends served here: volcano (scheduling.volcano.sh/v1beta1), "
        "workload-api (scheduling.k8s.io/v1beta1); gang scheduling: workload-api "
        "(--gang-scheduling=workload-api)"
    )


async def test_the_workload_api_where_it_is_not_served_stops_the_start() -> None:
    with pytest.raises(StartupFailed) as failed:
        await detect_gang_backends(cluster("scheduling.x-k8s.io/v1alpha1"), "workload-api")
    message = str(failed.value)
    assert "does not serve scheduling.k8s.io/v1beta1 PodGroups" in message
    assert "GenericWorkload" in message
    assert "--runtime-config=scheduling.k8s.io/v1beta1=true" in message


async def test_a_pod_group_crd_not_yet_served_is_a_warning_and_off_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="mpijob.handlers.startup"):
        await detect_gang_backends(cluster(), "volcano")
        await detect_gang_backends(cluster("scheduling.k8s.io/v1beta1"), "")
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "scheduling.volcano.sh/v1beta1 PodGroups are not served yet" in warning.getMessage()
    assert caplog.messages[-1] == (
        "Gang backends served here: workload-api (scheduling.k8s.io/v1beta1); gang scheduling: off"
    )

"""The gang quorum with WaitForWorkersReady: no deadlock (mpi-operator#608)."""

from __future__ import annotations

import pytest

from mpijob.desired import podgroup
from mpijob.desired.gang_mode import GangMode
from support.gang_jobs import job, template

pytestmark = pytest.mark.unit

LAUNCHER = template({"cpu": "1", "memory": "2Gi"})
WORKER = template({"cpu": "10", "memory": "20Gi", "nvidia.com/gpu": "1"})


def _spec(**kwargs: object) -> dict[str, object]:
    mpi_job = job(launcher=LAUNCHER, worker=WORKER, workers=4, **kwargs)  # type: ignore[arg-type]
    built = podgroup.build_pod_group(
        mpi_job, mode=GangMode.from_flag("scheduler-plugins-scheduler"), priority_values={}
    )
    spec: dict[str, object] = built["spec"]
    return spec


def test_wait_for_workers_ready_leaves_the_launcher_out_of_the_quorum() -> None:
    """The launcher is created only after every worker is Ready, so the gang cannot wait for it."""
    assert _spec(launcherCreationPolicy="WaitForWorkersReady") == {
        "minMember": 4,
        "scheduleTimeoutSeconds": 0,
        "minResources": {"cpu": "40", "memory": "80Gi", "nvidia.com/gpu": "4"},
    }


def test_at_startup_keeps_upstreams_quorum() -> None:
    assert _spec(launcherCreationPolicy="AtStartup") == {
        "minMember": 5,
        "scheduleTimeoutSeconds": 0,
        "minResources": {"cpu": "41", "memory": "82Gi", "nvidia.com/gpu": "4"},
    }


def test_any_other_policy_value_waits_as_upstream_treats_it() -> None:
    """Upstream does not validate the policy: anything but AtStartup waits for the workers."""
    assert _spec(launcherCreationPolicy="Later")["minMember"] == 4


def test_an_explicit_min_available_is_used_as_written() -> None:
    spec = _spec(launcherCreationPolicy="WaitForWorkersReady", policy={"minAvailable": 5})
    assert spec["minMember"] == 5
    assert spec["minResources"] == {"cpu": "41", "memory": "82Gi", "nvidia.com/gpu": "4"}


def test_without_workers_the_launcher_is_the_gang() -> None:
    """With no workers there is nothing to wait for: upstream creates the launcher at once."""
    mpi_job = job(launcher=LAUNCHER, launcherCreationPolicy="WaitForWorkersReady")
    assert podgroup.launcher_in_quorum(mpi_job)
    assert podgroup.min_member(mpi_job) == 1


def test_the_launcher_still_joins_the_group_it_is_not_counted_in() -> None:
    """Decorated like the workers, the late launcher joins the formed group."""
    mode = GangMode.from_flag("volcano")
    decorated = podgroup.decorate_pod(LAUNCHER, "test", mode)
    assert decorated["metadata"]["annotations"] == {"scheduling.k8s.io/group-name": "test"}
    assert decorated["spec"]["schedulerName"] == "volcano"

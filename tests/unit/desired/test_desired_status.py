"""Status rules: the status parts of upstream ``mpi_job_controller_test.go`` and
``mpi_job_controller_status.go``, one sync at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob import api
from mpijob.desired import status as rules
from mpijob.desired.conditions import set_condition
from mpijob.desired.life import Transition
from support.desired_jobs import make_job, pod

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=10)
LAUNCHER_UID = "uid-launcher"


def _job(**options: Any) -> api.MPIJob:
    return make_job(name="test", namespace="default", **options)


def _created(job: api.MPIJob) -> api.MPIJob:
    job.status = rules.mark_created(job, T0).status
    return job


def _launcher(*conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "test-launcher", "namespace": "default", "uid": LAUNCHER_UID},
        "status": {**status, "conditions": list(conditions)} if conditions else status,
    }


def _launcher_pod(name: str, phase: str, **extra: Any) -> dict[str, Any]:
    return pod(name, phase, owner_uid=LAUNCHER_UID, **extra)


def _workers(count: int, phase: str, **extra: Any) -> list[dict[str, Any]]:
    return [pod(f"test-worker-{i}", phase, **extra) for i in range(count)]


def _conditions(status: api.MPIJobStatus) -> list[tuple[str, str, str, str]]:
    return [(c.type, c.status, c.reason, c.message) for c in status.conditions]


def _replicas(status: api.MPIJobStatus) -> dict[str, dict[str, int]]:
    return status.to_body()["replicaStatuses"]  # type: ignore[no-any-return]


CREATED = ("Created", "True", "MPIJobCreated", "MPIJob default/test is created.")


def test_all_resources_created_status() -> None:
    """Counterpart of upstream TestAllResourcesCreated (its status update)."""
    job = _job(workers=5)
    created = rules.mark_created(job, T0)
    assert created.changed
    assert [(e.type, e.reason, e.message) for e in created.every_event()] == [
        ("Normal", "MPIJobCreated", "MPIJob default/test is created.")
    ]
    assert created.transitions == [Transition.CREATED]
    job.status = created.status
    result = rules.compute_status(
        job, launcher_job=_launcher(), launcher_pods=[], worker_pods=_workers(5, "Pending"), now=NOW
    )
    assert _conditions(result.status) == [CREATED]
    assert _replicas(result.status) == {"Launcher": {}, "Worker": {}}
    assert result.status.start_time == NOW
    assert result.launcher_seen
    assert result.events == []
    assert rules.mark_created(job, NOW).changed is False


def test_launcher_succeeded_status() -> None:
    """Counterpart of upstream TestLauncherSucceeded."""
    job = _created(_job())
    launcher = _launcher(
        {"type": "SuccessCriteriaMet", "status": "True"},
        {"type": "Complete", "status": "True"},
        completionTime="2024-05-01T10:05:00Z",
    )
    result = rules.compute_status(
        job, launcher_job=launcher, launcher_pods=[], worker_pods=_workers(2, "Running"), now=NOW
    )
    completed = T0 + timedelta(minutes=5)
    assert _conditions(result.status) == [
        CREATED,
        ("Succeeded", "True", "MPIJobSucceeded", "MPIJob default/test successfully completed."),
        (
            "Running",
            "False",
            "MPIJobRunning",
            "MPIJob default/test is finished but Running condition was never set.",
        ),
    ]
    running = result.status.condition("Running")
    assert running is not None
    assert running.last_transition_time == running.last_update_time == completed
    assert result.status.completion_time == completed
    assert _replicas(result.status) == {"Launcher": {"succeeded": 1}, "Worker": {}}
    assert [(e.type, e.reason) for e in result.every_event()] == [("Normal", "MPIJobSucceeded")]
    assert result.transitions == [Transition.SUCCEEDED]
    assert rules.finished_with_completion(result.status)


def test_launcher_succeeded_with_running_pod_status() -> None:
    """Counterpart of upstream TestLauncherSucceededWithRunningPod."""
    job = _created(_job())
    set_condition(
        job.status, "Running", "True", "MPIJobRunning", "MPIJob default/test is running.", T0
    )
    launcher = _launcher(
        {"type": "Complete", "status": "True"}, completionTime="2024-05-01T10:05:00Z"
    )
    result = rules.compute_status(
        job,
        launcher_job=launcher,
        launcher_pods=[_launcher_pod("test-launcher-abcde", "Running")],
        worker_pods=_workers(2, "Running"),
        now=NOW,
    )
    assert _conditions(result.status) == [
        CREATED,
        ("Running", "False", "MPIJobRunning", "MPIJob default/test is running."),
        ("Succeeded", "True", "MPIJobSucceeded", "MPIJob default/test successfully completed."),
    ]
    running = result.status.condition("Running")
    completion = result.status.completion_time
    assert running is not None
    assert completion is not None
    assert running.last_transition_time == running.last_update_time == T0
    assert running.last_transition_time <= completion
    assert _replicas(result.status)["Launcher"] == {"succeeded": 1}
    assert [e.reason for e in result.every_event()] == ["MPIJobSucceeded"]


def test_launcher_failed_status() -> None:
    """Counterpart of upstream TestLauncherFailed: the newest failed pod names the reason."""
    job = _created(_job())
    launcher = _launcher(
        {"type": "FailureTarget", "status": "True"},
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        },
        failed=2,
    )
    pods = [
        _launcher_pod(
            "test-launcher-b",
            "Failed",
            reason="FailedReason2",
            message="second message",
            created="2024-05-01T10:02:00Z",
        ),
        _launcher_pod(
            "test-launcher-a",
            "Failed",
            reason="FailedReason1",
            message="first message",
            created="2024-05-01T10:01:00Z",
        ),
    ]
    result = rules.compute_status(
        job, launcher_job=launcher, launcher_pods=pods, worker_pods=[], now=NOW
    )
    reason = "BackoffLimitExceeded/FailedReason2"
    message = "Job has reached the specified backoff limit: second message"
    assert _conditions(result.status) == [
        CREATED,
        ("Failed", "True", reason, message),
        (
            "Running",
            "False",
            "MPIJobRunning",
            "MPIJob default/test is finished but Running condition was never set.",
        ),
    ]
    assert result.status.completion_time == NOW
    assert _replicas(result.status) == {"Launcher": {"failed": 2}, "Worker": {}}
    events = result.every_event()
    assert [(e.type, e.reason, e.message) for e in events] == [("Warning", reason, message)]
    assert result.transitions == [Transition.FAILED]


def test_launcher_failed_without_reason_uses_upstream_defaults() -> None:
    job = _created(_job())
    launcher = _launcher({"type": "Failed", "status": "True"})
    result = rules.compute_status(
        job, launcher_job=launcher, launcher_pods=[], worker_pods=[], now=NOW
    )
    failed = result.status.condition("Failed")
    assert failed is not None
    assert (failed.reason, failed.message) == ("MPIJobFailed", "MPIJob default/test has failed")


def test_mpi_job_failure_failed_launcher_pod_alone_does_not_fail_the_job() -> None:
    """Counterpart of upstream TestMPIJobFailure's first step: a retry is not a failure."""
    job = _created(_job())
    result = rules.compute_status(
        job,
        launcher_job=_launcher(failed=1),
        launcher_pods=[_launcher_pod("test-launcher-a", "Failed")],
        worker_pods=_workers(2, "Running"),
        now=NOW,
    )
    assert not result.status.finished
    assert _replicas(result.status)["Launcher"] == {"failed": 1}
    assert result.transitions == []


def test_launcher_active_worker_not_ready_status() -> None:
    """Counterpart of upstream TestLauncherActiveWorkerNotReady."""
    job = _created(_job(workers=8))
    result = rules.compute_status(
        job,
        launcher_job=_launcher(),
        launcher_pods=[_launcher_pod("test-launcher-x", "Running")],
        worker_pods=_workers(8, "Pending"),
        now=NOW,
    )
    assert _replicas(result.status) == {"Launcher": {"active": 1}, "Worker": {}}
    assert result.status.condition("Running") is None
    assert result.events == []


def test_launcher_active_worker_ready_status() -> None:
    """Counterpart of upstream TestLauncherActiveWorkerReady; the event repeats every sync."""
    job = _created(_job(workers=8))
    inputs: dict[str, Any] = {
        "launcher_job": _launcher(),
        "launcher_pods": [
            _launcher_pod("test-launcher-x", "Running"),
            pod("not-ours", "Running", owner_uid="someone-else"),
        ],
        "worker_pods": _workers(8, "Running"),
    }
    result = rules.compute_status(job, now=NOW, **inputs)
    assert _replicas(result.status) == {"Launcher": {"active": 1}, "Worker": {"active": 8}}
    assert _conditions(result.status) == [
        CREATED,
        ("Running", "True", "MPIJobRunning", "MPIJob default/test is running."),
    ]
    assert [(e.reason, e.message) for e in result.events] == [
        ("MPIJobRunning", "MPIJob default/test is running")
    ]
    job.status = result.status
    again = rules.compute_status(job, now=NOW + timedelta(seconds=30), **inputs)
    assert not again.changed
    assert [e.reason for e in again.events] == ["MPIJobRunning"]


def test_worker_ready_launcher_creation_and_status() -> None:
    """Counterpart of upstream TestWorkerReady, and the WaitForWorkersReady gate."""
    job = _created(_job(workers=16, launcherCreationPolicy="WaitForWorkersReady"))
    assert not rules.launcher_may_start(job, _workers(16, "Running"))
    assert not rules.launcher_may_start(job, _workers(15, "Running", ready=True))
    assert rules.launcher_may_start(job, _workers(16, "Running", ready=True))
    assert rules.launcher_may_start(_job(workers=16), [])
    assert rules.launcher_may_start(_job(workers=None, launcherCreationPolicy="Other"), [])
    result = rules.compute_status(
        job,
        launcher_job=_launcher(),
        launcher_pods=[],
        worker_pods=_workers(16, "Running", ready=True),
        now=NOW,
    )
    assert _replicas(result.status) == {"Launcher": {}, "Worker": {"active": 16}}
    assert result.status.condition("Running") is None


def test_create_suspended_mpi_job_status() -> None:
    """Counterpart of upstream TestCreateSuspendedMPIJob (its status update)."""
    job = _job(run_policy={"suspend": True})
    created = rules.mark_created(job, T0)
    job.status = created.status
    result = rules.compute_status(
        job, launcher_job=_launcher(), launcher_pods=[], worker_pods=_workers(2, "Running"), now=NOW
    )
    assert _conditions(result.status) == [
        CREATED,
        ("Suspended", "True", "MPIJobSuspended", "MPIJob suspended"),
        ("Running", "False", "MPIJobSuspended", "MPIJob default/test is suspended."),
    ]
    assert _replicas(result.status) == {"Launcher": {}, "Worker": {}}
    assert result.status.start_time is None
    assert [e.reason for e in created.every_event() + result.every_event()] == [
        "MPIJobCreated",
        "MPIJobSuspended",
    ]
    assert rules.launcher_may_start(job.model_copy(update={}), [])


def test_suspended_running_mpi_job_status() -> None:
    """Counterpart of upstream TestSuspendedRunningMPIJob (its status update)."""
    job = _created(_job(workers=8, run_policy={"suspend": True}))
    job.status.start_time = T0
    set_condition(
        job.status, "Running", "True", "MPIJobRunning", "MPIJob default/test is running.", T0
    )
    result = rules.compute_status(
        job,
        launcher_job=_launcher(),
        launcher_pods=[_launcher_pod("test-launcher-x", "Running")],
        worker_pods=_workers(8, "Running"),
        now=NOW,
    )
    assert _conditions(result.status) == [
        CREATED,
        ("Suspended", "True", "MPIJobSuspended", "MPIJob suspended"),
        ("Running", "False", "MPIJobSuspended", "MPIJob default/test is suspended."),
    ]
    assert _replicas(result.status) == {"Launcher": {"active": 1}, "Worker": {}}
    assert result.status.start_time == T0
    assert rules.worker_pods_to_delete(job, _workers(8, "Running")) == [
        f"test-worker-{i}" for i in range(8)
    ]


def test_resume_mpi_job_status() -> None:
    """Counterpart of upstream TestResumeMPIJob: Suspended=False and startTime reset to now."""
    job = _created(_job(workers=8))
    job.status.start_time = T0
    set_condition(job.status, "Suspended", "True", "MPIJobSuspended", "MPIJob suspended", T0)
    result = rules.compute_status(
        job, launcher_job=_launcher(), launcher_pods=[], worker_pods=_workers(8, "Pending"), now=NOW
    )
    suspended = result.status.condition("Suspended")
    assert suspended is not None
    assert (suspended.status, suspended.reason, suspended.message) == (
        "False",
        "MPIJobResumed",
        "MPIJob resumed",
    )
    assert result.status.start_time == NOW
    assert [e.reason for e in result.events] == ["MPIJobResumed"]


def test_shutdown_worker_cleanup() -> None:
    """Counterpart of upstream TestShutdownWorker: finished, cleanPodPolicy All, 8 workers."""
    job = _created(_job(workers=8, run_policy={"cleanPodPolicy": "All"}))
    set_condition(job.status, "Succeeded", "True", "MPIJobSucceeded", "done", T0)
    assert not rules.finished_with_completion(job.status)
    job.status.completion_time = T0
    job.status.replica_statuses["Worker"] = api.ReplicaStatus(active=3)
    assert rules.finished_with_completion(job.status)
    assert rules.cleans_up_at_finish(job)
    pods = [
        *_workers(6, "Succeeded"),
        pod("test-worker-6", "Running"),
        pod("test-worker-9", "Running"),
    ]
    assert rules.worker_pods_to_delete(job, pods) == [f"test-worker-{i}" for i in range(7)]
    assert rules.finished_cleanup_status(job).to_body()["replicaStatuses"] == {"Worker": {}}


def test_clean_pod_policy_running_keeps_finished_workers_and_none_keeps_all() -> None:
    running = _job(workers=4, run_policy={"cleanPodPolicy": "Running"})
    pods = [
        pod("test-worker-0", "Running"),
        pod("test-worker-1", "Pending"),
        pod("test-worker-2", "Succeeded"),
        pod("test-worker-3", "Failed"),
    ]
    assert rules.worker_pods_to_delete(running, pods) == ["test-worker-0", "test-worker-1"]
    assert rules.cleans_up_at_finish(running)
    assert not rules.cleans_up_at_finish(_job(run_policy={"cleanPodPolicy": "None"}))


def test_evicted_worker_fails_the_job_and_finishes_it() -> None:
    """Upstream's reason and message, and (unlike upstream, mpi-operator#647) a completion time,
    so the finished job's cleanup runs and it counts as failed; the message names the pod."""
    job = _created(_job(workers=2))
    workers = [
        pod(
            "test-worker-0",
            "Failed",
            reason="Evicted",
            message="The node was low on resource: memory.",
        ),
        pod("test-worker-1", "Running"),
    ]
    result = rules.compute_status(
        job, launcher_job=_launcher(), launcher_pods=[], worker_pods=workers, now=NOW
    )
    message = (
        "1/2 workers are evicted; first failure: pod test-worker-0 Evicted: "
        "The node was low on resource: memory."
    )
    assert _conditions(result.status) == [
        CREATED,
        ("Failed", "True", "MPIJobEvicted", message),
        (
            "Running",
            "False",
            "MPIJobRunning",
            "MPIJob default/test is finished but Running condition was never set.",
        ),
    ]
    assert result.status.completion_time == NOW
    assert rules.finished_with_completion(result.status)
    assert _replicas(result.status)["Worker"] == {"active": 1, "failed": 1}
    assert [(e.type, e.reason, e.message) for e in result.every_event()] == [
        ("Warning", "MPIJobEvicted", message)
    ]
    assert result.transitions == [Transition.FAILED]
    assert result.failure_reason == "Evicted"


def test_workers_of_a_done_launcher_are_not_counted() -> None:
    job = _created(_job(workers=2))
    launcher = _launcher({"type": "Complete", "status": "True"})
    result = rules.compute_status(
        job, launcher_job=launcher, launcher_pods=[], worker_pods=_workers(2, "Running"), now=NOW
    )
    assert _replicas(result.status)["Worker"] == {}
    assert result.status.completion_time is None
    assert rules.launcher_done(launcher)
    assert not rules.launcher_done(_launcher({"type": "Complete", "status": "False"}))
    assert not rules.launcher_done(None)


def test_missing_launcher_keeps_the_previous_launcher_entry() -> None:
    job = _created(_job(workers=None))
    job.status.replica_statuses["Launcher"] = api.ReplicaStatus(succeeded=1)
    result = rules.compute_status(job, launcher_job=None, launcher_pods=[], worker_pods=[], now=NOW)
    assert _replicas(result.status) == {"Launcher": {"succeeded": 1}, "Worker": {}}
    assert not result.launcher_seen


def test_set_condition_rules() -> None:
    """Upstream setCondition: no-op, lastTransitionTime kept, exclusions, finish, order."""
    status = api.MPIJobStatus()
    assert set_condition(status, "Running", "True", "A", "first", T0)
    assert not set_condition(status, "Running", "True", "A", "other message", NOW)
    assert status.conditions[0].message == "first"
    assert set_condition(status, "Running", "True", "B", "second", NOW)
    running = status.conditions[0]
    assert (running.reason, running.last_transition_time, running.last_update_time) == (
        "B",
        T0,
        NOW,
    )
    assert set_condition(status, "Restarting", "True", "R", "restart", NOW)
    assert [c.type for c in status.conditions] == ["Restarting"]
    assert set_condition(status, "Running", "True", "A", "again", NOW)
    assert [c.type for c in status.conditions] == ["Running"]
    assert set_condition(status, "Created", "True", "C", "created", NOW)
    assert set_condition(status, "Failed", "True", "F", "failed", NOW)
    assert set_condition(status, "Succeeded", "True", "S", "ok", NOW)
    assert [(c.type, c.status) for c in status.conditions] == [
        ("Running", "False"),
        ("Created", "True"),
        ("Failed", "False"),
        ("Succeeded", "True"),
    ]
    assert status.conditions[0].reason == "A"


def test_status_body_omits_zero_counts_and_writes_rfc3339() -> None:
    status = api.MPIJobStatus(start_time=T0.replace(microsecond=123456))
    status.replica_statuses["Worker"] = api.ReplicaStatus(active=0, failed=2)
    assert api.MPIJobStatus().to_body() == {}
    assert status.to_body() == {
        "replicaStatuses": {"Worker": {"failed": 2}},
        "startTime": "2024-05-01T10:00:00Z",
    }


def test_invalid_job_gets_a_warning_and_an_invalid_condition() -> None:
    """Upstream's ValidationError Event, plus a condition so kubectl describe shows it."""
    job = _job()
    first = rules.mark_invalid(job.status, "Found validation errors: a", T0)
    assert first.changed
    assert [(e.type, e.reason, e.message) for e in first.events] == [
        ("Warning", "ValidationError", "Found validation errors: a")
    ]
    assert _conditions(first.status) == [
        ("Invalid", "True", "ValidationError", "Found validation errors: a")
    ]
    job.status = first.status
    same = rules.mark_invalid(job.status, "Found validation errors: a", NOW)
    assert not same.changed
    assert same.events == [], "reported once per message, not on every sync"
    other = rules.mark_invalid(job.status, "Found validation errors: b", NOW)
    assert other.changed
    assert _conditions(other.status)[0][3] == "Found validation errors: b"
    job.status = other.status
    assert rules.mark_created(job, NOW).changed, "our own conditions do not block Created"
    assert rules.clear_invalid(job.status)
    assert job.status.conditions == []
    assert not rules.clear_invalid(job.status)

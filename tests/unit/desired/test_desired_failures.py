"""Failures that say why, finished jobs that keep their workers, and WaitForWorkersReady across
suspend and resume: the pure rules (observed, status, sync, binding)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired import binding, observed, sync
from mpijob.desired import status as rules
from mpijob.desired.life import Transition
from support.desired_jobs import make_job, pod
from support.jobs import body, parsed

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=10)
LAUNCHER_UID = "uid-launcher"


def _role(p: dict[str, Any], role: str, owner: str = "uid-test") -> dict[str, Any]:
    p["metadata"]["labels"] = {keys.LABEL_JOB_ROLE: role}
    kind = "MPIJob" if role == keys.ROLE_WORKER else "Job"
    p["metadata"]["ownerReferences"] = [{"kind": kind, "uid": owner, "controller": True}]
    return p


def worker(name: str, phase: str, **status: Any) -> dict[str, Any]:
    p = _role(pod(name, phase), keys.ROLE_WORKER)
    p["status"].update(status)
    return p


def launcher_pod(name: str, phase: str, **status: Any) -> dict[str, Any]:
    p = _role(pod(name, phase), keys.ROLE_LAUNCHER, LAUNCHER_UID)
    p["status"].update(status)
    return p


def terminated(
    container: str, reason: str, code: int, finished: str, *, last: bool = False
) -> list[dict[str, Any]]:
    state = {"terminated": {"reason": reason, "exitCode": code, "finishedAt": finished}}
    if last:
        return [{"name": container, "state": {"running": {}}, "lastState": state}]
    return [{"name": container, "state": state}]


def created(job: api.MPIJob) -> api.MPIJob:
    job.status = rules.mark_created(job, T0).status
    return job


def failed_launcher_job(reason: str = "BackoffLimitExceeded", message: str = "") -> dict[str, Any]:
    message = message or "Job has reached the specified backoff limit"
    return {
        "metadata": {"name": "test-launcher", "namespace": "default", "uid": LAUNCHER_UID},
        "status": {
            "failed": 1,
            "conditions": [
                {"type": "Failed", "status": "True", "reason": reason, "message": message}
            ],
        },
    }


# --- what the kubelet reported -----------------------------------------------------------------


def test_an_oom_killed_container_is_named_with_its_exit_code() -> None:
    p = worker(
        "test-worker-1",
        "Failed",
        containerStatuses=terminated("worker", "OOMKilled", 137, "2024-05-01T10:03:00Z"),
    )
    failure = observed.pod_failure(p)
    assert failure is not None
    assert (
        failure.describe() == "worker pod test-worker-1 container worker OOMKilled (exit code 137)"
    )
    assert failure.at == "2024-05-01T10:03:00Z"


def test_a_restarted_container_names_its_last_run() -> None:
    p = launcher_pod(
        "test-launcher-x",
        "Running",
        containerStatuses=terminated("mpi", "Error", 1, "2024-05-01T10:04:00Z", last=True),
    )
    failure = observed.pod_failure(p)
    assert failure is not None
    assert (failure.reason, failure.container, failure.exit_code) == ("Error", "mpi", 1)


def test_an_eviction_names_the_kubelets_message_and_no_container() -> None:
    p = worker(
        "test-worker-0",
        "Failed",
        reason="Evicted",
        message="The node was low on resource: memory. Threshold quantity: 100Mi.",
    )
    failure = observed.pod_failure(p)
    assert failure is not None
    assert failure.describe() == (
        "worker pod test-worker-0 Evicted: The node was low on resource: memory. "
        "Threshold quantity: 100Mi."
    )


def test_a_pod_past_its_deadline() -> None:
    p = worker("test-worker-0", "Failed", reason="DeadlineExceeded", message="too long")
    failure = observed.pod_failure(p)
    assert failure is not None
    assert (failure.reason, failure.message) == ("DeadlineExceeded", "too long")


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull", "InvalidImageName"])
def test_an_image_that_cannot_be_pulled(reason: str) -> None:
    waiting = {"waiting": {"reason": reason, "message": 'pull "nope:1": not found'}}
    p = worker("test-worker-0", "Pending", containerStatuses=[{"name": "w", "state": waiting}])
    failure = observed.pod_failure(p)
    assert failure is not None
    assert (
        failure.describe()
        == f'worker pod test-worker-0 container w {reason}: pull "nope:1": not found'
    )


def test_nothing_failed() -> None:
    starting = {"waiting": {"reason": "ContainerCreating"}}
    assert (
        observed.pod_failure(worker("a", "Pending", containerStatuses=[{"state": starting}]))
        is None
    )
    assert (
        observed.pod_failure(
            worker("a", "Succeeded", containerStatuses=terminated("w", "Completed", 0, "x"))
        )
        is None
    )
    assert observed.pod_failure(worker("a", "Running")) is None


def test_a_pod_deleted_by_someone_is_no_failure_but_a_disruption_is() -> None:
    killed = worker("a", "Failed", containerStatuses=terminated("w", "Error", 137, "x"))
    killed["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z"
    assert observed.pod_failure(killed) is None
    killed["status"]["conditions"] = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
    ]
    failure = observed.pod_failure(killed)
    assert failure is not None
    assert failure.describe() == (
        "worker pod a container w Error (exit code 137): "
        "EvictionByEvictionAPI (Eviction API: evicting)"
    )


def test_failures_are_ordered_by_time() -> None:
    late = worker(
        "b", "Failed", containerStatuses=terminated("w", "Error", 1, "2024-05-01T10:05:00Z")
    )
    early = worker(
        "c", "Failed", containerStatuses=terminated("w", "OOMKilled", 137, "2024-05-01T10:01:00Z")
    )
    unknown = worker("a", "Failed", containerStatuses=terminated("w", "Error", 2, ""))
    assert [f.pod for f in observed.first_failures([late, unknown, early])] == ["c", "b", "a"]


def test_in_the_same_second_a_worker_comes_before_the_launcher_it_failed() -> None:
    """Seen on the real nodes: both workers OOM-killed and the launcher's mpirun exiting 255,
    all three finished at the same second."""
    at = "2026-11-27T00:56:10Z"
    launcher = launcher_pod(
        "oom-launcher-z4rk9", "Failed", containerStatuses=terminated("l", "Error", 255, at)
    )
    workers = [
        worker(f"oom-worker-{i}", "Failed", containerStatuses=terminated("w", "OOMKilled", 137, at))
        for i in (1, 0)
    ]
    order = [f.pod for f in observed.first_failures([launcher, *workers])]
    assert order == ["oom-worker-0", "oom-worker-1", "oom-launcher-z4rk9"]


# --- the Failed condition, Event and counter -----------------------------------------------------


def test_a_failed_launcher_names_the_first_pod_failure_and_counts_the_others() -> None:
    """The worker OOM-killed first is named, with the launcher's later failure counted."""
    job = created(make_job(name="test", namespace="default", workers=2))
    workers = [
        worker(
            "test-worker-1",
            "Failed",
            containerStatuses=terminated("worker", "OOMKilled", 137, "2024-05-01T10:02:00Z"),
        ),
        worker("test-worker-0", "Running"),
    ]
    launchers = [
        launcher_pod(
            "test-launcher-q",
            "Failed",
            containerStatuses=terminated("launcher", "Error", 1, "2024-05-01T10:02:05Z"),
        )
    ]
    result = rules.compute_status(
        job,
        launcher_job=failed_launcher_job(),
        launcher_pods=launchers,
        worker_pods=workers,
        now=NOW,
    )
    message = (
        "Job has reached the specified backoff limit: ; first failure: worker pod test-worker-1 "
        "container worker OOMKilled (exit code 137); 1 other pod failed"
    )
    failed = result.status.condition(keys.COND_FAILED)
    assert failed is not None
    assert (failed.reason, failed.message) == ("BackoffLimitExceeded/", message)
    assert [(e.type, e.message) for e in result.every_event()] == [("Warning", message)]
    assert result.transitions == [Transition.FAILED]
    assert result.failure_reason == "OOMKilled"
    assert rules.failure_label(result.failure_reason) == "OOMKilled"


def test_a_deadline_without_pod_failures_keeps_upstreams_message() -> None:
    job = created(make_job(name="test", namespace="default", workers=1))
    launcher = failed_launcher_job(
        "DeadlineExceeded", "Job was active longer than specified deadline"
    )
    result = rules.compute_status(
        job, launcher_job=launcher, launcher_pods=[], worker_pods=[], now=NOW
    )
    failed = result.status.condition(keys.COND_FAILED)
    assert failed is not None
    assert failed.message == "Job was active longer than specified deadline"
    assert result.failure_reason == "DeadlineExceeded"


def test_failure_labels_are_bounded() -> None:
    assert rules.failure_label("ImagePullBackOff") == "ImagePullBackOff"
    assert rules.failure_label("Evicted") == "Evicted"
    assert rules.failure_label("SomethingNew") == "Other"
    assert rules.failure_label(None) == "Other"


# --- finished jobs whose workers are left running ------------------------------------------------


def gpu_worker(name: str, phase: str) -> dict[str, Any]:
    """A worker of a job whose template asks 8 GPUs, as the watch keeps it: no container specs."""
    return worker(name, phase)


GPU_WORKER = {
    "spec": {"containers": [{"name": "w", "resources": {"limits": {keys.GPU_RESOURCE: 8}}}]}
}


def succeeded(policy: str | None) -> api.MPIJob:
    run_policy = {} if policy is None else {"cleanPodPolicy": policy}
    job = created(
        make_job(
            name="test",
            namespace="default",
            workers=2,
            run_policy=run_policy,
            worker_template=GPU_WORKER,
        )
    )
    rules.set_condition(job.status, "Succeeded", "True", "MPIJobSucceeded", "done", T0)
    job.status.completion_time = T0
    return job


def test_a_finished_job_says_its_workers_hold_gpus_until_they_are_gone() -> None:
    job = succeeded(None)
    pods = [gpu_worker("test-worker-0", "Running"), gpu_worker("test-worker-1", "Pending")]
    result = rules.next_status(job, sync.Observed(pods=pods), NOW)
    assert result.changed
    assert result.gpus_held == 16
    cond = result.status.condition(keys.COND_WORKERS_LEFT_RUNNING)
    assert cond is not None
    assert (cond.status, cond.reason) == ("True", keys.REASON_CLEAN_POD_POLICY)
    assert cond.message == (
        "MPIJob default/test finished, and cleanPodPolicy None leaves 2 worker pod(s) running "
        "(test-worker-0, test-worker-1), holding 16 GPU(s); delete them, or set "
        "spec.runPolicy.cleanPodPolicy: Running"
    )
    assert [(e.type, e.reason) for e in result.every_event()] == [
        ("Warning", keys.REASON_WORKERS_LEFT_RUNNING)
    ]
    assert sync.plan(job, sync.Observed(pods=pods), NOW).actions == [], "upstream's None"

    job.status = result.status
    again = rules.next_status(job, sync.Observed(pods=pods), NOW)
    assert (again.changed, again.events, again.gpus_held) == (False, [], 16)
    # The same step, which the job's record of its life announces once (test_desired_life).
    assert again.every_event() == result.every_event()

    gone = rules.next_status(job, sync.Observed(pods=[]), NOW)
    cond = gone.status.condition(keys.COND_WORKERS_LEFT_RUNNING)
    assert cond is not None
    assert (cond.status, cond.reason) == ("False", keys.REASON_WORKERS_GONE)
    assert (gone.changed, gone.events, gone.gpus_held) == (True, [], 0)


def test_finished_workers_and_terminating_ones_hold_nothing() -> None:
    job = succeeded("None")
    leaving = gpu_worker("test-worker-0", "Running")
    leaving["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z"
    pods = [leaving, gpu_worker("test-worker-1", "Succeeded")]
    result = rules.next_status(job, sync.Observed(pods=pods), NOW)
    assert (result.changed, result.gpus_held) == (False, 0)
    assert result.status.condition(keys.COND_WORKERS_LEFT_RUNNING) is None


def test_the_admins_default_policy_cleans_up_jobs_that_set_none() -> None:
    raw = body("test", "default", workers=2)
    assert api.with_defaults(api.parse(raw)).spec.run_policy.clean_pod_policy == "None"
    job = api.with_defaults(api.parse(raw), clean_pod_policy="Running")
    assert job.spec.run_policy.clean_pod_policy == "Running"
    raw["spec"]["runPolicy"] = {"cleanPodPolicy": "None"}
    own = api.with_defaults(api.parse(raw), clean_pod_policy="Running")
    assert own.spec.run_policy.clean_pod_policy == "None", "a job's own policy wins"

    job = created(job)
    rules.set_condition(job.status, "Succeeded", "True", "MPIJobSucceeded", "done", T0)
    job.status.completion_time = T0
    pods = [gpu_worker("test-worker-0", "Running"), gpu_worker("test-worker-1", "Running")]
    plan = sync.plan(job, sync.Observed(pods=pods), NOW)
    assert [(a.kind, a.name) for a in plan.actions if isinstance(a, sync.Delete)] == [
        ("Pod", "test-worker-0"),
        ("Pod", "test-worker-1"),
    ]
    assert rules.next_status(job, sync.Observed(pods=pods), NOW).gpus_held == 0


# --- an evicted worker finishes the job, and cleanPodPolicy follows ------------------------------


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("Running", ["test-worker-1"]), ("All", ["test-worker-0", "test-worker-1"]), ("None", [])],
)
def test_an_evicted_workers_job_is_cleaned_up_by_its_policy(
    policy: str, deleted: list[str]
) -> None:
    job = created(
        make_job(name="test", namespace="default", workers=2, run_policy={"cleanPodPolicy": policy})
    )
    pods = [worker("test-worker-0", "Failed", reason="Evicted"), worker("test-worker-1", "Running")]
    first = rules.next_status(job, sync.Observed(pods=pods), NOW)
    assert first.status.is_true(keys.COND_FAILED)
    job.status = first.status
    plan = sync.plan(job, sync.Observed(pods=pods), NOW)
    assert [a.name for a in plan.actions if isinstance(a, sync.Delete)] == deleted


# --- WaitForWorkersReady across suspend and resume -----------------------------------------------


def resumed_job(policy: str) -> tuple[api.MPIJob, dict[str, Any]]:
    job = created(
        make_job(name="test", namespace="default", workers=2, launcherCreationPolicy=policy)
    )
    rules.set_condition(job.status, "Suspended", "True", "MPIJobSuspended", "MPIJob suspended", T0)
    built, _ = sync.launcher.build_launcher_job(job)
    built["metadata"]["uid"] = LAUNCHER_UID
    built["spec"]["suspend"] = True
    built["status"] = {}
    return job, built


def resumes(plan: sync.Plan) -> bool:
    return any(isinstance(a, sync.Replace) and a.obj["kind"] == "Job" for a in plan.actions)


def ready_worker(name: str, **status: Any) -> dict[str, Any]:
    p = worker(name, "Running")
    p["status"].update(
        {"conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.2", **status}
    )
    return p


def test_wait_for_workers_ready_holds_a_resumed_launcher_until_every_worker_is_ready() -> None:
    job, launcher_job = resumed_job("WaitForWorkersReady")
    # Resumed: the workers are created again, the launcher Job stays suspended.
    plan = sync.plan(job, sync.Observed(launcher_job=launcher_job), NOW)
    assert [a.obj["metadata"]["name"] for a in plan.actions if isinstance(a, sync.Create)][-2:] == [
        "test-worker-0",
        "test-worker-1",
    ]
    assert not resumes(plan)
    one = [ready_worker("test-worker-0"), worker("test-worker-1", "Running")]
    assert not resumes(sync.plan(job, sync.Observed(launcher_job=launcher_job, pods=one), NOW))
    no_ip = [ready_worker("test-worker-0"), ready_worker("test-worker-1", podIP="")]
    assert not resumes(sync.plan(job, sync.Observed(launcher_job=launcher_job, pods=no_ip), NOW))
    leaving = [ready_worker("test-worker-0"), ready_worker("test-worker-1")]
    leaving[1]["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z"
    assert not resumes(sync.plan(job, sync.Observed(launcher_job=launcher_job, pods=leaving), NOW))
    both = [ready_worker("test-worker-0"), ready_worker("test-worker-1")]
    assert resumes(sync.plan(job, sync.Observed(launcher_job=launcher_job, pods=both), NOW))


def test_at_startup_resumes_the_launcher_at_once_as_upstream() -> None:
    job, launcher_job = resumed_job("AtStartup")
    assert resumes(sync.plan(job, sync.Observed(launcher_job=launcher_job), NOW))


def test_wait_for_workers_ready_creates_no_launcher_before_the_workers_are_reachable() -> None:
    job = created(
        make_job(
            name="test",
            namespace="default",
            workers=2,
            launcherCreationPolicy="WaitForWorkersReady",
        )
    )
    no_ip = [ready_worker("test-worker-0"), ready_worker("test-worker-1", podIP="")]
    assert not rules.launcher_may_start(job, no_ip)
    assert rules.launcher_may_start(
        job, [ready_worker("test-worker-0"), ready_worker("test-worker-1")]
    )


# --- the start-up figures ------------------------------------------------------------------------


def test_time_to_every_worker_ready_and_to_the_launcher_running() -> None:
    def ready(at: str) -> dict[str, Any]:
        return {
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at}]
            }
        }

    workers = [ready("2024-05-01T10:00:04Z"), ready("2024-05-01T10:00:09Z")]
    assert binding.seconds_to_workers_ready(T0, workers, 2) == 9.0
    assert binding.seconds_to_workers_ready(T0, workers[:1], 2) is None
    assert binding.seconds_to_workers_ready(T0, [*workers, {"status": {}}], 2) is None
    assert binding.seconds_to_workers_ready(T0, [], 0) is None

    def started(state: str, at: str) -> dict[str, Any]:
        return {"status": {"containerStatuses": [{"state": {state: {"startedAt": at}}}]}}

    pods = [
        started("terminated", "2024-05-01T10:00:12Z"),
        started("running", "2024-05-01T10:00:30Z"),
    ]
    assert binding.seconds_to_launcher_running(T0, pods) == 12.0
    assert binding.seconds_to_launcher_running(T0, [{"status": {"phase": "Pending"}}]) is None


def test_parsed_bodies_default_as_before() -> None:
    assert parsed(body("x", "y")).spec.run_policy.clean_pod_policy == "None"


def test_the_workers_left_running_warning_is_implied_by_the_status_it_wrote() -> None:
    from mpijob.desired import events

    job = succeeded(None)
    result = rules.next_status(
        job, sync.Observed(pods=[gpu_worker("test-worker-0", "Running")]), NOW
    )
    job.status = result.status
    implied = {i.event for i in events.implied_by(job)}
    assert set(result.every_event()) <= implied

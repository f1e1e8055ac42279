"""The steps of a job's life and its workers' failures, counted and announced once per job
whatever its status says (:mod:`mpijob.desired.life`): the record, how a restart seeds it from
the children, and what a tenant's rewrite of the status gets (the status back, nothing else)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired import life, observed
from mpijob.desired import status as rules
from mpijob.desired.life import Lives, News, Transition
from mpijob.desired.observed import Observed
from support.desired_jobs import make_job, pod

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
KEY = ("default", "test")
LAUNCHER_UID = "uid-launcher"
CREATED = "MPIJob default/test is created."
SUCCEEDED = "MPIJob default/test successfully completed."


def _job(workers: int = 2, restart: str | None = None) -> api.MPIJob:
    job = make_job(name="test", namespace="default", workers=workers)
    job.metadata.creation_timestamp = T0
    if restart is not None:
        assert job.spec.worker is not None
        job.spec.worker.restart_policy = restart
    return job


def _owned(p: dict[str, Any], role: str, owner: str) -> dict[str, Any]:
    kind = "MPIJob" if role == keys.ROLE_WORKER else "Job"
    p["metadata"]["labels"] = {keys.LABEL_JOB_ROLE: role}
    p["metadata"]["ownerReferences"] = [{"kind": kind, "uid": owner, "controller": True}]
    p["metadata"]["uid"] = f"uid-{p['metadata']['name']}"
    return p


def worker(index: int, phase: str = "Running", **status: Any) -> dict[str, Any]:
    p = _owned(pod(f"test-worker-{index}", phase), keys.ROLE_WORKER, "uid-test")
    p["status"].update(status)
    return p


def launcher_pod(phase: str) -> dict[str, Any]:
    return _owned(pod("test-launcher-x", phase), keys.ROLE_LAUNCHER, LAUNCHER_UID)


def launcher(*conditions: str, **status: Any) -> dict[str, Any]:
    found = [{"type": c, "status": "True"} for c in conditions]
    return {
        "metadata": {"name": "test-launcher", "namespace": "default", "uid": LAUNCHER_UID},
        "status": {**status, "conditions": found},
    }


def oom(finished: str, *, last: bool) -> list[dict[str, Any]]:
    """The worker container's status after an OOM kill: ``last``, restarted since (running)."""
    ended = {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": finished}}
    if last:
        return [{"name": "worker", "state": {"running": {}}, "lastState": ended}]
    return [{"name": "worker", "state": ended}]


RUNNING = Observed(
    launcher_job=launcher(),
    pods=[launcher_pod("Running"), worker(0), worker(1)],
    service={"metadata": {"name": "test"}},
)
DONE = Observed(
    launcher_job=launcher("Complete", completionTime="2024-05-01T10:05:00Z"),
    pods=[launcher_pod("Succeeded"), worker(0), worker(1)],
    service={"metadata": {"name": "test"}},
)


def sync(lives: Lives, job: api.MPIJob, seen: Observed, at: datetime) -> News:
    """One reconcile as the handler runs it: the record, the status, what is new; then the
    status written and the news announced."""
    record = lives.of(KEY, job, seen)
    result = rules.next_status(job, seen, at)
    news = record.news(result.steps, result.worker_failures)
    record.announced(news)
    job.status = result.status
    return news


def reasons(news: News) -> list[str]:
    return [e.reason for e in news.events]


def cleared(job: api.MPIJob) -> None:
    """What a tenant writes through ``mpijobs/status``: no conditions, no completionTime."""
    job.status = job.status.model_copy(update={"conditions": [], "completion_time": None})


# --- the steps of a job's life -------------------------------------------------------------------


def test_a_job_s_life_is_announced_once_and_ten_status_rewrites_announce_nothing() -> None:
    lives, job = Lives(), _job()
    first = sync(lives, job, Observed(), T0)
    assert [s.transition for s in first.steps] == [Transition.CREATED]
    assert reasons(first) == [keys.REASON_CREATED]
    running = sync(lives, job, RUNNING, T0 + timedelta(minutes=1))
    assert [s.transition for s in running.steps] == [Transition.RUNNING]
    assert reasons(running) == []  # upstream's MPIJobRunning is the status's, every sync
    done = sync(lives, job, DONE, T0 + timedelta(minutes=5))
    # Upstream's default cleanPodPolicy (None) leaves the workers running: said in the same
    # write, once.
    assert [s.transition for s in done.steps] == [
        Transition.SUCCEEDED,
        Transition.WORKERS_LEFT_RUNNING,
    ]
    assert reasons(done) == [keys.REASON_SUCCEEDED, keys.REASON_WORKERS_LEFT_RUNNING]

    for n in range(10):
        cleared(job)
        again = sync(lives, job, DONE, T0 + timedelta(minutes=6 + n))
        # The status is the children's again ...
        assert job.status.is_true(keys.COND_SUCCEEDED)
        assert job.status.is_true(keys.COND_CREATED)
        assert job.status.completion_time == T0 + timedelta(minutes=5)
        # ... and nothing is counted or posted again.
        assert (again.steps, again.failures, again.failure_reasons) == ([], [], [])
        assert again.events == []
        # The Events of what the rewrite made the status say again go to the check of lost
        # Events only (posted if the API lacks them), with the children's own times.
        assert [(i.event.reason, i.event.message, i.since) for i in again.known][:2] == [
            (keys.REASON_CREATED, CREATED, T0),
            (keys.REASON_SUCCEEDED, SUCCEEDED, T0 + timedelta(minutes=5)),
        ]
        assert [i.event.reason for i in again.known][2:] == [keys.REASON_WORKERS_LEFT_RUNNING]


def test_a_job_ends_once_succeeded_or_failed_whichever_was_seen_first() -> None:
    lives, job = Lives(), _job()
    sync(lives, job, Observed(), T0)
    assert Transition.SUCCEEDED in [s.transition for s in sync(lives, job, DONE, T0).steps]
    cleared(job)
    failed = Observed(launcher_job=launcher("Failed"), pods=DONE.pods, service=DONE.service)
    news = sync(lives, job, failed, T0 + timedelta(minutes=1))
    assert job.status.is_true(keys.COND_FAILED)  # what the children say now
    assert (news.steps, news.failure_reasons, news.events) == ([], [], [])


@pytest.mark.parametrize("status_cleared", [False, True])
def test_after_a_restart_a_job_the_children_show_finished_counts_nothing(
    status_cleared: bool,
) -> None:
    """A new process's record is made from the children at its first sight of the job: a
    finished launcher is no news, whether the status says so (then nothing is computed) or its
    tenant cleared it meanwhile (then the status is restored, and nothing counted)."""
    before, job = Lives(), _job()
    for seen in (Observed(), RUNNING, DONE):
        sync(before, job, seen, T0 + timedelta(minutes=5))
    if status_cleared:
        cleared(job)
    after = Lives()
    first = sync(after, job, DONE, T0 + timedelta(minutes=30))
    assert (first.steps, first.events, first.failure_reasons) == ([], [], [])
    assert job.status.is_true(keys.COND_SUCCEEDED)
    cleared(job)
    assert sync(after, job, DONE, T0 + timedelta(minutes=31)).steps == []


def test_a_kill_between_the_children_and_the_first_status_write_loses_no_created_event() -> None:
    """The job's children exist but its status says nothing (the process that made them was
    killed before it wrote): no count, and the Created Event goes to the check that posts
    it if the API lacks it, dated from the job's creation."""
    lives, job = Lives(), _job()
    made = Observed(service={"metadata": {"name": "test"}})
    news = sync(lives, job, made, T0 + timedelta(seconds=3))
    assert news.steps == []
    assert job.status.is_true(keys.COND_CREATED)
    assert [(i.event.reason, i.since) for i in news.known] == [(keys.REASON_CREATED, T0)]


@pytest.mark.parametrize(
    ("seen", "shown"),
    [
        (Observed(), set()),
        (Observed(config_map={"metadata": {}}), {Transition.CREATED}),
        (Observed(pods=[worker(0, "Pending")]), {Transition.CREATED}),
        (Observed(launcher_job=launcher()), {Transition.CREATED}),
        (RUNNING, {Transition.CREATED, Transition.RUNNING}),
        (
            Observed(launcher_job=launcher("Failed"), pods=[launcher_pod("Failed")]),
            {Transition.CREATED, Transition.RUNNING, Transition.FAILED},
        ),
        (
            DONE,
            {
                Transition.CREATED,
                Transition.RUNNING,
                Transition.SUCCEEDED,
                Transition.WORKERS_LEFT_RUNNING,
            },
        ),
        (
            Observed(pods=[worker(0, "Failed", reason="Evicted"), worker(1)]),
            {Transition.CREATED, Transition.FAILED, Transition.WORKERS_LEFT_RUNNING},
        ),
    ],
)
def test_what_the_children_show_a_job_did(seen: Observed, shown: set[Transition]) -> None:
    assert life.shown_by(_job(), seen)[0] == shown


def test_a_pod_that_is_not_the_job_s_own_shows_nothing() -> None:
    """Pods filed under the job's name but controlled by something else (a tenant's, a
    predecessor's of the same name) are not its children."""
    stranger = worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=False))
    stranger["metadata"]["ownerReferences"][0]["uid"] = "uid-someone-else"
    assert life.shown_by(_job(), Observed(pods=[stranger])) == (set(), {})


def test_the_record_holds_live_jobs_only_and_a_same_named_successor_is_a_new_life() -> None:
    lives, job = Lives(), _job()
    sync(lives, job, Observed(), T0)
    assert len(lives) == 1
    successor = _job()
    successor.metadata.uid = "uid-test-2"
    news = sync(lives, successor, Observed(), T0 + timedelta(minutes=1))
    assert [s.transition for s in news.steps] == [Transition.CREATED]
    assert len(lives) == 1
    lives.forget(KEY)
    assert len(lives) == 0


def test_a_gang_timeout_counts_the_job_failed_once() -> None:
    lives, job = Lives(), _job()
    sync(lives, job, Observed(), T0)
    timed_out = rules.AdmissionOutcome(
        [rules.ConditionChange(keys.COND_FAILED, "True", keys.REASON_GANG_SCHEDULE_TIMEOUT, "x")],
        rules.events.warning(keys.REASON_GANG_SCHEDULE_TIMEOUT, "x"),
        failed=True,
    )
    for n in range(3):
        record = lives.of(KEY, job, Observed())
        result = rules.next_status(job, Observed(), T0, admission=timed_out)
        news = record.news(result.steps, result.worker_failures)
        record.announced(news)
        expected = [keys.REASON_GANG_SCHEDULE_TIMEOUT] if n == 0 else []
        assert (reasons(news), news.failure_reasons) == (expected, expected)
        cleared(job)  # a tenant keeps taking the end back


# --- workers that fail while the job runs ------------------------------------------------------


def running_with(*workers: dict[str, Any]) -> Observed:
    return Observed(
        launcher_job=launcher(),
        pods=[launcher_pod("Running"), *workers],
        service={"metadata": {"name": "test"}},
    )


def test_a_worker_oom_killed_and_restarted_is_named_once_per_kill_in_one_counted_event() -> None:
    lives, job = Lives(), _job(restart=keys.RESTART_ON_FAILURE)
    sync(lives, job, Observed(), T0)
    sync(lives, job, running_with(worker(0), worker(1)), T0)
    killed = running_with(
        worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=True)), worker(1)
    )
    news = sync(lives, job, killed, T0 + timedelta(minutes=2))
    message = (
        "worker pod test-worker-0 container worker OOMKilled (exit code 137) while the job runs; "
        "the kubelet restarts the container (restartPolicy OnFailure)"
    )
    assert [(e.type, e.reason, e.message) for e in news.events] == [
        ("Warning", keys.REASON_WORKER_FAILED, message)
    ]
    assert news.failure_reasons == ["OOMKilled"]
    assert rules.failure_label(news.failure_reasons[0]) == "OOMKilled"
    assert not job.status.finished  # the job runs on

    # The same kill on every later sync, in state and then lastState: said once.
    again = sync(lives, job, killed, T0 + timedelta(minutes=3))
    assert (again.events, again.failure_reasons) == ([], [])

    # Killed again: a new failure, the same text (the recorder counts it up on one Event).
    twice = running_with(
        worker(0, containerStatuses=oom("2024-05-01T10:04:00Z", last=False)), worker(1)
    )
    news = sync(lives, job, twice, T0 + timedelta(minutes=4))
    assert [e.message for e in news.events] == [message]
    assert news.failure_reasons == ["OOMKilled"]


def test_a_failed_worker_of_a_never_restarting_job_is_named_and_the_job_runs_on() -> None:
    lives, job = Lives(), _job(restart=keys.RESTART_NEVER)
    sync(lives, job, Observed(), T0)
    ended = {"terminated": {"reason": "Error", "exitCode": 1, "finishedAt": "2024-05-01T10:02Z"}}
    failed = worker(1, "Failed", containerStatuses=[{"name": "worker", "state": ended}])
    news = sync(lives, job, running_with(worker(0), failed), T0 + timedelta(minutes=2))
    assert [e.message for e in news.events] == [
        "worker pod test-worker-1 container worker Error (exit code 1) while the job runs; "
        "the pod is not restarted"
    ]
    assert not job.status.finished


def test_a_job_whose_worker_failure_ends_it_counts_that_failure_once() -> None:
    """The worker's failure was said (and counted) while the job ran; when its launcher fails
    because of it, the job's failure is counted, its first pod failure not again."""
    lives, job = Lives(), _job(restart=keys.RESTART_NEVER)
    sync(lives, job, Observed(), T0)
    ended = {
        "terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2024-05-01T10:02:00Z"}
    }
    failed = worker(0, "Failed", containerStatuses=[{"name": "worker", "state": ended}])
    assert sync(lives, job, running_with(failed, worker(1)), T0).failure_reasons == ["OOMKilled"]
    over = Observed(
        launcher_job=launcher("Failed"),
        pods=[launcher_pod("Failed"), failed, worker(1)],
        service={"metadata": {"name": "test"}},
    )
    news = sync(lives, job, over, T0 + timedelta(minutes=3))
    assert [s.transition for s in news.steps] == [
        Transition.FAILED,
        Transition.WORKERS_LEFT_RUNNING,  # worker 1
    ]
    assert news.failure_reasons == []
    assert news.failures == []  # the job's Failed Warning names the first failure


def test_after_a_restart_a_failure_older_than_the_process_is_not_news() -> None:
    """What the pods show at this process's first sight of the job is not announced as new: a
    previous process may have said it. Its Warning goes to the check of lost Events (posted
    only if the API lacks it), dated from the kill."""
    job = _job(restart=keys.RESTART_ON_FAILURE)
    killed = running_with(
        worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=True)), worker(1)
    )
    job.status = rules.next_status(job, Observed(), T0).status
    news = sync(Lives(), job, killed, T0 + timedelta(minutes=30))
    assert (news.events, news.failure_reasons) == ([], [])
    assert [(i.event.reason, i.since) for i in news.known] == [
        (keys.REASON_WORKER_FAILED, T0 + timedelta(minutes=2))
    ]


def test_a_status_that_says_finished_and_then_not_makes_no_old_failure_new() -> None:
    """While the status says finished no worker is read, and the record keeps what it has: a
    tenant who writes an end and takes it back does not make old failures news."""
    lives, job = Lives(), _job(restart=keys.RESTART_ON_FAILURE)
    sync(lives, job, Observed(), T0)
    killed = running_with(
        worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=True)), worker(1)
    )
    assert sync(lives, job, killed, T0).failure_reasons == ["OOMKilled"]
    rules.set_condition(job.status, keys.COND_SUCCEEDED, "True", "Forged", "x", T0)
    job.status.completion_time = T0
    assert keys.REASON_WORKER_FAILED not in reasons(sync(lives, job, killed, T0))
    cleared(job)
    news = sync(lives, job, killed, T0)
    assert (news.failures, news.failure_reasons) == ([], [])


def test_a_failure_is_the_same_in_state_and_in_last_state() -> None:
    now = worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=False))
    later = worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=True))
    [a], [b] = observed.failures_of(now), observed.failures_of(later)
    assert (
        (a.key, a.at) == (b.key, b.at) == (("uid-test-worker-0", "worker"), "2024-05-01T10:02:00Z")
    )


def test_a_kill_the_kubelet_shows_again_after_a_later_one_is_not_news() -> None:
    """As a real kubelet reported a crash-looping worker: the second kill alone in ``state``,
    then with the first one back in ``lastState``. Each kill is said once."""
    lives, job = Lives(), _job(restart=keys.RESTART_ON_FAILURE)
    sync(lives, job, Observed(), T0)
    first = {
        "terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2024-05-01T10:02:00Z"}
    }
    second = {
        "terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2024-05-01T10:02:30Z"}
    }
    backing_off = {"waiting": {"reason": "CrashLoopBackOff"}}
    statuses = [
        [{"name": "worker", "state": first}],
        [{"name": "worker", "state": backing_off, "lastState": first}],
        [{"name": "worker", "state": second}],
        [{"name": "worker", "state": second, "lastState": first}],
        [{"name": "worker", "state": backing_off, "lastState": second}],
    ]
    said = []
    for shown in statuses:
        news = sync(lives, job, running_with(worker(0, containerStatuses=shown), worker(1)), T0)
        said.append(len(news.events))
    assert said == [1, 0, 1, 0, 0]


def test_the_failures_of_a_pod_that_is_gone_are_forgotten() -> None:
    lives, job = Lives(), _job(restart=keys.RESTART_ON_FAILURE)
    sync(lives, job, Observed(), T0)
    killed = running_with(
        worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=True)), worker(1)
    )
    sync(lives, job, killed, T0)
    assert set(lives.of(KEY, job, killed).failures) == {("uid-test-worker-0", "worker")}
    assert lives.of(KEY, job, running_with(worker(1))).failures == {}


def test_a_worker_deleted_by_someone_is_no_failure() -> None:
    gone = worker(0, containerStatuses=oom("2024-05-01T10:02:00Z", last=False))
    gone["metadata"]["deletionTimestamp"] = "2024-05-01T10:02:00Z"
    assert observed.failures_of(gone) == []

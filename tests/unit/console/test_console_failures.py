"""``mpijob get`` says why a job failed and what a finished job leaves running."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from mpijob.console import jobs, render
from support.console_objects import NOW, condition, job_body, pod_body

pytestmark = pytest.mark.unit


def text(view: jobs.JobView) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=100, color_system=None).print(render.job_details(view))
    return buffer.getvalue()


def oom_killed(name: str) -> dict[str, object]:
    pod = pod_body(name, phase="Failed")
    pod["status"]["containerStatuses"] = [
        {"name": "w", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    ]
    return pod


def test_a_failed_job_shows_its_condition_and_the_oom_killed_pod() -> None:
    message = (
        "Job has reached the specified backoff limit: ; first failure: worker pod "
        "vgg16-worker-0 container w OOMKilled (exit code 137); 1 other pod failed"
    )
    failed = {**condition("Failed"), "reason": "BackoffLimitExceeded/", "message": message}
    body = job_body(conditions=[condition("Created"), failed])
    view = jobs.job_view(body, [oom_killed("vgg16-worker-0")], NOW)
    assert view.why == (f"Failed (BackoffLimitExceeded/): {message}",)
    out = " ".join(text(view).split())
    assert f"Why: Failed (BackoffLimitExceeded/): {message}" in out
    assert view.instances[0].status == "OOMKilled"


def test_workers_left_running_are_shown_and_a_false_condition_is_not() -> None:
    left = {**condition("WorkersLeftRunning"), "message": "2 worker pod(s) running"}
    body = job_body(conditions=[condition("Succeeded"), left])
    assert jobs.job_view(body, [], NOW).why == (
        "WorkersLeftRunning (MPIJobWorkersLeftRunning): 2 worker pod(s) running",
    )
    gone = {**condition("WorkersLeftRunning", "False"), "message": "none"}
    assert jobs.job_view(job_body(conditions=[gone]), [], NOW).why == ()
    assert "Why:" not in text(jobs.job_view(job_body(conditions=[gone]), [], NOW))

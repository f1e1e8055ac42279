"""The tables of ``mpijob get`` and ``mpijob list``, as a pipe and as a terminal see them."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console, RenderableType

from mpijob.console import jobs, render
from support.console_objects import NOW, condition, decision_body, job_body, topology_job_pods

pytestmark = pytest.mark.unit

ANSI = re.compile(r"\x1b\[")


def text(renderable: RenderableType, *, terminal: bool = False) -> str:
    buffer = io.StringIO()
    # As rich decides for sys.stdout: colour on a terminal, none on a pipe.
    console = Console(
        file=buffer,
        width=200,
        force_terminal=terminal,
        color_system="standard" if terminal else None,
    )
    console.print(renderable)
    return buffer.getvalue()


def running_view() -> jobs.JobView:
    body = job_body(conditions=[condition("Created"), condition("Running")])
    return jobs.job_view(body, topology_job_pods(), NOW)


def test_get_prints_the_job_fields_then_the_instance_table() -> None:
    out = text(render.job_details(running_view()))
    lines = [line.rstrip() for line in out.splitlines()]
    assert lines[:7] == [
        "Name:      vgg16",
        "Status:    RUNNING",
        "Namespace: team-a",
        "Priority:  N/A",
        "Trainer:   MPIJOB",
        "Duration:  1m30s",
        "GPUs:      4",
    ]
    table = lines[lines.index("Instances:") + 1 :]
    assert table[0].split() == [
        "NAME",
        "STATUS",
        "AGE",
        "IS_CHIEF",
        "GPU(Requested)",
        "GPU(IDs)",
        "NODE",
    ]
    assert table[1].split() == [
        "vgg16-launcher-x7k2p",
        "Running",
        "1m",
        "true",
        "0",
        "N/A",
        "gpu-node-1",
    ]
    assert table[2].split() == ["vgg16-worker-0", "Running", "1m", "false", "1", "0", "gpu-node-0"]
    assert len(table) == 7


def test_piped_text_has_no_colour_and_a_terminal_gets_colour() -> None:
    view = running_view()
    assert not ANSI.search(text(render.job_details(view)))
    assert ANSI.search(text(render.job_details(view), terminal=True))


def test_a_job_without_pods_says_so() -> None:
    out = text(render.job_details(jobs.job_view(job_body(), [], NOW)))
    assert "Instances: none yet" in out
    assert "NAME" not in out


def test_placement_summary_is_shown_when_the_operator_wrote_one() -> None:
    job = job_body()
    view = jobs.job_view(job, [], NOW, decision=decision_body(job, "gpu-node-0: GPUs 0,1,2,3"))
    assert "Placement: gpu-node-0: GPUs 0,1,2,3" in text(render.job_details(view))


def test_list_has_one_row_per_job_with_the_launcher_node() -> None:
    views = jobs.job_views([job_body("vgg16"), job_body("idle")], topology_job_pods(), NOW)
    rows = [line.split() for line in text(render.jobs_table(views)).splitlines()]
    assert rows == [
        ["NAME", "STATUS", "TRAINER", "DURATION", "GPU(Requested)", "NODE"],
        ["idle", "PENDING", "MPIJOB", "1m30s", "4", "N/A"],
        ["vgg16", "PENDING", "MPIJOB", "1m30s", "4", "gpu-node-1"],
    ]


def test_list_of_every_namespace_puts_the_namespace_first() -> None:
    bodies = [job_body("vgg16"), job_body("resnet", namespace="team-b", workers=2, gpus=4)]
    views = jobs.job_views(bodies, topology_job_pods(), NOW)
    rows = [line.split() for line in text(render.jobs_table(views, namespaces=True)).splitlines()]
    assert rows == [
        ["NAMESPACE", "NAME", "STATUS", "TRAINER", "DURATION", "GPU(Requested)", "NODE"],
        ["team-a", "vgg16", "PENDING", "MPIJOB", "1m30s", "4", "gpu-node-1"],
        ["team-b", "resnet", "PENDING", "MPIJOB", "1m30s", "8", "N/A"],
    ]


def test_a_finished_job_without_pods_says_none_are_left() -> None:
    done = job_body(conditions=[condition("Succeeded")], completion="2026-03-01T11:59:00Z")
    out = text(render.job_details(jobs.job_view(done, [], NOW)))
    assert "Instances: none left" in out
    assert "GPUs:      4" in out

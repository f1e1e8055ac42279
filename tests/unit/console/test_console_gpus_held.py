"""``mpijob get`` per worker: the GPUs chosen, those its DRA claim got, those it really holds."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from mpijob import keys
from mpijob.console import jobs, render
from support.console_objects import NOW, condition, job_body, pod_body

UUIDS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000" for i in range(8)]


def placed_pod(index: int, gpus: list[int], *, actual: list[str] | None = None) -> dict[str, Any]:
    """A worker of vgg16 placed on ``gpus`` of gpu-node-0, whose pod uses a DRA claim."""
    pod = pod_body(f"vgg16-worker-{index}", gpus=len(gpus), gpu_ids=",".join(map(str, gpus)))
    annotations = pod["metadata"]["annotations"]
    annotations[keys.GPU_UUIDS] = ",".join(UUIDS[g] for g in gpus)
    annotations[keys.GPU_CLAIM] = f"vgg16-worker-{index}-gpus"
    if actual is not None:
        annotations[keys.GPU_ACTUAL] = ",".join(actual)
    return pod


def claim(pod: str, devices: list[str] | None) -> dict[str, Any]:
    """The worker's claim, allocated ``devices`` of gpu-node-0 (None: not allocated yet)."""
    body: dict[str, Any] = {"metadata": {"name": f"{pod}-gpus", "namespace": "team-a"}}
    if devices is not None:
        results = [
            {"request": "gpus", "driver": keys.NVIDIA_GPU_DRIVER, "pool": "gpu-node-0", "device": d}
            for d in devices
        ]
        body["status"] = {"allocation": {"devices": {"results": results}}}
    return body


def rows(view: jobs.JobView) -> list[list[str]]:
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(render.job_details(view))
    lines = buffer.getvalue().splitlines()
    start = lines.index("Instances:") + 1
    return [line.split() for line in lines[start:] if line.strip()]


def view(pods: list[dict[str, Any]], claims: list[dict[str, Any]], **kw: Any) -> jobs.JobView:
    body = job_body(workers=2, gpus=2, conditions=[condition("Running")])
    return jobs.job_view(body, pods, NOW, claims=claims, **kw)


def test_allocated_devices_become_indices_in_index_order() -> None:
    assert jobs.allocated_gpus(claim("w", ["gpu-5", "gpu-4"])) == "4,5"
    assert jobs.allocated_gpus(claim("w", None)) == ""
    assert jobs.allocated_gpus(None) == ""
    assert jobs.allocated_gpus(claim("w", ["gpu-1-mig-1g.10gb-9-0"])) == "gpu-1-mig-1g.10gb-9-0"


def test_actual_uuids_become_indices_where_known() -> None:
    pod = placed_pod(0, [0, 1], actual=[UUIDS[0], UUIDS[6]])
    assert jobs.actual_gpus(pod) == f"0,{UUIDS[6]}"
    assert jobs.actual_gpus(pod, {UUIDS[6]: 6}) == "0,6"
    assert jobs.actual_gpus(placed_pod(0, [0, 1])) == ""


def test_a_claim_allocated_the_chosen_gpus_is_one_more_column_without_a_mark() -> None:
    pods = [placed_pod(0, [0, 1]), placed_pod(1, [2, 3])]
    claims = [claim("vgg16-worker-0", ["gpu-1", "gpu-0"]), claim("vgg16-worker-1", None)]
    table = rows(view(pods, claims))
    assert table[0] == [
        "NAME",
        "STATUS",
        "AGE",
        "IS_CHIEF",
        "GPU(Requested)",
        "GPU(IDs)",
        "GPU(Allocated)",
        "NODE",
    ]
    assert [r[5:] for r in table[1:]] == [
        ["0,1", "0,1", "gpu-node-0"],
        ["2,3", "N/A", "gpu-node-0"],
    ]
    assert not view(pods, claims).not_honoured


def test_other_gpus_than_chosen_are_marked_and_explained() -> None:
    pods = [
        placed_pod(0, [0, 1], actual=[UUIDS[0], UUIDS[6]]),
        placed_pod(1, [2, 3]),
    ]
    claims = [
        claim("vgg16-worker-0", ["gpu-0", "gpu-6"]),
        claim("vgg16-worker-1", ["gpu-2", "gpu-3"]),
    ]
    job = view(pods, claims, uuid_index={"gpu-node-0": {u: i for i, u in enumerate(UUIDS)}})
    assert job.not_honoured
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(render.job_details(job))
    lines = buffer.getvalue().splitlines()
    table = rows(job)
    assert table[0][5:] == ["GPU(IDs)", "GPU(Allocated)", "GPU(Actual)", "NODE"]
    assert [r[5:] for r in table[1:3]] == [
        ["0,1", "0,6!", "0,6!", "gpu-node-0"],
        ["2,3", "2,3", "N/A", "gpu-node-0"],
    ]
    assert lines[-1] == render.NOT_HONOURED_NOTE


def test_a_terminal_shows_the_mismatch_in_red() -> None:
    pods = [placed_pod(0, [0, 1], actual=[UUIDS[0], UUIDS[6]])]
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, force_terminal=True, color_system="standard")
    console.print(render.job_details(view(pods, [])))
    assert "\x1b[1;31m" + f"0,{UUIDS[6]}!" in buffer.getvalue()


def test_without_claims_or_reports_the_table_is_arenas() -> None:
    table = rows(view([pod_body("vgg16-worker-0", gpu_ids="3")], []))
    assert table[0][5:] == ["GPU(IDs)", "NODE"]
    assert table[1][5:] == ["3", "gpu-node-0"]

"""Admission driven by the real job placement, as the handler wires the two together."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from mpijob.gang import queue as admission_queue
from mpijob.gang.queue import Admit, Wait, WaitingJob
from mpijob.placement import topologies
from mpijob.placement.job import JobRequest, NodeState, NoFit, Placement, claim, place_job

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _waiting(name: str, at: int) -> WaitingJob:
    return WaitingJob("default", name, f"uid-{name}", T0 + timedelta(seconds=at))


def _placer(
    nodes: Sequence[NodeState], requests: dict[str, JobRequest]
) -> Callable[[WaitingJob, Sequence[Placement]], Placement | NoFit]:
    def try_place(job: WaitingJob, granted: Sequence[Placement]) -> Placement | NoFit:
        state = tuple(nodes)
        for placement in granted:
            state = claim(state, placement)
        return place_job(requests[job.name], state)

    return try_place


def test_jobs_admitted_in_one_pass_never_share_a_gpu() -> None:
    node = NodeState("dgx-0", topologies.dgx1_v100())
    requests = {"a": JobRequest(4, 1), "b": JobRequest(4, 1)}
    decisions = admission_queue.decide(
        [_waiting("a", 1), _waiting("b", 2)], _placer([node], requests), now=T0
    )
    assert all(isinstance(d, Admit) for d in decisions)
    gpus = [
        {(w.node, g) for w in d.placement.assignments for g in w.gpus}
        for d in decisions
        if isinstance(d, Admit)
    ]
    assert len(gpus[0]) == len(gpus[1]) == 4
    assert not gpus[0] & gpus[1]


def test_a_job_that_does_not_fit_waits_with_the_placements_message() -> None:
    nodes = [
        NodeState("dgx-0", topologies.dgx1_v100(), frozenset(range(6))),
        NodeState("dgx-1", topologies.dgx1_v100(), frozenset(range(6))),
    ]
    requests = {"big": JobRequest(1, 4), "small": JobRequest(1, 1)}
    decisions = admission_queue.decide(
        [_waiting("small", 2), _waiting("big", 1)], _placer(nodes, requests), now=T0
    )
    big, small = decisions
    assert isinstance(big, Wait)
    assert big.message.startswith("needs 4 GPUs on one opted-in node")
    assert small == Wait(
        _waiting("small", 2),
        "queued behind default/big, which is ahead in the admission order",
        _waiting("big", 1),
    )

"""Our own all-or-nothing admission: order, head-of-line blocking, fairness and timeouts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from mpijob.gang import queue as admission_queue
from mpijob.gang.queue import Admit, TimedOut, Wait, WaitingJob
from support.gang_jobs import job, template

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Gpus:
    """A stand-in placement: how many GPUs a job was given."""

    count: int


@dataclass(frozen=True)
class NoRoom:
    reason: str


def waiting(name: str, *, at: int = 0, priority: int = 0, **kwargs: object) -> WaitingJob:
    return WaitingJob(
        "default",
        name,
        f"uid-{name}",
        T0 + timedelta(seconds=at),
        priority,
        **kwargs,  # type: ignore[arg-type]
    )


class Pool:
    """A pool of GPUs; jobs need the number of GPUs their name's suffix says (``big-8``)."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.calls: list[str] = []

    def try_place(self, job: WaitingJob, granted: Sequence[Gpus]) -> Gpus | NoRoom:
        self.calls.append(job.name)
        need = int(job.name.rsplit("-", 1)[1])
        free = self.free - sum(g.count for g in granted)
        if need > free:
            return NoRoom(f"needs {need} GPUs; {free} free")
        return Gpus(need)


def test_admission_order_is_priority_then_submission_time_then_name() -> None:
    jobs = [
        waiting("late-1", at=30),
        waiting("b-1", at=10),
        waiting("a-1", at=10),
        waiting("urgent-1", at=50, priority=1000),
        replace(waiting("a-1", at=10), namespace="aaa"),
    ]
    order = [(j.namespace, j.name) for j in admission_queue.admission_order(jobs)]
    assert order == [
        ("default", "urgent-1"),
        ("aaa", "a-1"),
        ("default", "a-1"),
        ("default", "b-1"),
        ("default", "late-1"),
    ]


def test_jobs_that_fit_are_admitted_and_count_against_each_other() -> None:
    pool = Pool(free=8)
    decisions = admission_queue.decide(
        [waiting("a-4", at=1), waiting("b-4", at=2)], pool.try_place, now=T0
    )
    assert decisions == [
        Admit(waiting("a-4", at=1), Gpus(4)),
        Admit(waiting("b-4", at=2), Gpus(4)),
    ]


def test_a_job_that_does_not_fit_waits_with_the_placements_reason() -> None:
    decisions = admission_queue.decide([waiting("big-16")], Pool(free=8).try_place, now=T0)
    assert decisions == [Wait(waiting("big-16"), "needs 16 GPUs; 8 free")]


def test_jobs_behind_a_head_that_does_not_fit_wait_and_are_not_even_tried() -> None:
    """Strict head-of-line blocking: the small job would fit, but it would delay the big one."""
    pool = Pool(free=4)
    big, small = waiting("big-8", at=1), waiting("small-1", at=2)
    decisions = admission_queue.decide([small, big], pool.try_place, now=T0)
    assert decisions == [
        Wait(big, "needs 8 GPUs; 4 free"),
        Wait(small, "queued behind default/big-8, which is ahead in the admission order", big),
    ]
    assert pool.calls == ["big-8"]


def test_pools_do_not_block_each_other() -> None:
    big = waiting("big-8", at=1, pool="a100")
    small = waiting("small-1", at=2, pool="v100")
    decisions = admission_queue.decide([big, small], Pool(free=4).try_place, now=T0)
    assert decisions[1] == Admit(small, Gpus(1))


def test_a_job_that_never_fits_does_not_block_the_line() -> None:
    impossible = waiting("huge-64", at=1, fits_when_empty=False)
    small = waiting("small-1", at=2)
    decisions = admission_queue.decide([impossible, small], Pool(free=4).try_place, now=T0)
    assert decisions == [Wait(impossible, "needs 64 GPUs; 4 free"), Admit(small, Gpus(1))]


def test_a_higher_priority_job_goes_first() -> None:
    low, high = waiting("low-4", at=1), waiting("high-4", at=2, priority=10)
    decisions = admission_queue.decide([low, high], Pool(free=4).try_place, now=T0)
    assert decisions[0] == Admit(high, Gpus(4))
    assert isinstance(decisions[1], Wait)


def test_a_big_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    """8 GPUs, all busy with 1-GPU jobs; a 4-GPU job arrives, then a new 1-GPU job every tick
    while one running job ends every tick. Greedy admission would fill each freed GPU with a new
    small job forever; head-of-line blocking admits the big job once four GPUs are free, and no
    small job submitted after it starts before it."""
    capacity = 8
    running = {f"old{i}-1": 1 for i in range(capacity)}
    queue = [waiting("big-4", at=0)]
    admitted_at: dict[str, int] = {}
    for tick in range(1, 50):
        running.pop(next(iter(running)), None)  # the oldest running job ends
        queue.append(waiting(f"s{tick}-1", at=tick))
        pool = Pool(free=capacity - sum(running.values()))
        for decision in admission_queue.decide(queue, pool.try_place, now=T0):
            if isinstance(decision, Admit):
                running[decision.job.name] = decision.placement.count
                admitted_at[decision.job.name] = tick
                queue.remove(decision.job)
        if "big-4" in admitted_at:
            break
    assert admitted_at.get("big-4") == 4
    assert all(name == "big-4" for name in admitted_at)


def test_a_job_past_its_deadline_times_out_and_leaves_the_line() -> None:
    head = waiting("big-8", at=0, deadline=T0 + timedelta(seconds=60))
    small = waiting("small-1", at=1)
    decisions = admission_queue.decide(
        [head, small], Pool(free=4).try_place, now=T0 + timedelta(minutes=1)
    )
    assert decisions == [
        TimedOut(
            head,
            "MPIJob default/big-8 was not admitted within scheduleTimeoutSeconds=60 of its "
            "creation: needs 8 GPUs; 4 free",
        ),
        Admit(small, Gpus(1)),
    ]


def test_a_queued_job_past_its_deadline_times_out_too() -> None:
    head = waiting("big-8", at=0)
    late = waiting("small-1", at=1, deadline=T0 + timedelta(seconds=30))
    decisions = admission_queue.decide(
        [head, late], Pool(free=4).try_place, now=T0 + timedelta(seconds=30)
    )
    assert isinstance(decisions[1], TimedOut)
    assert decisions[1].message.endswith(
        "queued behind default/big-8, which is ahead in the admission order"
    )


def test_a_job_that_fits_at_its_deadline_is_admitted() -> None:
    """The timeout fails jobs that are still waiting; one that fits is no longer waiting."""
    fits = waiting("small-1", at=0, deadline=T0 + timedelta(seconds=10))
    decisions = admission_queue.decide([fits], Pool(free=4).try_place, now=T0 + timedelta(hours=1))
    assert decisions == [Admit(fits, Gpus(1))]


def test_waiting_job_reads_priority_creation_and_deadline_from_the_mpijob() -> None:
    mpi_job = job(
        policy={"scheduleTimeoutSeconds": 120},
        worker=template(priority_class="high"),
        workers=2,
    ).model_copy(deep=True)
    mpi_job.metadata.creation_timestamp = T0
    got = admission_queue.waiting_job(mpi_job, priority_values={"high": 1000}, pool="gpu")
    assert got == WaitingJob(
        "default", "test", "uid-1", T0, 1000, T0 + timedelta(seconds=120), "gpu", True
    )


def test_only_the_class_the_workers_carry_ranks_and_only_if_it_exists() -> None:
    """A class named by the policy or the launcher, which the pods holding the GPUs never
    carry, ranks nothing; nor does a class no PriorityClass object defines."""
    values = {"high": 1000}
    for unused in (
        job(policy={"priorityClass": "high"}, workers=1),
        job(launcher=template(priority_class="high"), workers=1),
        job(worker=template(priority_class="missing"), workers=1),
    ):
        unused.metadata.creation_timestamp = T0
        assert admission_queue.waiting_job(unused, priority_values=values).priority == 0


def test_a_job_waiting_for_its_nodes_blocks_only_jobs_that_need_them() -> None:
    """The head holds the nodes it may go to; a job that may go elsewhere is placed there, a job
    with no other node waits behind it."""
    pinned = replace(waiting("hog-8", at=1, priority=10), nodes=frozenset({"busy"}))
    victim = replace(waiting("victim-4", at=2), nodes=frozenset({"idle"}))
    either = replace(waiting("either-4", at=3), nodes=frozenset({"busy", "idle"}))
    same = replace(waiting("same-1", at=4), nodes=frozenset({"busy"}))
    seen: list[tuple[str, frozenset[str]]] = []

    def try_place(job: WaitingJob, granted: Sequence[Gpus]) -> Gpus | NoRoom:
        seen.append((job.name, job.avoid))
        if job.name == "hog-8":
            return NoRoom("needs 8 GPUs on busy; 0 free")
        return Gpus(int(job.name.rsplit("-", 1)[1]))

    decisions = admission_queue.decide([same, either, victim, pinned], try_place, now=T0)
    assert decisions[1] == Admit(victim, Gpus(4))
    assert decisions[2] == Admit(either, Gpus(4))
    assert decisions[3] == Wait(
        same, "queued behind default/hog-8, which is ahead in the admission order", pinned
    )
    assert seen == [
        ("hog-8", frozenset()),
        ("victim-4", frozenset()),
        ("either-4", frozenset({"busy"})),
    ]


def test_waiting_job_needs_a_stored_job() -> None:
    with pytest.raises(ValueError, match="creationTimestamp"):
        admission_queue.waiting_job(job(workers=1), priority_values={})


def test_a_job_over_its_quota_waits_without_holding_the_pool() -> None:
    """Its namespace's quota, not the pool's GPUs, stops it: the jobs behind it go on."""
    pool = Pool(free=8)
    capped, small = waiting("capped-8", at=1), waiting("small-4", at=2)

    def try_place(
        job: WaitingJob, granted: Sequence[Gpus]
    ) -> Gpus | NoRoom | admission_queue.OverQuota:
        if job.name == "capped-8":
            return admission_queue.OverQuota("ResourceQuota gpus allows 0")
        return pool.try_place(job, granted)

    decisions = admission_queue.decide([capped, small], try_place, now=T0)
    assert decisions == [
        Wait(capped, "ResourceQuota gpus allows 0", over_quota=True),
        Admit(small, Gpus(4)),
    ]


def test_a_job_of_another_namespace_ahead_is_not_named() -> None:
    pinned = replace(waiting("hog-8", at=1), namespace="hostile-b", nodes=frozenset({"busy"}))
    same = replace(waiting("same-1", at=2), nodes=frozenset({"busy"}))
    decisions = admission_queue.decide(
        [pinned, same], lambda job, granted: NoRoom("needs 8 GPUs on busy"), now=T0
    )
    assert decisions[1] == Wait(
        same,
        "queued behind a job of another namespace, which is ahead in the admission order",
        pinned,
    )

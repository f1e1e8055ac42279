"""The work queue's guarantees, which a level-based reconciler relies on."""

from __future__ import annotations

import asyncio

import pytest

from mpijob.platform.workqueue import WorkQueue
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


async def test_a_waiting_key_is_queued_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("ns/a")
    queue.add("ns/b")
    assert len(queue) == 2
    assert [await queue.get(), await queue.get()] == ["ns/a", "ns/b"]


async def test_a_key_added_while_processing_comes_back_after_done_not_before() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("ns/a")
    key = await queue.get()
    queue.add("ns/a")  # an event arrives while a worker reconciles ns/a
    assert len(queue) == 0  # no second worker may take it meanwhile
    queue.done(key)
    assert len(queue) == 1
    assert await asyncio.wait_for(queue.get(), 1) == "ns/a"


@virtual_time
async def test_failures_back_off_exponentially_and_success_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.03)
    delays = [queue.add_rate_limited("ns/a") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.03, 0.03]
    assert await asyncio.wait_for(queue.get(), 1) == "ns/a"
    queue.forget("ns/a")
    assert queue.add_rate_limited("ns/a") == 0.01


@virtual_time
async def test_delayed_add_arrives_after_its_delay() -> None:
    queue: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    start = loop.time()
    queue.add_after("ns/a", 0.05)
    assert len(queue) == 0
    assert "ns/a" in queue  # waiting on its timer
    assert "ns/b" not in queue
    assert await asyncio.wait_for(queue.get(), 1) == "ns/a"
    assert loop.time() - start == pytest.approx(0.05)


async def test_a_key_is_in_the_queue_while_it_waits_not_while_it_is_processed() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("ns/a")
    assert "ns/a" in queue
    key = await queue.get()
    assert key not in queue
    queue.add(key)
    assert key in queue  # comes back once done

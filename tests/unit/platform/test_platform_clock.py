"""The one clock (``mpijob.platform.clock``): the real one reads the event loop's time, which a
virtual-time test moves, and the heartbeat that ``/healthz`` reads ages on the clock it is given."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

import pytest

from mpijob.platform.clock import SYSTEM
from mpijob.platform.workers import HEARTBEAT_SECONDS, Workers
from support.virtual_time import FakeClock, LoopClock, virtual_time

pytestmark = pytest.mark.unit


@virtual_time
async def test_the_real_clocks_monotonic_seconds_are_the_loops_and_move_with_its_timers() -> None:
    start = SYSTEM.monotonic()
    assert start == asyncio.get_running_loop().time()
    await asyncio.sleep(3600)  # no wall time: the virtual loop jumps to the timer
    assert SYSTEM.monotonic() - start == pytest.approx(3600)


def test_off_the_loop_the_real_clock_reads_time_monotonic() -> None:
    read: list[float] = []
    before = time.monotonic()
    thread = threading.Thread(target=lambda: read.append(SYSTEM.monotonic()))
    thread.start()
    thread.join()
    assert before <= read[0] <= time.monotonic()


def test_the_real_wall_clock_is_utc() -> None:
    before = datetime.now(UTC)
    now = SYSTEM.now()
    assert now.tzinfo is UTC
    assert before <= now <= datetime.now(UTC)


@virtual_time
async def test_a_loop_clocks_wall_time_moves_with_the_virtual_loop() -> None:
    clock = LoopClock(datetime(2026, 1, 1, tzinfo=UTC))
    await asyncio.sleep(90)
    assert clock.now() == datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)


def test_the_heartbeat_is_alive_within_its_window_and_not_after() -> None:
    clock = FakeClock()
    workers = Workers(threadiness=1, clock=clock)
    assert workers.alive(30)  # made just now
    clock.advance(29.5)
    assert workers.alive(30)
    clock.advance(0.5)
    assert not workers.alive(30)


@virtual_time
async def test_a_beating_loop_stays_alive_and_a_stalled_one_does_not() -> None:
    clock = FakeClock()
    workers = Workers(threadiness=1, clock=clock)
    beat = asyncio.create_task(workers.beat())
    for _ in range(10):
        await asyncio.sleep(HEARTBEAT_SECONDS)  # the loop turns: each turn a beat
        clock.advance(HEARTBEAT_SECONDS)
        assert workers.alive(HEARTBEAT_SECONDS * 2)
    beat.cancel()  # the loop stalls: no beat from here on
    clock.advance(HEARTBEAT_SECONDS * 2)
    assert not workers.alive(HEARTBEAT_SECONDS * 2)

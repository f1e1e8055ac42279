"""The client-side rate limit: Events behind the requests jobs wait for, no rate lost."""

from __future__ import annotations

import asyncio

import pytest

from mpijob.platform import ratelimit
from mpijob.platform.ratelimit import TokenBucket
from support.virtual_time import FakeClock, virtual_time

pytestmark = pytest.mark.unit


async def test_an_event_waits_until_no_urgent_request_waits() -> None:
    bucket = TokenBucket(qps=50, burst=1)
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await bucket.take(urgent=urgent)
        order.append(name)

    await take("first", True)  # the burst is spent: every later take waits for a token
    tasks = [asyncio.create_task(take(f"child-{i}", True)) for i in range(2)]
    await asyncio.sleep(0)  # the children wait for tokens when the Event comes
    tasks.append(asyncio.create_task(take("event", False)))
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(take("child-2", True)))  # came later, still goes first
    await asyncio.gather(*tasks)
    assert order == ["first", "child-0", "child-1", "child-2", "event"]


@virtual_time
async def test_without_urgent_requests_an_event_is_not_held() -> None:
    bucket = TokenBucket(qps=50, burst=2)
    await asyncio.wait_for(bucket.take(urgent=False), timeout=0.01)


@virtual_time
async def test_a_spare_token_leaves_half_the_burst_to_urgent_requests() -> None:
    bucket = TokenBucket(qps=100, burst=21)
    for _ in range(12):  # 9 left: fewer than the 10 kept for urgent requests
        await bucket.take()
    waiting = asyncio.create_task(bucket.take(urgent=False))
    await asyncio.sleep(0.005)
    assert not waiting.done()
    await asyncio.wait_for(waiting, timeout=0.1)  # 10 ms later the bucket holds 11 again


@virtual_time
async def test_under_sustained_load_a_request_that_is_not_urgent_still_gets_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ratelimit, "SPARE_WAIT_SECONDS", 0.05)
    bucket = TokenBucket(qps=200, burst=1)
    stop = asyncio.Event()

    async def urgent_load() -> None:
        while not stop.is_set():
            await bucket.take()

    loads = [asyncio.create_task(urgent_load()) for _ in range(3)]
    await asyncio.sleep(0.01)
    await asyncio.wait_for(bucket.take(urgent=False), timeout=0.5)
    stop.set()
    await asyncio.gather(*loads)


class LateWaking(TokenBucket):
    """A bucket on a clock of its own, whose sleepers wake 5 ms late (a busy event loop)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.clock = FakeClock(0.0)
        super().__init__(qps, burst, clock=self.clock)

    async def _sleep(self, seconds: float) -> None:
        self.clock.advance(seconds + 0.005)


async def test_a_late_wake_costs_no_rate() -> None:
    bucket = LateWaking(qps=100, burst=1)
    for _ in range(101):  # the burst, then 100 tokens at 100 per second
        await bucket.take()
    # Crediting tokens from each wake-up rather than from the clock would take 100 x 15 ms.
    assert bucket.clock.monotonic() == pytest.approx(1.0 + 0.005)

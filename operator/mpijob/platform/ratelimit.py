"""The client-side rate limit of the operator's API requests (see :mod:`mpijob.platform.kube`)."""

from __future__ import annotations

import asyncio
from typing import Final

from mpijob.platform.clock import SYSTEM, Clock

#: Seconds a request that is not urgent waits at most for a spare token (see TokenBucket).
SPARE_WAIT_SECONDS: Final = 5.0


class TokenBucket:
    """Client-side QPS/burst limit, as client-go applies with --kube-api-qps/--kube-api-burst.

    Requests that are not urgent (Events, ``discover_hosts.sh`` refreshes: what background
    writers send) take only spare tokens: none while an urgent request (the children a job
    needs, its status) waits, and none that would leave the bucket less than half full. Under
    sustained load they wait instead of costing the next child its token; after
    :data:`SPARE_WAIT_SECONDS` one takes its turn like any request, so they never starve.
    """

    def __init__(self, qps: float, burst: int, *, clock: Clock = SYSTEM) -> None:
        """``clock``: what tokens accrue by; its monotonic seconds must be the event loop's,
        which the waits for a token run on (the real clock's are)."""
        self._clock = clock
        self._rate = qps
        self._capacity = float(max(burst, 1))
        self._reserve = (self._capacity - 1) / 2
        self._tokens = self._capacity
        self._last: float | None = None
        self._lock = asyncio.Lock()
        self._urgent = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    async def take(self, *, urgent: bool = True) -> None:
        if not urgent:
            await self._take_spare()
            return
        self._urgent += 1
        self._quiet.clear()
        try:
            await self._take()
        finally:
            self._urgent -= 1
            if not self._urgent:
                self._quiet.set()

    async def _take(self) -> None:
        """Reserve a token, then wait until it is due. Tokens accrue from the clock, never from
        when a sleeper woke: a loop that wakes a sleeper late (a busy moment) loses no rate."""
        async with self._lock:
            self._accrue()
            self._tokens -= 1
            if self._tokens < 0:
                await self._sleep(-self._tokens / self._rate)

    async def _take_spare(self) -> None:
        deadline = self._now() + SPARE_WAIT_SECONDS
        while (left := deadline - self._now()) > 0:
            if self._urgent:
                try:
                    await asyncio.wait_for(self._quiet.wait(), left)
                except TimeoutError:
                    break
                continue
            async with self._lock:
                self._accrue()
                if self._tokens - 1 >= self._reserve:
                    self._tokens -= 1
                    return
                refill = (self._reserve + 1 - self._tokens) / self._rate
            await self._sleep(min(refill, left))
        await self._take()

    def _accrue(self) -> None:
        now = self._now()
        if self._last is not None:
            self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
        self._last = now

    def _now(self) -> float:
        return self._clock.monotonic()

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

"""Virtual time for asyncio tests: the loop's clock jumps to its next timer when nothing else
can run, so sleeps, timeouts and token buckets take no wall time and are never late.

``@virtual_time`` on an ``async def`` test runs it on :class:`VirtualTimeLoop`, whose clock
starts at 0. The clock moves only while every task waits for a timer: a test that sleeps an
hour finishes at once, and one that measures ``loop.time()`` reads exact figures, whatever the
machine's load. Only for tests whose waits are the loop's own (timers, futures, events): work
in a thread or a subprocess is not waited for before the clock jumps, so a timeout around it
would expire at once.

Code that decides by time is given a clock (:class:`mpijob.platform.clock.Clock`): the real
one reads a virtual-time loop's clock as it is; :class:`FakeClock` stands still until the test
moves it, and :class:`LoopClock` gives the loop's virtual time a wall clock too.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Final, ParamSpec

P = ParamSpec("P")

#: Where the fake clocks' wall time starts.
WALL: Final = datetime(2026, 1, 1, tzinfo=UTC)


class _JumpingSelector(selectors.DefaultSelector):
    """Looks for I/O without waiting; a wait the loop asks for moves the clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer at all: only I/O (a thread's answer) can wake the loop
            return super().select(None)
        ready = super().select(0)
        if not ready and timeout > 0:
            self.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock that advances only to its next timer; see the module."""

    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(selector=self._jumping)

    def time(self) -> float:
        return self._jumping.now


def virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run the async ``test`` on a fresh :class:`VirtualTimeLoop` (its fixtures as usual)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(*args, **kwargs))

    return run


class FakeClock:
    """A :class:`~mpijob.platform.clock.Clock` that stands still until the test moves it:
    :meth:`advance` moves its monotonic seconds and its wall clock together."""

    def __init__(self, seconds: float = 1000.0, wall: datetime = WALL) -> None:
        self.seconds = seconds
        self.wall = wall

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> datetime:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.seconds += seconds
        self.wall += timedelta(seconds=seconds)


class LoopClock:
    """A :class:`~mpijob.platform.clock.Clock` on the running loop's time, the wall clock
    included (``wall`` at the loop's 0): on :class:`VirtualTimeLoop` both move with its
    timers, for code that waits on the loop and compares wall times too."""

    def __init__(self, wall: datetime = WALL) -> None:
        self.wall = wall

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def now(self) -> datetime:
        return self.wall + timedelta(seconds=self.monotonic())

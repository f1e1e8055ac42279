"""Virtual time for asyncio tests: the loop's clock jumps to its next timer when nothing else
can run, so sleeps, timeouts and token buckets take no wall time and are never late.

``@virtual_time`` on an ``async def`` test runs it on :class:`VirtualTimeLoop`, whose clock
starts at 0. The clock moves only while every task waits for a timer: a test that sleeps an
hour finishes at once, and one that measures ``loop.time()`` reads exact figures, whatever the
machine's load. Only for tests whose waits are the loop's own (timers, futures, events): work
in a thread or a subprocess is not waited for before the clock jumps, so a timeout around it
would expire at once.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")


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
    """A clock for code that takes one as a ``clock`` callable (seconds, as
    :func:`time.monotonic`): it stands still until the test moves :attr:`now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

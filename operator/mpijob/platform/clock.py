"""The one clock that the operator's decisions by time read: :class:`Clock`.

Whatever expires, waits out a grace or keeps to a deadline (an expectation of a child not yet
seen, a written admission not yet seen, a held GPU share, a Secret's re-read, the Lease, a
lost Event's age, a node's grace, the heartbeat, a token bucket's refill, a watch that ended at
once) reads the :class:`Clock` given to the object that decides it when it was built: the real
one, :data:`SYSTEM`, unless a test gives one whose time it moves itself, so that every expiry is
tested on virtual time, without sleeping. Pure functions read no clock: they take ``now``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Final, Protocol


class Clock(Protocol):
    """Both times a decision can read: monotonic seconds for how long ago or how long left,
    and the wall clock for what is compared with, or written into, the API's timestamps."""

    def monotonic(self) -> float:
        """Seconds that only ever increase, from an arbitrary start."""
        ...

    def now(self) -> datetime:
        """The wall clock, in UTC."""
        ...


class SystemClock:
    """The real clock. Its monotonic seconds are the running event loop's own, which asyncio's
    timers (sleeps, timeouts, deadlines) run on, so a deadline read here is kept by a wait there:
    ``time.monotonic()`` on the standard loop, libuv's time on uvloop (cached at each turn of the
    loop), the test's on a virtual-time loop. Off the loop (a thread), ``time.monotonic()``: the
    same clock as the loops', to within a turn of the loop."""

    def monotonic(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


#: The real clock: every object that decides by time reads it unless it is given another.
SYSTEM: Final[Clock] = SystemClock()

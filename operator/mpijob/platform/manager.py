"""The runner of the operator's long-lived work, as controller-runtime's manager runs runnables.

Start-up builds every object and hands each piece of work to :class:`Manager` as a
:class:`Runnable` that says whether it needs the Lease. The manager starts the others at once
(the heartbeat, what only reads), campaigns for the Lease only then (start-up has finished, so a
replica that cannot start never holds it), and starts the work that writes (reconcile workers,
admission passes, GPU-share placement) once this replica leads. Every write is also fenced in
the API adapter (:class:`mpijob.platform.kube.Fence`), so work that lags behind a lost Lease
cannot write either.

When the Lease is lost the process exits (status 1), as controller-runtime's manager does by
default: the work that writes is cancelled first and nothing of this replica's memory (queues,
grants in flight, the share ledger's pending holds, expectations) outlives its leadership. The
kubelet restarts the pod, which starts from empty state as a standby with warm-up like any
other. Restarting the controllers in place from empty state would keep the process but needs
every object to be rebuilt, Kopf's watches included; an exit gives that by construction.

A graceful stop (SIGTERM) cancels the work that writes, lets the Event and patch lines drain
while the Lease still holds, and then releases the Lease (client-go's ``ReleaseOnCancel``), so
the standby takes over at its next retry instead of a lease duration later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from mpijob import metrics
from mpijob.platform.leader import LeaderElector

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runnable:
    """A piece of long-lived work: ``run()`` returns only when cancelled (or failed)."""

    name: str
    run: Callable[[], Awaitable[None]]
    needs_lease: bool


def exit_at_once(status: int) -> None:
    """End the process now: no task of it runs another step, no request of it is sent again."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


class Manager:
    """Runs :class:`Runnable` s; see the module."""

    def __init__(
        self,
        runnables: Sequence[Runnable],
        *,
        elector: LeaderElector | None,
        stopping: Sequence[Callable[[], Awaitable[None]]] = (),
        exit: Callable[[int], None] = exit_at_once,
    ) -> None:
        """``elector`` None: a single replica, which leads from the start. ``stopping``: what
        a graceful stop awaits after the work that writes has stopped and before the Lease is
        released (the Event and patch lines draining). ``exit``: how the process ends when the
        Lease is lost."""
        self._always = [r for r in runnables if not r.needs_lease]
        self._leading = [r for r in runnables if r.needs_lease]
        self._elector = elector
        self._stopping = stopping
        self._exit = exit
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.Task[None]] = []
        self._campaign: asyncio.Task[None] | None = None
        self._stopped: asyncio.Task[None] | None = None
        self.started = False

    def ready(self) -> bool:
        """``/readyz``: start-up finished and this replica campaigns or leads: it is ready to
        lead (a standby is ready too, so a rollout waits for both)."""
        return self.started and (
            self._elector is None or (self._campaign is not None and not self._campaign.done())
        )

    def start(self) -> None:
        """Start the work that needs no Lease, then the campaign (or, without an elector, the
        work that writes). Once: a second call is an error, never a second set of workers."""
        if self.started:
            raise RuntimeError("the manager is started once")
        self._tasks = [asyncio.create_task(_logged(r), name=r.name) for r in self._always]
        if self._elector is None:
            metrics.IS_LEADER.set(1)
            self._start_writers()
        else:
            self._campaign = asyncio.create_task(self._lead(self._elector), name="leader-election")
        self.started = True

    def _start_writers(self) -> None:
        self._writers = [asyncio.create_task(_logged(r), name=r.name) for r in self._leading]

    async def _lead(self, elector: LeaderElector) -> None:
        run = asyncio.create_task(elector.run(), name="lease")
        leading = asyncio.create_task(elector.leading.wait())
        try:
            await asyncio.wait({run, leading}, return_when=asyncio.FIRST_COMPLETED)
            if leading.done():
                self._start_writers()
            try:
                why = await run
            except Exception as e:  # a campaign that failed is a Lease no longer renewed
                why = f"the campaign failed: {type(e).__name__}: {e}"
        finally:
            leading.cancel()
            run.cancel()
        for task in self._writers:
            task.cancel()
        log.error(
            "Lost the Lease (%s); exiting so that this replica restarts from empty state",
            why,
            extra={"identity": elector.identity},
        )
        self._exit(1)

    async def stop(self) -> None:
        """The graceful stop: the work that writes, then the lines drain, the Lease released,
        the rest cancelled. Once: a second call (start-up's ``finally`` after Kopf's cleanup
        activity) waits for the first, and never writes the Lease a second time."""
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopped)

    async def _stop(self) -> None:
        await _cancel(self._writers)
        for drain in self._stopping:
            with contextlib.suppress(Exception):
                await drain()
        if self._campaign is not None:
            await _cancel([self._campaign])
        if self._elector is not None:
            await self._elector.release()
        await _cancel(self._tasks)


async def _cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _logged(runnable: Runnable) -> None:
    try:
        await runnable.run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s stopped on an error", runnable.name)
        raise

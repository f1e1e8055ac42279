"""The runner of the operator's long-lived work, as controller-runtime's manager runs runnables.

Start-up builds every object and hands each piece of work to :class:`Manager` as a
:class:`Runnable` that says whether it needs the Lease. The manager starts the others at once
(the heartbeat, what only reads), campaigns for the Lease only then (start-up has finished and
the caches are filled, so a replica that cannot start never holds it), and starts the work that
writes (reconcile workers, admission passes, GPU-share placement) once this replica leads. Every
write is also fenced in the API adapter (:class:`mpijob.platform.kube.Fence`), so work that lags
behind a lost Lease cannot write either.

Before the campaign (and, without an elector, before the work that writes) the caches must
fill: ``synced`` waits for every informer's first list and Kopf's indices, within a deadline
(:data:`mpijob.platform.workers.CACHE_SYNC_SECONDS`, controller-runtime's ``CacheSyncTimeout``).
``/readyz`` is false until then, and a replica whose caches do not fill in time exits without
having asked for the Lease, so the replica that leads is one whose caches are warm.

Every runnable is required work: one that raises (or is cancelled by anything but the manager)
ends the process with status 1, as a runnable's error ends controller-runtime's manager. The
stop is the graceful one below, bounded by :data:`STOP_ON_FAILURE_SECONDS`, so the Lease is
released and the standby leads at its next retry. A runnable that returns has finished its work
(the heap trimmer, where the C library has no ``malloc_trim``).

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
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from mpijob import metrics
from mpijob.platform.leader import LeaderElector

log = logging.getLogger(__name__)

#: How long the stop after a runnable's failure (the writers cancelled, the lines drained, the
#: Lease released) may take before the process exits anyway: a drain that hangs must not keep a
#: replica that does no work alive. The Lease, if not released by then, lapses by itself.
STOP_ON_FAILURE_SECONDS = 3.0


@dataclass(frozen=True)
class Runnable:
    """A piece of long-lived work: ``run()`` returns only when cancelled (or failed), or when
    it has nothing left to do."""

    name: str
    run: Callable[[], Coroutine[Any, Any, None]]
    needs_lease: bool


def exit_at_once(status: int) -> None:
    """End the process now: no task of it runs another step, no request of it is sent again."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


async def _already() -> None:
    """No caches to wait for."""


class Manager:
    """Runs :class:`Runnable` s; see the module."""

    def __init__(
        self,
        runnables: Sequence[Runnable],
        *,
        elector: LeaderElector | None,
        synced: Callable[[], Awaitable[None]] = _already,
        stopping: Sequence[Callable[[], Awaitable[None]]] = (),
        exit: Callable[[int], None] = exit_at_once,
    ) -> None:
        """``elector`` None: a single replica, which leads from the start. ``synced``: returns
        once the caches are filled, raises when they are not in time (awaited before the
        campaign). ``stopping``: what a graceful stop awaits after the work that writes has
        stopped and before the Lease is released (the Event and patch lines draining).
        ``exit``: how the process ends when the Lease is lost or a runnable fails."""
        self._always = [r for r in runnables if not r.needs_lease]
        self._leading = [r for r in runnables if r.needs_lease]
        self._elector = elector
        self._synced = synced
        self._stopping = stopping
        self._exit = exit
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.Task[None]] = []
        self._campaign: asyncio.Task[None] | None = None
        self._stopped: asyncio.Task[None] | None = None
        self._failure: asyncio.Task[None] | None = None
        self.started = False
        self._filled = False
        """The caches are filled (``synced`` returned)."""
        self._ending = False
        """The manager stops, has lost the Lease, or exits after a failure: what it cancels
        from now on is no failure, and the replica is not ready."""

    def ready(self) -> bool:
        """``/readyz``: start-up finished, the caches are filled, and this replica campaigns or
        leads: it is ready to lead (a standby is ready too, so a rollout waits for both); false
        again once it stops or exits. Called from the monitoring server's thread, so it reads
        only flags, each set by the loop in one assignment."""
        return self.started and self._filled and not self._ending

    def start(self) -> None:
        """Start the work that needs no Lease, then wait for the caches and campaign (or,
        without an elector, start the work that writes). Once: a second call is an error,
        never a second set of workers."""
        if self.started:
            raise RuntimeError("the manager is started once")
        self._tasks = [self._run(r) for r in self._always]
        self._campaign = asyncio.create_task(self._lead(), name="leader-election")
        self._campaign.add_done_callback(partial(self._ended, "leader-election"))
        self.started = True

    def _run(self, runnable: Runnable) -> asyncio.Task[None]:
        task = asyncio.create_task(runnable.run(), name=runnable.name)
        task.add_done_callback(partial(self._ended, runnable.name))
        return task

    def _ended(self, name: str, task: asyncio.Task[None]) -> None:
        """A task of the manager ended: a return is its work done; anything else, unless the
        manager itself cancelled it, is required work no longer done."""
        if self._ending:
            return
        if task.cancelled():  # by none of the manager's: a bug's CancelledError
            self._fail(f"{name} was cancelled")
        elif (error := task.exception()) is not None:
            self._fail(f"{name} failed: {type(error).__name__}: {error}", error)

    def _fail(self, why: str, error: BaseException | None = None) -> None:
        """Log why, stop as gracefully as :data:`STOP_ON_FAILURE_SECONDS` allows (the Lease
        released, so the standby leads at its next retry), then exit with status 1."""
        self._ending = True
        log.error(
            "%s; exiting (status 1) so that this replica restarts from empty state",
            why,
            exc_info=error,
            extra={"identity": self._elector.identity} if self._elector is not None else None,
        )
        self._failure = asyncio.create_task(self._stop_and_exit(), name="exit-on-failure")

    async def _stop_and_exit(self) -> None:
        try:
            async with asyncio.timeout(STOP_ON_FAILURE_SECONDS):
                await self.stop()
        except TimeoutError:
            log.warning(
                "Stopping took over %.0f s; exiting without it (the Lease lapses by itself)",
                STOP_ON_FAILURE_SECONDS,
            )
        finally:
            self._exit(1)

    def _start_writers(self) -> None:
        self._writers = [self._run(r) for r in self._leading]

    async def _lead(self) -> None:
        try:
            await self._synced()
        except Exception as e:  # a replica whose caches cannot fill must never lead
            self._fail(f"Start-up failed: filling the caches: {e}")
            return
        self._filled = True
        if self._elector is None:
            metrics.IS_LEADER.set(1)
            self._start_writers()
            return
        elector = self._elector
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
        self._ending = True
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
        self._ending = True
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

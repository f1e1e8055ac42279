"""The reconcile workers: a fixed number of tasks taking job keys from the work queue.

Workers take nothing before every cache is full (:meth:`Workers.open`: Kopf's indices, as the
watch handlers see, and each informer's first list; the manager awaits :meth:`Workers.synced`,
within :data:`CACHE_SYNC_SECONDS`, before it campaigns), run only on the leader (the manager
starts :meth:`Workers.serve` once this replica holds the Lease), retry a failed reconcile with
the queue's per-key backoff, and prove the event loop is alive through a heartbeat: the
liveness probe (Kopf's, on the loop) and ``/readyz`` (the metrics thread) read it. Also
:func:`on_wake`, the loop of the background passes (gang admission, waiting GPU shares).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from mpijob import metrics
from mpijob.api import JobKey
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import NotLeading, transient
from mpijob.platform.workqueue import WorkQueue

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
#: The name Kopf's indices open the workers by (:meth:`Workers.open`); each informer opens
#: them by the name of the index it fills.
KOPF_INDICES = "kopf-indices"
#: How long the caches may take to fill at start-up (controller-runtime's ``CacheSyncTimeout``,
#: 2 minutes): a replica whose caches are still not filled by then exits (status 1), so the
#: kubelet restarts it and its probes say so, rather than it waiting unseen for good.
CACHE_SYNC_SECONDS = 120.0


class CacheSyncTimeout(Exception):
    """The caches were not filled within the deadline; the message names those that were not."""


async def on_wake(
    wake: asyncio.Event,
    interval: float,
    pending: Callable[[], bool],
    work: Callable[[], Awaitable[object]],
    what: str,
) -> None:
    """Run ``work`` whenever ``wake`` is set, or every ``interval`` seconds, while ``pending``
    says there is something to do; a failed run is logged and the next one tries again."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=interval)
        wake.clear()
        if not pending():
            continue
        try:
            await work()
        except Exception:  # one failed pass must not end the loop for good
            log.exception("%s failed; trying again at the next change", what)


class OwnershipError(Exception):
    """A child's name is taken by an object this MPIJob does not control."""


def beat_in_time(age: float, within: float) -> bool:
    """Whether a heartbeat ``age`` seconds old counts as alive: the one rule of readiness's and
    liveness's checks."""
    return age < within


@dataclass
class Workers:
    """The work queue and its reconcile workers; :meth:`serve` is the runnable that needs the
    Lease, :meth:`beat` the heartbeat every replica runs."""

    threadiness: int
    caches: frozenset[str] = frozenset({KOPF_INDICES})
    """What must be full before any sync (each calls :meth:`open` with its name)."""
    queue: WorkQueue[JobKey] = field(default_factory=WorkQueue)
    clock: Clock = SYSTEM
    """What the heartbeat is read on (:meth:`alive` is asked from the metrics server's thread
    too: the real clock reads ``time.monotonic()`` there, the loop's own clock)."""
    heartbeat: float = field(init=False)
    """When the event loop last beat (:meth:`beat`); at first, when this was made."""
    indexed: asyncio.Event = field(default_factory=asyncio.Event)
    _full: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.heartbeat = self.clock.monotonic()

    def open(self, cache: str) -> None:
        """``cache`` is full; once every one is, a sync sees all of a job's children."""
        self._full.add(cache)
        if self._full >= self.caches:
            self.indexed.set()

    async def synced(self, within: float = CACHE_SYNC_SECONDS) -> None:
        """Return once every cache is full; :class:`CacheSyncTimeout` after ``within`` seconds,
        naming the caches still empty (an informer that cannot list its kind, Kopf's indices)."""
        try:
            async with asyncio.timeout(within):
                await self.indexed.wait()
        except TimeoutError:
            missing = ", ".join(sorted(self.caches - self._full))
            raise CacheSyncTimeout(f"not filled within {within:.0f} s: {missing}") from None

    def enqueue(self, key: JobKey) -> None:
        self.queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self.queue))

    def enqueue_rate_limited(self, key: JobKey) -> None:
        """Reconcile ``key`` once its backoff has passed (an MPIJob's own event, as upstream's
        ``AddRateLimited``; see :data:`mpijob.platform.workqueue.BASE_DELAY_SECONDS`)."""
        self.queue.add_rate_limited(key)

    def enqueue_after(self, key: JobKey, delay: float) -> None:
        """Reconcile ``key`` again in ``delay`` seconds (a state that changes with time alone)."""
        self.queue.add_after(key, delay)

    async def serve(self, reconcile: Callable[[JobKey], Awaitable[None]]) -> None:
        """``threadiness`` workers until cancelled (the queue is closed then)."""
        tasks = [
            asyncio.create_task(self._work(reconcile), name=f"reconcile-{i}")
            for i in range(self.threadiness)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            self.queue.close()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    def since_beat(self) -> float:
        """Seconds since the event loop last beat."""
        return self.clock.monotonic() - self.heartbeat

    def alive(self, within: float) -> bool:
        """Whether the event loop beat less than ``within`` seconds ago."""
        return beat_in_time(self.since_beat(), within)

    async def beat(self) -> None:
        while True:
            self.heartbeat = self.clock.monotonic()
            await asyncio.sleep(HEARTBEAT_SECONDS)

    async def _work(self, reconcile: Callable[[JobKey], Awaitable[None]]) -> None:
        await self.indexed.wait()
        while True:
            key = await self.queue.get()
            metrics.QUEUE_DEPTH.set(len(self.queue))
            started = time.perf_counter()
            try:
                await reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                metrics.RECONCILE_ERRORS.inc()
                delay = self.queue.add_rate_limited(key)
                log.warning(
                    "Reconcile of MPIJob %s/%s failed; retrying in %.2fs: %s",
                    *key,
                    delay,
                    exc,
                    # The API's answer or silence, a name taken, a lost Lease: one line each;
                    # anything else is a bug, with its traceback.
                    exc_info=not (
                        transient(exc, refusals=True)
                        or isinstance(exc, OwnershipError | NotLeading)
                    ),
                )
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

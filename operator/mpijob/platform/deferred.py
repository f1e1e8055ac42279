"""Requests nothing waits on, sent after the sync that asked for them, one at a time.

:class:`Line` is the one background writer both kinds use: the Event recorder's creates and
count updates, and :class:`DeferredPatches`. A job's ``discover_hosts.sh`` follows its workers
as they start, so under load every few pod events of a job asked for one more ConfigMap patch,
each holding a reconcile worker and a token of the client's rate limit that the next job's
children needed. Here the sync hands the patch over and goes on; the line sends one request at a
time, not urgent (behind every request a job waits for), and a newer patch of the same object
replaces one still waiting: a burst of refreshes costs one request. A patch that fails is logged
and dropped; the next sync of its job asks again, so nothing is lost but time. The patches of a
job that is deleted are dropped with it (:meth:`DeferredPatches.forget`): under sustained load
the line waits behind every urgent request, and a patch of every job ever deleted would wait in
it for good (``make bench-soak`` found hundreds).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from mpijob.api import JobKey
from mpijob.objects import about
from mpijob.platform.kube import ApiError, NotLeading
from mpijob.platform.kube_api import KubeApi

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]


class Line:
    """Work done by one task, one piece at a time, in the order put; a piece put under a key
    that still waits replaces it in place. The task ends when the line is empty.

    With a ``limit``, at most that many pieces wait: a writer that cannot keep up (its requests
    wait on a rate limit others come first in) must not hold ever more work in memory."""

    def __init__(self, name: str, limit: int | None = None) -> None:
        self._name = name
        self._limit = limit
        self._waiting: OrderedDict[Hashable, Work] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def has_room(self, key: Hashable) -> bool:
        """Whether :meth:`put` under ``key`` would be taken."""
        return self._limit is None or key in self._waiting or len(self._waiting) < self._limit

    def put(self, key: Hashable, work: Work) -> bool:
        """Line ``work`` up; False (and nothing done) when the line is full."""
        if not self.has_room(key):
            return False
        self._waiting[key] = work
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self._name)
        return True

    def discard(self, key: Hashable) -> None:
        """Take the piece waiting under ``key`` out of line, if one does."""
        self._waiting.pop(key, None)

    async def drain(self) -> None:
        """Wait until every piece put so far is done (or failed)."""
        await self._idle.wait()

    async def _run(self) -> None:
        try:
            while self._waiting:
                _, work = self._waiting.popitem(last=False)
                try:
                    await work()
                except NotLeading as e:  # a standby's, or a former leader's: never sent
                    log.info("%s: %s", self._name, e)
                except Exception:
                    log.exception("%s: a background request failed", self._name)
        finally:
            self._idle.set()


class DeferredPatches:
    def __init__(self, kube: KubeApi) -> None:
        self._kube = kube
        self._line = Line("deferred patches")
        self._of_job: dict[JobKey, set[Hashable]] = {}
        """Per live job: what it put in line (some may be sent by now)."""

    def patch(
        self, job: JobKey, api_version: str, kind: str, namespace: str, name: str, patch: Any
    ) -> None:
        """Send ``patch`` (a merge patch) of a child of ``job`` later, in place of one for the
        same object waiting."""
        target = (api_version, kind, namespace, name)

        async def send() -> None:
            try:
                await self._kube.patch(*target, patch, urgent=False)
            except ApiError as e:
                level = logging.DEBUG if e.not_found else logging.WARNING
                log.log(
                    level,
                    "Deferred patch of %s %s/%s failed: %s",
                    kind,
                    namespace,
                    name,
                    e,
                    extra=about(kind, namespace, name),
                )

        self._line.put(target, send)
        self._of_job.setdefault(job, set()).add(target)

    def forget(self, job: JobKey) -> None:
        """The job is deleted: what it put in line and is still waiting goes too."""
        for target in self._of_job.pop(job, ()):
            self._line.discard(target)

    async def drain(self) -> None:
        await self._line.drain()

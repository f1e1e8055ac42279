"""Patches nothing waits on, sent after the sync that asked for them, by one writer.

A job's ``discover_hosts.sh`` follows its workers as they start, so under load every few pod
events of a job asked for one more ConfigMap patch, each holding a reconcile worker and a token
of the client's rate limit that the next job's children needed. Here the sync hands the patch
over and goes on; the writer sends one patch at a time, not urgent (behind every request a job
waits for), and a newer patch of the same object replaces one still waiting: a burst of
refreshes costs one request. A patch that fails is logged and dropped; the next sync of its job
asks again, so nothing is lost but time.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from mpijob.handlers.kube import ApiError, Kube

log = logging.getLogger(__name__)

#: ``(apiVersion, kind, namespace, name)`` of the object a patch is for.
Target = tuple[str, str, str, str]


class DeferredPatches:
    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._waiting: OrderedDict[Target, dict[str, Any]] = OrderedDict()
        self._writer: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Any) -> None:
        """Send ``patch`` (a merge patch) later, in place of one for the same object waiting."""
        self._waiting[(api_version, kind, namespace, name)] = patch
        self._idle.clear()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="deferred patches")

    async def drain(self) -> None:
        """Wait until every patch handed over so far is sent (or failed)."""
        await self._idle.wait()

    async def _write(self) -> None:
        try:
            while self._waiting:
                target, patch = self._waiting.popitem(last=False)
                try:
                    await self._kube.patch(*target, patch, urgent=False)
                except ApiError as e:
                    level = logging.DEBUG if e.not_found else logging.WARNING
                    log.log(level, "Deferred patch of %s %s/%s failed: %s", *target[1:], e)
                except Exception:
                    log.exception("Deferred patch of %s %s/%s failed", *target[1:])
        finally:
            self._idle.set()

"""Posts Kubernetes Events about MPIJobs, as upstream's event recorder does.

Events carry upstream's source component (``mpi-job-controller``) so tooling that filters on it
keeps working. A repeat of the same event (same object, type, reason and message) increments the
``count`` of the first one instead of creating a new object, like client-go's correlator; this
matters because upstream emits ``MPIJobRunning`` on every running sync. Repeats that arrive while
a count update is on its way are carried by the next one (one PATCH with the latest count),
so a burst of syncs costs two writes, not one per sync. Events are not urgent requests: under
load the children and statuses waiting for the client's rate limit go first. Posting never
blocks or fails a reconcile: it runs in the background and only logs its errors.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mpijob import keys
from mpijob.desired.events import Event
from mpijob.handlers.kube import ApiError, Kube

log = logging.getLogger(__name__)

MAX_TRACKED = 4096


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Series:
    """One Event object and how many times it happened."""

    name: str
    count: int = 1
    created: asyncio.Event = field(default_factory=asyncio.Event)
    failed: bool = False
    writing: bool = False
    """A count update is being sent; a repeat meanwhile only raises ``count``."""


class Recorder:
    def __init__(self, kube: Kube, *, instance: str) -> None:
        self._kube = kube
        self._instance = instance
        self._seen: OrderedDict[tuple[str, str, str, str], Series] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def post(self, obj: dict[str, Any], event: Event) -> None:
        """Post ``event`` about ``obj`` (an MPIJob body) in the background."""
        task = asyncio.create_task(self._post(obj, event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _post(self, obj: dict[str, Any], event: Event) -> None:
        meta = obj.get("metadata", {})
        ns, uid = meta.get("namespace", "default"), meta.get("uid", "")
        key = (uid, event.type, event.reason, event.message)
        now = _now()
        series = self._seen.get(key)
        try:
            if series is not None:
                # A repeat: count up the series' Event, once its creation is through.
                series.count += 1
                self._seen.move_to_end(key)
                if series.writing:
                    return  # the update on its way is followed by one with this count
                series.writing = True
                try:
                    await series.created.wait()
                    sent = 1
                    while not series.failed and sent < series.count:
                        sent = series.count
                        patch = {"count": sent, "lastTimestamp": _now()}
                        await self._kube.patch("v1", "Event", ns, series.name, patch, urgent=False)
                finally:
                    series.writing = False
                return
            # Registered before the create is awaited, so a repeat arriving meanwhile joins it.
            series = Series(f"{meta.get('name', 'mpijob')}.{uuid.uuid4().hex[:16]}")
            self._seen[key] = series
            while len(self._seen) > MAX_TRACKED:
                self._seen.popitem(last=False)
            await self._kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": series.name, "namespace": ns},
                    "involvedObject": {
                        "apiVersion": obj.get("apiVersion", keys.API_VERSION),
                        "kind": obj.get("kind", keys.KIND),
                        "name": meta.get("name"),
                        "namespace": ns,
                        "uid": uid,
                        "resourceVersion": meta.get("resourceVersion"),
                    },
                    "type": event.type,
                    "reason": event.reason,
                    "message": event.message,
                    "source": {"component": keys.EVENT_COMPONENT},
                    "reportingComponent": keys.EVENT_COMPONENT,
                    "reportingInstance": self._instance,
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "count": 1,
                },
                urgent=False,
            )
            series.created.set()
        except ApiError as e:
            if series is not None and not series.created.is_set():
                series.failed = True
                series.created.set()
            if e.not_found or (series is not None and series.failed):
                self._seen.pop(key, None)  # expired or never made: start anew next time
            log.warning("Failed to post event", extra={"reason": event.reason, "error": str(e)})
        except Exception:
            if series is not None and not series.created.is_set():
                series.failed = True
                series.created.set()
                self._seen.pop(key, None)
            log.exception("Failed to post event")

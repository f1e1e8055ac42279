"""Posts Kubernetes Events about MPIJobs, as upstream's event recorder does.

Events carry upstream's source component (``mpi-job-controller``) so tooling that filters on it
keeps working. A repeat of the same event (same object, type, reason and message) increments the
``count`` of the first one instead of creating a new object, like client-go's correlator; this
matters because upstream emits ``MPIJobRunning`` on every running sync.

One writer (:class:`~mpijob.handlers.deferred.Line`) sends them, in order, one request at a time,
as client-go's broadcaster does. Events are not urgent requests, and one writer keeps them so:
under load a burst of Events never lines up in the rate limiter ahead of the children and
statuses that jobs wait for. Repeats posted while their Event waits in line ride along with one
count update. Posting never blocks or fails a reconcile; the writer only logs its errors.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from mpijob import keys
from mpijob.desired.events import Event
from mpijob.handlers.deferred import Line
from mpijob.handlers.kube import ApiError, Kube

log = logging.getLogger(__name__)

MAX_TRACKED = 4096


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Series:
    """One Event object and how many times it happened."""

    name: str
    namespace: str
    count: int = 1
    sent: int = 0
    """The count the API has; 0 until the Event is created."""
    failed: bool = False


class Recorder:
    def __init__(self, kube: Kube, *, instance: str) -> None:
        self._kube = kube
        self._instance = instance
        self._seen: OrderedDict[tuple[str, str, str, str], Series] = OrderedDict()
        self._line = Line("event writer")

    def post(self, obj: dict[str, Any], event: Event) -> None:
        """Post ``event`` about ``obj`` (an MPIJob body; a pod's for GPU shares) in the
        background."""
        meta = obj.get("metadata", {})
        uid = meta.get("uid", "")
        key = (uid, event.type, event.reason, event.message)
        series = self._seen.get(key)
        if series is not None and not series.failed:
            series.count += 1
            self._seen.move_to_end(key)
            # One count update in line is enough: it sends the count it finds when its turn comes.
            self._line.put(("update", series.name), partial(self._update, series))
            return
        ns = meta.get("namespace", "default")
        series = Series(f"{meta.get('name', 'mpijob')}.{uuid.uuid4().hex[:16]}", ns)
        self._seen[key] = series
        while len(self._seen) > MAX_TRACKED:
            self._seen.popitem(last=False)
        body = self._event(obj, event, series)
        self._line.put(("create", series.name), partial(self._create, series, body))

    async def drain(self) -> None:
        """Wait until every Event posted so far is sent (or failed)."""
        await self._line.drain()

    async def _create(self, series: Series, body: dict[str, Any]) -> None:
        try:
            await self._kube.create(body, urgent=False)
            series.sent = 1
        except Exception as e:
            series.failed = True
            self._log(body["reason"], e)

    async def _update(self, series: Series) -> None:
        if series.failed or series.sent >= series.count:
            return
        count = series.count
        patch = {"count": count, "lastTimestamp": _now()}
        try:
            await self._kube.patch(
                "v1", "Event", series.namespace, series.name, patch, urgent=False
            )
            series.sent = count
        except Exception as e:
            series.failed = True  # expired or never made: the next repeat starts a new Event
            self._log("count update", e)

    def _event(self, obj: dict[str, Any], event: Event, series: Series) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        now = _now()
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": series.name, "namespace": series.namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", keys.API_VERSION),
                "kind": obj.get("kind", keys.KIND),
                "name": meta.get("name"),
                "namespace": series.namespace,
                "uid": meta.get("uid", ""),
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
        }

    @staticmethod
    def _log(what: str, error: Exception) -> None:
        if isinstance(error, ApiError):
            log.warning("Failed to post event", extra={"reason": what, "error": str(error)})
        else:
            log.error("Failed to post event", exc_info=error, extra={"reason": what})

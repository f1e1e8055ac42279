"""Posts Kubernetes Events about MPIJobs, as upstream's event recorder does.

Events carry upstream's source component (``mpi-job-controller``) so tooling that filters on it
keeps working. A repeat of the same event (same object, type, reason and message) increments the
``count`` of the first one instead of creating a new object, like client-go's correlator; this
matters because upstream emits ``MPIJobRunning`` on every running sync. Posting never blocks
or fails a reconcile: it runs in the background and only logs its errors.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from mpijob import keys
from mpijob.build.events import Event
from mpijob.handlers.kube import ApiError, Kube

log = logging.getLogger(__name__)

MAX_TRACKED = 4096


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    def __init__(self, kube: Kube, *, instance: str) -> None:
        self._kube = kube
        self._instance = instance
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, int]] = OrderedDict()
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
        try:
            if key in self._seen:
                name, count = self._seen[key]
                self._seen[key] = (name, count + 1)
                self._seen.move_to_end(key)
                await self._kube.patch(
                    "v1", "Event", ns, name, {"count": count + 1, "lastTimestamp": now}
                )
                return
            name = f"{meta.get('name', 'mpijob')}.{uuid.uuid4().hex[:16]}"
            await self._kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": name, "namespace": ns},
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
                }
            )
            self._seen[key] = (name, 1)
            while len(self._seen) > MAX_TRACKED:
                self._seen.popitem(last=False)
        except ApiError as e:
            if e.not_found:  # the aggregated event expired; start a new series next time
                self._seen.pop(key, None)
            log.warning("Failed to post event", extra={"reason": event.reason, "error": str(e)})
        except Exception:
            log.exception("Failed to post event")

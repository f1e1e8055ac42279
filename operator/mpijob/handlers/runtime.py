"""What the handlers share for the life of the process: clients, queue, caches, workers.

Kopf's indices are the informer caches (MPIJobs, their pods, launcher Jobs, PodGroups); this
object adds what indices cannot hold: the work queue and its workers, the leader gate, and small
per-job memories that save API requests (children known to exist, objects created but not yet
seen on the watch, the status we last wrote). Created in ``on.startup``, kept in ``memo``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpijob import api, keys, metrics
from mpijob.api import MPIJob
from mpijob.handlers.admission import Admission
from mpijob.handlers.kube import ApiError, Kube
from mpijob.handlers.leader import LeaderElector
from mpijob.handlers.recorder import Recorder
from mpijob.handlers.workqueue import WorkQueue
from mpijob.settings import OperatorSettings

log = logging.getLogger(__name__)

JSON = dict[str, Any]
JobKey = tuple[str, str]
"""(namespace, name) of an MPIJob."""

EXPECTATION_SECONDS = 60.0


@dataclass
class Known:
    """Children of one job (by uid) this process has created or checked already."""

    service: bool = False
    secret: bool = False
    config_data: dict[str, str] | None = None


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: Kube
    recorder: Recorder
    leader: LeaderElector | None
    queue: WorkQueue[JobKey] = field(default_factory=WorkQueue)
    indices: Mapping[str, Any] = field(default_factory=dict)
    known: dict[str, Known] = field(default_factory=dict)
    expected: dict[JobKey, dict[str, tuple[float, JSON]]] = field(default_factory=dict)
    written: dict[JobKey, tuple[str, JSON]] = field(default_factory=dict)
    """Per job: (the resourceVersion our last status write replaced, the body it returned)."""
    priority_values: tuple[float, dict[str, int]] = (0.0, {})
    admission: Admission | None = None
    running: set[JobKey] = field(default_factory=set)
    """Jobs whose Running condition is True, for the gauge."""
    bound: set[JobKey] = field(default_factory=set)
    """Jobs whose creation-to-bound time was observed already."""
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    heartbeat: float = field(default_factory=time.monotonic)

    def beat(self) -> None:
        self.heartbeat = time.monotonic()

    def alive(self, within: float) -> bool:
        return time.monotonic() - self.heartbeat < within

    # --- views over the indices -------------------------------------------------------------

    def _one(self, index: str, key: JobKey) -> JSON | None:
        store = self.indices.get(index, {}).get(key)
        for value in store or ():
            return dict(value)
        return None

    def job_body(self, key: JobKey) -> JSON | None:
        """The newest body of the MPIJob: the cache's, unless our own write is newer."""
        body = self._one("mpijobs_by_key", key)
        if body is None:
            return None
        written = self.written.get(key)
        if written is not None:
            stale_rv, fresh = written
            if body.get("metadata", {}).get("resourceVersion") == stale_rv:
                return fresh
            del self.written[key]
        return body

    def launcher_job(self, key: JobKey) -> JSON | None:
        return self._one("launchers_by_job", key) or self._expected_of(key, "Job")

    def pod_group(self, key: JobKey) -> JSON | None:
        return self._one("podgroups_by_job", key)

    def pods(self, key: JobKey) -> list[JSON]:
        seen = [dict(p) for p in self.indices.get("pods_by_job", {}).get(key) or ()]
        names = {p["metadata"]["name"] for p in seen}
        pending = self.expected.get(key, {})
        now = time.monotonic()
        for name, (at, obj) in list(pending.items()):
            if name in names or now - at > EXPECTATION_SECONDS:
                del pending[name]
            elif obj.get("kind") == "Pod":
                seen.append(obj)
        return seen

    def _expected_of(self, key: JobKey, kind: str) -> JSON | None:
        for name, (at, obj) in list(self.expected.get(key, {}).items()):
            if obj.get("kind") != kind:
                continue
            if time.monotonic() - at > EXPECTATION_SECONDS:
                del self.expected[key][name]
                continue
            return obj
        return None

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, JSON]:
        """Opted-in nodes by name: all of them, or only ``names``."""
        index = self.indices.get("nodes_by_name", {})
        wanted = index.keys() if names is None else [n for n in names if n in index]
        return {name: dict(v) for name in wanted for v in index[name]}

    def placement_snapshot(self) -> tuple[list[JSON], list[JSON], list[MPIJob]]:
        """Opted-in nodes, GPU-holding pods, and the jobs holding placement decisions."""
        pods = [
            dict(p) for store in self.indices.get("gpu_pods_by_node", {}).values() for p in store
        ]
        jobs = []
        for store in self.indices.get("mpijobs_by_key", {}).values():
            for body in store:
                if keys.PLACEMENT_DECISION in (
                    (body.get("metadata") or {}).get("annotations") or {}
                ):
                    try:
                        jobs.append(api.parse(body))
                    except api.InvalidMPIJob:
                        continue
        return list(self.nodes().values()), pods, jobs

    def expect(self, key: JobKey, obj: JSON) -> None:
        """Remember a child we created until its watch event arrives."""
        self.expected.setdefault(key, {})[obj["metadata"]["name"]] = (time.monotonic(), obj)

    def seen_launcher(self, key: JobKey) -> None:
        for name, (_, obj) in list(self.expected.get(key, {}).items()):
            if obj.get("kind") == "Job":
                del self.expected[key][name]

    def forget(self, key: JobKey, uid: str | None = None) -> None:
        """Drop every memory of a deleted job."""
        self.expected.pop(key, None)
        self.written.pop(key, None)
        if uid:
            self.known.pop(uid, None)

    # --- workers ----------------------------------------------------------------------------

    def enqueue(self, key: JobKey) -> None:
        self.queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self.queue))

    def start_workers(self, reconcile: Callable[[Runtime, JobKey], Any]) -> None:
        for i in range(self.settings.threadiness):
            self.workers.append(
                asyncio.create_task(self._work(reconcile), name=f"reconcile-worker-{i}")
            )

    async def _work(self, reconcile: Callable[[Runtime, JobKey], Any]) -> None:
        while True:
            if self.leader is not None:
                await self.leader.leading.wait()
            key = await self.queue.get()
            metrics.QUEUE_DEPTH.set(len(self.queue))
            started = time.perf_counter()
            try:
                requeue_after = await reconcile(self, key)
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
                    exc_info=not _expected_error(exc),
                )
            else:
                self.queue.forget(key)
                if requeue_after:
                    self.queue.add_after(key, requeue_after)
            finally:
                self.queue.done(key)
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def stop(self) -> None:
        self.queue.close()
        for task in self.workers:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.workers, return_exceptions=True)
        await self.recorder.drain()
        if self.leader is not None:
            self.leader.stop()
        self.kube.close()


def _expected_error(exc: Exception) -> bool:
    """Errors that are part of normal operation need no traceback in the log."""
    return isinstance(exc, ApiError | OwnershipError)


class OwnershipError(Exception):
    """A child's name is taken by an object this MPIJob does not control."""

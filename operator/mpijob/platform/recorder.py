"""Posts Kubernetes Events about MPIJobs, as upstream's event recorder does.

Events carry upstream's source component (``mpi-job-controller``) so tooling that filters on it
keeps working. A repeat of the same event (same object, type, reason and message) increments the
``count`` of the first one instead of creating a new object, like client-go's correlator; this
matters because upstream emits ``MPIJobRunning`` on every running sync.

One writer (:class:`~mpijob.platform.deferred.Line`) sends them, in order, one request at a time,
as client-go's broadcaster does. Events are not urgent requests, and one writer keeps them so:
under load a burst of Events never lines up in the rate limiter ahead of the children and
statuses that jobs wait for. Repeats posted while their Event waits in line ride along with one
count update. Posting never blocks or fails a reconcile.

The Events that matter are posted at least once, though the operator is killed between a status
write and its Event, or the API server goes away:

- a create or count update that fails for want of the API (no answer, 429, 5xx) is retried,
  backing off to :data:`RETRY_MAX_SECONDS`, until it is answered; a refusal (4xx) is logged and
  dropped, as before;
- each job's status says which of them its transitions posted
  (:func:`mpijob.desired.events.implied_by`). On its first sync in this process,
  :meth:`Recorder.ensure` posts those the API does not have. What the API has is read once per
  start, before the first such check: one list of this component's MPIJob Events (per watched
  namespace, 500 a page), which also lets a repeat after a restart count up the Event the
  previous process made. A transition older than :data:`EVENT_TTL_SECONDS` is not posted again:
  its Event may have expired, which says nothing of whether it was posted.

What the list finds is read as a tenant may have written it: anyone who can create Events in a
namespace can give one this component's source, any reason and message, and (with an
``eventTime``, which lifts the API server's check) any ``involvedObject``, another namespace's
job included. So an Event is filed under its object only within the object's namespace (a
series is keyed by namespace, uid, type, reason and message); a listed Event whose own
namespace is not its object's, whose object is not an MPIJob of :data:`keys.API_VERSION`, or
whose reason or message is longer than any this recorder posts (:data:`REASON_LIMIT`,
:data:`MESSAGE_LIMIT`: every Event posted is cut to them) is none of this component's and is
not kept; of the rest, the :data:`MAX_TRACKED` last seen are. Forged Events in a tenant's own
namespace can then fill the tenant's own series and nothing else: at worst they push other
series out of the cap, and then a repeat after the restart starts a new Event instead of
counting one up, and a check may post an Event again that the API has.

The cost in requests: one list (a page per 500 Events) per start, plus one create for each
Event found missing; nothing is written on the MPIJobs.

At most :data:`MAX_WAITING` Events wait to be sent, as client-go's broadcaster queues at most
1,000: when jobs come faster than the rate limit leaves room for their Events, the Events
beyond that are dropped (counted by ``mpi_operator_events_dropped_total``, and logged once for
each stretch of drops) rather than held in memory without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from mpijob import keys, metrics
from mpijob.api.errors import EVENT_MESSAGE_LIMIT, truncate_message
from mpijob.api.models import format_time
from mpijob.desired import events
from mpijob.desired.events import Event
from mpijob.objects import about
from mpijob.platform.backoff import exponential
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.deferred import Line
from mpijob.platform.kube import create_or_adopt, transient
from mpijob.platform.kube_api import KubeApi

log = logging.getLogger(__name__)

#: The most Event series kept to count up. Each holds at most about 3 KiB (its strings are
#: bounded below), so 4,096 of them hold at most about 11 MiB, whoever wrote the Events.
MAX_TRACKED = 4096
#: The longest reason and message (UTF-8 bytes) of an Event this recorder posts: every Event is
#: cut to them (:func:`_bounded`), so a listed Event that is longer was not made here. They are
#: the limits the ``events.k8s.io`` API enforces on an Event's reason and note, and the message
#: limit is upstream's ``truncateMessage``, which the status messages already follow.
REASON_LIMIT = 128
MESSAGE_LIMIT = EVENT_MESSAGE_LIMIT
#: The longest name (a DNS subdomain) and uid (a UUID the API server makes) of an Event's
#: object: a longer one is no object's, and the Event is not kept.
NAME_LIMIT = 253
UID_LIMIT = 36
#: The most Events (creates, count updates, checks after a restart) waiting to be sent.
MAX_WAITING = 1000
#: The API server's default ``--event-ttl`` (1 h): an older transition's Event may be gone.
EVENT_TTL_SECONDS = 3600.0
#: The first and the longest wait between two tries of a request the API did not answer.
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0


@dataclass
class Series:
    """One Event object and how many times it happened."""

    name: str
    namespace: str
    count: int = 1
    sent: int = 0
    """The count the API has; 0 until the Event is created."""
    failed: bool = False
    subject: dict[str, Any] = field(default_factory=dict)
    """The object the Event is about, for log lines (:func:`mpijob.objects.about`)."""


Key = tuple[str, str, str, str, str]
"""What makes Events one series: their object's namespace and uid, their type, reason and message.
The namespace is part of it because an Event belongs in its object's namespace only."""


def _key(obj: dict[str, Any], event: Event) -> Key:
    """The series of ``event`` (already :func:`_bounded`) about ``obj``."""
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    return (namespace, str(meta.get("uid") or ""), event.type, event.reason, event.message)


def _bounded(event: Event) -> Event:
    """``event`` as it is posted: its reason and message cut to :data:`REASON_LIMIT` and
    :data:`MESSAGE_LIMIT` bytes."""
    reason = truncate_message(event.reason, REASON_LIMIT)
    message = truncate_message(event.message, MESSAGE_LIMIT)
    if (reason, message) == (event.reason, event.message):
        return event
    return replace(event, reason=reason, message=message)


def _listed(item: dict[str, Any]) -> tuple[Key, Series] | None:
    """A listed Event as the series it continues, or None when it cannot be one this recorder
    made: another namespace's object, not an MPIJob, or longer than anything posted here."""
    meta = item.get("metadata") or {}
    involved = item.get("involvedObject") or {}
    source = item.get("source") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    uid, job = str(involved.get("uid") or ""), str(involved.get("name") or "")
    type_, reason, message = (str(item.get(f) or "") for f in ("type", "reason", "message"))
    if not (
        namespace
        and name
        and uid
        and str(involved.get("namespace") or "") == namespace
        and involved.get("kind") == keys.KIND
        and involved.get("apiVersion") == keys.API_VERSION
        and source.get("component") == keys.EVENT_COMPONENT
        and type_ in ("Normal", "Warning")
        and len(reason.encode()) <= REASON_LIMIT
        and len(message.encode()) <= MESSAGE_LIMIT
        and len(uid) <= UID_LIMIT
        and len(job) <= NAME_LIMIT
    ):
        return None
    count = item.get("count")
    count = count if isinstance(count, int) and count > 0 else 1
    series = Series(name, namespace, count, count, subject=about(keys.KIND, namespace, job))
    return (namespace, uid, type_, reason, message), series


def _newest_first(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` (Events) by when they last happened, the latest first."""
    return sorted(
        items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""), reverse=True
    )


def _about(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return about(str(obj.get("kind") or keys.KIND), meta.get("namespace"), meta.get("name"))


class Recorder:
    def __init__(
        self,
        kube: KubeApi,
        *,
        instance: str,
        namespaces: Sequence[str] = (),
        clock: Clock = SYSTEM,
    ) -> None:
        self._kube = kube
        self._clock = clock
        """The wall clock the Events' times are written from and a lost one's age is read on."""
        self._instance = instance
        self._namespaces = tuple(namespaces)
        self._seen: OrderedDict[Key, Series] = OrderedDict()
        """The Event series to count up, the least recently posted first."""
        self._line = Line("event writer", limit=MAX_WAITING)
        self._dropping = False
        """The last Event offered was dropped: the next drop is not logged again."""
        self._loaded = False
        """What the API has was read (or cannot be)."""
        self._blind = False
        """It cannot be read (a refusal): then nothing is posted again, which might repeat."""
        self._ensured: dict[tuple[str, str], str] = {}
        """Live jobs (namespace, name) whose implied Events were checked in this process, with
        the uid checked: a job of the same name created again is checked afresh. A deleted job
        is forgotten (:meth:`forget`), so this holds what exists, not what ever did."""
        self._posted: dict[tuple[str, str], str] = {}
        """Live jobs (namespace, name) an Event was posted about, with their uid: what
        :meth:`forget` drops the series of (a job can have Events and never a check, when the
        line had no room for it)."""
        self._closing = asyncio.Event()

    def post(self, obj: dict[str, Any], event: Event) -> None:
        """Post ``event`` about ``obj`` (an MPIJob body; a pod's for GPU shares) in the
        background."""
        meta = obj.get("metadata", {})
        uid = meta.get("uid", "")
        if obj.get("kind", keys.KIND) == keys.KIND and uid:
            self._posted[(meta.get("namespace", ""), meta.get("name", ""))] = uid
        event = _bounded(event)
        key = _key(obj, event)
        series = self._seen.get(key)
        if series is not None and not series.failed:
            # One count update in line is enough: it sends the count it finds when its turn comes.
            if self._offer(("update", series.name), partial(self._update, series), event):
                series.count += 1
                self._seen.move_to_end(key)
            return
        ns = meta.get("namespace", "default")
        series = Series(
            f"{meta.get('name', 'mpijob')}.{uuid.uuid4().hex[:16]}", ns, subject=_about(obj)
        )
        body = self._event(obj, event, series)
        if not self._offer(("create", series.name), partial(self._create, series, body), event):
            return
        self._track(key, series)

    def _track(self, key: Key, series: Series) -> None:
        """Keep ``series`` as the most recent, and no more than :data:`MAX_TRACKED` in all."""
        self._seen[key] = series
        while len(self._seen) > MAX_TRACKED:
            self._seen.popitem(last=False)

    def _offer(
        self, key: tuple[str, ...], work: Callable[[], Awaitable[None]], event: Event
    ) -> bool:
        """Line ``work`` up, or drop it (counted; the first of a stretch of drops logged)."""
        if self._line.put(key, work):
            self._dropping = False
            return True
        metrics.EVENTS_DROPPED.inc()
        if not self._dropping:
            self._dropping = True
            log.warning(
                "Dropped Event %s and those after it while %d wait to be sent: they come faster "
                "than the API rate limit (--kube-api-qps) leaves room for them",
                event.reason,
                MAX_WAITING,
            )
        return False

    def ensure(self, obj: dict[str, Any], implied: Callable[[], Sequence[events.Implied]]) -> None:
        """Once per job and process: post those of ``implied()`` (the Events the job's status
        says were posted) that the API does not have, in the background."""
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        job = (meta.get("namespace", ""), meta.get("name", ""))
        if not uid or self._ensured.get(job) == uid or not self._line.has_room(("load",)):
            return  # checked already, or no room in line: the job's next sync checks it
        if not self._loaded:
            self._line.put(("load",), self._load)
        if self._line.put(("ensure", uid), partial(self._ensure, obj, list(implied()))):
            self._ensured[job] = uid

    def forget(self, job: tuple[str, str]) -> None:
        """The job (namespace, name) is deleted: nothing of it needs checking or counting up any
        more, so its check, if still in line, and its Event series go too (the cap on series is
        for jobs that live long, not a record of every job this process saw)."""
        checked = self._ensured.pop(job, None)
        if checked:
            self._line.discard(("ensure", checked))  # the check of a job that is gone: moot
        uids = {checked, self._posted.pop(job, None)} - {None}
        for key in [k for k in self._seen if k[0] == job[0] and k[1] in uids]:
            del self._seen[key]

    async def drain(self) -> None:
        """Wait until every Event posted so far is sent (or failed)."""
        await self._line.drain()

    async def close(self) -> None:
        """Send what waits, trying each request once more at most (the process is stopping)."""
        self._closing.set()
        await self._line.drain()

    async def _retrying(self, what: str, request: Callable[[], Awaitable[Any]]) -> Any:
        """``request()``, tried again while the API does not answer (unless stopping)."""
        tries = 0
        while True:
            try:
                return await request()
            except Exception as e:
                # Sent again after a 5xx too, writes included: a create names its Event (a
                # repeat that finds it made is a 409, taken as done) and a count update sets the
                # count, so neither is done twice.
                if self._closing.is_set() or not transient(e):
                    raise
                log.info(
                    "Event request unanswered; retrying", extra={"reason": what, "error": str(e)}
                )
            tries += 1
            delay = exponential(RETRY_FIRST_SECONDS, tries, RETRY_MAX_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), delay)  # or stop waiting: closing

    async def _load(self) -> None:
        """Read the MPIJob Events of this component the API has, as series to count up."""
        if self._loaded:
            return
        fields = f"source={keys.EVENT_COMPONENT},involvedObject.kind={keys.KIND}"
        namespaces: Sequence[str | None] = self._namespaces
        if not namespaces or any(c in n for n in self._namespaces for c in "*?["):
            namespaces = [None]
        try:
            found = []
            for ns in namespaces:
                found += await self._retrying(
                    "list", partial(self._kube.list, "v1", "Event", ns, fields=fields, urgent=False)
                )
        except Exception as e:
            log.warning(
                "Could not read the posted Events; lost ones will not be posted again",
                extra={"error": str(e)},
            )
            self._loaded = self._blind = True
            return
        # The latest first, each in front of what is kept: the series this process made stay
        # the most recent, and when the cap is reached what is left is older still.
        ignored = 0
        for item in _newest_first(found):
            if len(self._seen) >= MAX_TRACKED:
                break
            listed = _listed(item)
            if listed is None:
                ignored += 1
                continue
            key, series = listed
            if key not in self._seen:  # one this process made, or listed later, is the one
                self._seen[key] = series
                self._seen.move_to_end(key, last=False)
        if ignored:
            log.info(
                "Ignored listed Events that this component did not post: another namespace's "
                "object, not an MPIJob, or longer than any it posts",
                extra={"count": ignored},
            )
        self._loaded = True

    async def _ensure(self, obj: dict[str, Any], implied: list[events.Implied]) -> None:
        if self._blind:
            return
        now = self._clock.now()
        for item in implied:
            e = _bounded(item.event)
            key = _key(obj, e)
            if key in self._seen:
                continue
            if item.since is None or (now - item.since).total_seconds() > EVENT_TTL_SECONDS:
                continue
            meta = obj.get("metadata", {})
            ns = meta.get("namespace", "default")
            series = Series(
                f"{meta.get('name', 'mpijob')}.{uuid.uuid4().hex[:16]}", ns, subject=_about(obj)
            )
            self._track(key, series)
            body = self._event(obj, e, series, at=format_time(item.since))
            log.info(
                "Posting an Event a restart or an outage lost",
                extra={"reason": e.reason, **series.subject},
            )
            await self._create(series, body)

    async def _create(self, series: Series, body: dict[str, Any]) -> None:
        # The name is the series' own (a random suffix): a 409 is a try whose answer was lost.
        create = partial(self._kube.create, urgent=False)
        try:
            await self._retrying(body["reason"], partial(create_or_adopt, create, body, ours=None))
            series.sent = 1
        except Exception as e:
            series.failed = True
            self._log(body["reason"], e, series)

    async def _update(self, series: Series) -> None:
        if series.failed or series.sent >= series.count:
            return
        count = series.count
        patch = {"count": count, "lastTimestamp": self._now()}
        try:
            await self._retrying(
                "count update",
                partial(
                    self._kube.patch,
                    "v1",
                    "Event",
                    series.namespace,
                    series.name,
                    patch,
                    urgent=False,
                ),
            )
            series.sent = count
        except Exception as e:
            series.failed = True  # expired or never made: the next repeat starts a new Event
            self._log("count update", e, series)

    def _now(self) -> str:
        return format_time(self._clock.now())

    def _event(
        self, obj: dict[str, Any], event: Event, series: Series, *, at: str = ""
    ) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        now = at or self._now()
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
    def _log(what: str, error: Exception, series: Series) -> None:
        if transient(error, refusals=True):
            log.warning(
                "Failed to post event",
                extra={"reason": what, "error": str(error), **series.subject},
            )
        else:
            log.error(
                "Failed to post event", exc_info=error, extra={"reason": what, **series.subject}
            )

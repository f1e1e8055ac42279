"""A list and watch of one kind outside Kopf, filing each object into an index, as client-go's
informers do.

The operator's informers take the kinds with most events (pods, Services, ConfigMaps, launcher
Jobs; :data:`mpijob.handlers.watches.WATCHED`): in ``make bench`` nearly all of them.
Kopf gives every event the same path, whatever its handlers: a task per object with its own
queue and batching wait, a body wrapped in views, cause detection, handler matching with their
arguments built and their outcomes kept. That was 46 % of the operator's CPU samples there; an
informer decodes the event and calls one function. They take the kinds with an object per node
too (opted-in nodes, by a label selector, and DRA's ResourceSlices): on 1,024 nodes Kopf's
first pass over them took 1.4 s of CPU at every start; and DRA's ResourceClaims, one per worker,
each allocated and reserved in its own events. The kinds with few objects and few events stay
with Kopf.

An :class:`Informer` lists its kind in each namespace it watches (the whole cluster: one), then
watches from the list's version, with bookmarks, and lists again when the API server says that
version is gone (410). Each object's events go to ``handle(type, body)`` (``type`` None for a
listed object), which returns the keys the object is filed under, with a value for each: its
:class:`Filing`, one of Kopf's indices, which every reader reads. An object that a new list no
longer holds was deleted while no watch ran; ``handle`` gets a ``DELETED`` event for it, with
the metadata kept of it (name, namespace, uid, labels, owner references), so nothing waits for
an event that never comes. A list or watch that fails, or a watch that ends as soon as it
began, is tried again after :func:`~mpijob.platform.backoff.exponential` waits; ``on_listed``
is called once every namespace has been listed the first time. Informers only read: every
replica runs them, and none needs the Lease.

Completeness: an index is :attr:`~Filing.complete` once every namespace has been listed,
and no longer from the moment a list or watch fails (an API server restarted, a connection
cut) until a list of that namespace completes again: events sent while no watch ran may be
missing. A watch that broke is therefore followed by a list, not resumed from its version
(client-go's reflector lists again after a watch that ends in an error, too): a resumed watch
cannot tell when it has caught up, since a kind without changes sends nothing. Readers that
would destroy something on what an index lacks (a worker taken for gone) wait for it
(:mod:`mpijob.gang.gate`); a list costs the same as after the API server's restart, which
answers a watch from before it with 410 and a list anyway.

Namespaces: the whole cluster, named namespaces (one list and watch each), or with globs one
watch of the whole cluster whose objects outside the patterns are ignored (``admits``), as the
operator's ClusterRole allows.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from mpijob.objects import JSON
from mpijob.platform.backoff import exponential
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import Gone, Kube, selectors, transient

log = logging.getLogger(__name__)

#: How long the API server keeps one watch open (randomised up to twice as long, as client-go's
#: reflectors do, so that many replicas do not all watch again at once).
WATCH_SECONDS = 300
#: The waits after a failed list or watch: soon, then a second apart for as long as it takes,
#: as Kopf's watches are tuned to retry (:data:`mpijob.platform.kopf_tuning.API_RETRY_BACKOFFS`):
#: an API server back after a restart is watched again within a second.
RETRY_FIRST_SECONDS, RETRY_MOST_SECONDS = 0.2, 1.0
#: A failure is logged as a warning the first time, then every this many times in a row.
LOG_EVERY_FAILURES = 60

Key = str | tuple[str, ...]
Handle = Callable[[str | None, JSON], Mapping[Key, Any]]

#: What is kept of every object that is filed, for the ``DELETED`` event a list implies, unless
#: the informer is given its own ``kept`` (what says whose it is: a pod's job label, a child's
#: controller, cut to what its handler reads).
_KEPT_METADATA = ("name", "namespace", "uid")


def identity(metadata: JSON) -> JSON:
    """An object's name, namespace and uid: the least an index keeps of a filed object."""
    return {k: metadata[k] for k in _KEPT_METADATA if k in metadata}


def scope(
    patterns: Sequence[str], matcher: Callable[[Sequence[str]], Callable[[str], bool]]
) -> tuple[tuple[str | None, ...], Callable[[str], bool] | None]:
    """The namespaces to list and watch (None: the whole cluster) and, with globs, the filter
    of what the whole cluster's watch brings (``matcher(patterns)``)."""
    if not patterns:
        return (None,), None
    if all(p and not any(c in p for c in "*?!,") for p in patterns):
        return tuple(dict.fromkeys(patterns)), None
    return (None,), matcher(patterns)


class Filing(Protocol):
    """Where an informer files its objects: an index kept among Kopf's, so that every reader
    reads one cache (:class:`mpijob.platform.kopf_tuning.InformedIndexer`); the informer is its
    only writer."""

    complete: bool
    """Whether the index holds every object its informer's lists and watches could show: set
    once every namespace has been listed, cleared from a failed list or watch until that
    namespace is listed again (see the module)."""

    def replace(self, key: Any, obj: Any) -> None:
        """File the object ``key`` (its uid) under each key of ``obj`` (a mapping), with its
        value, and under no other."""

    def discard(self, key: Any) -> None:
        """Unfile the object ``key``."""


class Informer:
    """List and watch ``api_version``/``kind`` in ``namespaces`` (``(None,)``: the whole
    cluster) into ``index``, only the objects ``labels`` selects when it is not empty; see the
    module's docstring."""

    def __init__(
        self,
        kube: Kube,
        api_version: str,
        kind: str,
        *,
        index: Filing,
        handle: Handle,
        namespaces: Sequence[str | None] = (None,),
        admits: Callable[[str], bool] | None = None,
        on_listed: Callable[[], None] = lambda: None,
        labels: str = "",
        kept: Callable[[JSON], JSON] = identity,
        page: int = 500,
        clock: Clock = SYSTEM,
    ) -> None:
        self.kube, self.api_version, self.kind = kube, api_version, kind
        self.clock = clock
        """What tells a watch that ended at once from one that ran."""
        self.labels = labels
        self.index, self.handle = index, handle
        self.namespaces = tuple(namespaces)
        self.admits = admits
        self.on_listed = on_listed
        self.kept = kept
        self.page = page
        self._filed: dict[str, JSON] = {}
        """uid -> what is kept of each object filed under some key (``kept``), for the
        ``DELETED`` event a list implies when it no longer holds the object."""
        self._unlisted = set(self.namespaces)
        self._gaps = set(self.namespaces)
        """Namespaces whose index may lack events: not listed yet, or not since their list or
        watch last failed."""

    async def run(self) -> None:
        """Until cancelled: one list-and-watch loop per namespace."""
        await asyncio.gather(*(self._reflect(namespace) for namespace in self.namespaces))

    def apply(self, type: str | None, body: JSON) -> None:
        """One event (``type`` None: listed) into the index, through ``handle``."""
        metadata = body.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        namespace = str(metadata.get("namespace") or "")
        if not uid or (self.admits is not None and not self.admits(namespace)):
            return
        try:
            if type == "DELETED":
                self._unfile_one(uid)
                self.handle(type, body)
            else:
                entries = self.handle(type, body)
                if entries:
                    self.index.replace(uid, entries)
                    self._filed[uid] = self.kept(metadata)
                else:  # most objects (anyone's pods) are filed under nothing: nothing kept
                    self._unfile_one(uid)
        except Exception:  # one object's failure must not stop the watch of all the others
            log.exception(
                "Handling %s %s/%s failed",
                self.kind,
                metadata.get("namespace"),
                metadata.get("name"),
            )

    def _unfile_one(self, uid: str) -> None:
        if self._filed.pop(uid, None) is not None:
            self.index.discard(uid)

    def _uids(self, namespace: str | None) -> set[str]:
        """The filed objects of ``namespace`` (None: all)."""
        return {
            uid
            for uid, meta in self._filed.items()
            if namespace is None or meta.get("namespace") == namespace
        }

    def relisted(self, namespace: str | None, items: Sequence[JSON]) -> None:
        """A whole list of ``namespace``: every item filed again, and whatever was filed but is
        no longer there deleted."""
        gone = self._uids(namespace)
        self._filed_again(items, gone)
        self._unfile(gone)

    def _filed_again(self, items: Sequence[JSON], gone: set[str]) -> None:
        for item in items:
            gone.discard(str((item.get("metadata") or {}).get("uid") or ""))
            self.apply(None, item)

    def _unfile(self, gone: set[str]) -> None:
        for uid in gone:
            if (metadata := self._filed.get(uid)) is not None:
                deleted = {"apiVersion": self.api_version, "kind": self.kind, "metadata": metadata}
                self.apply("DELETED", deleted)  # unfiles it, then tells its handler

    async def _list(self, namespace: str | None) -> str:
        """List ``namespace`` a page at a time, each page filed as it comes: only one page of
        whole objects is held at once, never the whole list (a tenant's objects can carry a MiB
        each; the index keeps what its handler returns). Until the last page the index holds
        the objects of the previous list that no page has shown yet, so no reader sees fewer
        objects than there are; then those that are gone are unfiled."""
        gone = self._uids(namespace)
        listed = 0
        cont = ""
        while True:
            page = await self.kube.list_page(
                self.api_version,
                self.kind,
                namespace,
                selectors(self.labels),
                cont,
                limit=self.page,
            )
            items = page.get("items") or []
            for item in items:
                # A list's items name no kind (their list does); a watch event's object does.
                item.setdefault("apiVersion", self.api_version)
                item.setdefault("kind", self.kind)
            self._filed_again(items, gone)
            listed += len(items)
            meta = page.get("metadata") or {}
            del page, items
            if not (cont := str(meta.get("continue") or "")):
                self._unfile(gone)
                version = str(meta.get("resourceVersion") or "")
                log.debug(
                    "Listed %d %ss in %s at version %s",
                    listed,
                    self.kind,
                    namespace or "the cluster",
                    version,
                )
                return version

    async def _reflect(self, namespace: str | None) -> None:
        where = f"{self.kind}s in {namespace}" if namespace else f"{self.kind}s"
        version = ""
        failures = 0
        relisted = False  # said, once in a run of failures, that a list came through again
        while True:
            try:
                if not version:
                    version = await self._list(namespace)
                    self._gaps.discard(namespace)
                    self.index.complete = not self._gaps
                    if failures and not relisted:
                        relisted = True
                        log.info("Listed %s again after %d failure(s) in a row", where, failures)
                    if namespace in self._unlisted:
                        self._unlisted.discard(namespace)
                        if not self._unlisted:
                            self.on_listed()
                seconds = WATCH_SECONDS + random.randrange(WATCH_SECONDS)
                started, events = self.clock.monotonic(), 0
                async for event in self.kube.watch(
                    self.api_version,
                    self.kind,
                    namespace,
                    version=version,
                    timeout_seconds=seconds,
                    labels=self.labels,
                ):
                    body = event.get("object") or {}
                    version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self.apply(event.get("type"), body)
                    events += 1
                    failures, relisted = self._recovered(where, failures), False
                if not events and self.clock.monotonic() - started < RETRY_MOST_SECONDS:
                    # Ended at once with nothing: not a watch, a server closing it (going away).
                    raise ConnectionResetError("the watch ended as soon as it began")
                # A watch that ran its course: the failures in a row, if any, are over (not at
                # the list before it, which succeeds while watches keep failing).
                failures, relisted = self._recovered(where, failures), False
            except Gone:
                log.info("Watching %s: version %s is gone; listing again", where, version)
                version = ""
                self._gap(namespace)
            except Exception as e:  # the index must not go stale: every failure tries again
                # Events may have been missed from here on: listed again, not resumed.
                version = ""
                self._gap(namespace)
                failures += 1
                wait = exponential(RETRY_FIRST_SECONDS, failures, RETRY_MOST_SECONDS)
                expected = transient(e, refusals=True)  # else a bug: its traceback
                # The first failure and then one a minute: an outage is one line a minute a
                # kind, not one a second.
                level = logging.WARNING if failures % LOG_EVERY_FAILURES == 1 else logging.DEBUG
                log.log(
                    level,
                    "Watching %s failed %d time(s) in a row (%s: %s); trying again in %.1f s",
                    where,
                    failures,
                    type(e).__name__,
                    e,
                    wait,
                    exc_info=not expected,
                )
                await asyncio.sleep(wait)

    def _gap(self, namespace: str | None) -> None:
        """``namespace`` may lack events until it is listed again: the index is not complete."""
        self._gaps.add(namespace)
        self.index.complete = False

    @staticmethod
    def _recovered(where: str, failures: int) -> int:
        """No failures in a row from now on; said once when there were."""
        if failures:
            log.info("Watching %s again after %d failure(s) in a row", where, failures)
        return 0

"""Every tuning of Kopf, in one place: its settings, and the patches of its private classes.

Kopf's settings (:func:`configure`): its peering is off (a Lease elects the leader instead,
:mod:`mpijob.platform.leader`), Event posting is off (the operator posts its own, with
upstream's source component), its finalizer and storage keys use our prefix so that if anything
is ever stored it is ours, no diff-base is kept, node watches are filtered server-side to
opted-in nodes, and no handler runs in Kopf's threads (:class:`NoThreads`).

Six changes reach into Kopf's private modules, which no setting covers: watch lines decoded by
orjson (:func:`decode_watch_events_with_orjson`), event bodies without reference cycles
(:func:`views_without_cycles`), index filling that wakes the objects waiting for it once rather
than at every object indexed (:func:`toggle_sets_wake_on_change`), a list after a broken watch that
deletes what it no longer finds (:func:`relists_delete_what_is_gone`), handler arguments built once
per event rather than at every use (:func:`causes_build_their_arguments_once`), and index stores
that replace a value without first comparing it with the one they hold
(:func:`index_stores_replace_without_comparing`). Two more read Kopf's internals: its namespace
patterns, for the informers (:func:`namespace_matcher`), and its indexers, made before Kopf starts,
among which the informers' indices are kept, so that every reader reads one cache, Kopf's
(:func:`indexers_for`, :class:`InformedIndexer`, ``kopf._core``). This is the only module that
imports any of Kopf's private packages (``kopf._cogs``, ``kopf._core``, ``kopf._kits``: an import
contract says so), and ``pyproject.toml`` pins Kopf to the minor version these were written
against; each change checks that what it replaces is there, and leaves Kopf as it is, with a
warning, where it is not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import kopf
from kopf._cogs.structs import ids
from kopf._core.engines import indexing

from mpijob import keys
from mpijob.platform import logs
from mpijob.platform.kube import decode
from mpijob.settings import OperatorSettings

log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff-base: the operator registers no on.create/update/resume handlers, the only ones a
    diff is for. Kopf still builds an essence of every event's body (a deep copy of the whole
    object) before it knows whether any handler needs it; this storage makes that essence empty
    and never stores one."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


class NoThreads(concurrent.futures.Executor):
    """Kopf's executor for handlers that are plain functions: it refuses them. Kopf runs such a
    handler in a thread while the event loop goes on changing what the handler reads (the
    share ledger, the caches, the queues); every handler of the operator is a coroutine, run on
    the loop between two of its steps. A plain one added by mistake fails at its first call,
    loudly in the log, rather than racing the loop unseen."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> NoReturn:
        handler = fn
        while isinstance(handler, functools.partial):  # Kopf's: the context's run, the kwargs
            handler = next((a for a in handler.args if callable(a)), handler.func)
        name = getattr(handler, "__qualname__", type(handler).__name__)
        raise TypeError(f"Kopf handlers must be coroutine functions, never run in a thread: {name}")


#: Kopf's waits between tries of a request the API server did not answer (its watches' included).
#: Kopf's own (1, 1, 2, 3, 5, 8, 13, 21 s) left a watch 13 s behind an API server that was back
#: after a 20 s restart, and gave the watch up for good after 54 s: a job created after the
#: restart was seen 11-12 s late, or not until Kopf started that watch again a minute later.
#: Here: soon, then once a second for an hour (client-go's reflectors retry within a second or
#: two as well).
API_RETRY_BACKOFFS: tuple[float, ...] = (0.2, 0.5) + (1.0,) * 3600


def configure(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    settings.posting.enabled = False
    settings.peering.standalone = True
    settings.persistence.finalizer = keys.PREFIX + "finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="mpijob.io")
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = API_RETRY_BACKOFFS
    settings.watching.chunk_size = 500
    # Kopf's worker for an object keeps that object's last event body until it exits, 5 s
    # idle by default: under a burst of events that held every recent object whole (peak RSS
    # 102 -> 91 MiB in make bench with 0.5 s, when Kopf still watched the pods). An object's
    # next event after that costs a new task.
    settings.queueing.idle_timeout = 0.5
    # Nodes: only those opted into topology placement.
    settings.watching.label_selectors["v1", "nodes"] = (
        f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_TOPOLOGY}"
    )
    settings.execution.executor = NoThreads()
    if ours.fractional_gpus:
        # Shares go to core_mem nodes; the topology handlers still filter on their own label.
        settings.watching.label_selectors["v1", "nodes"] = (
            f"{keys.NODE_GPU_SCHEDULE_LABEL} in"
            f" ({keys.NODE_GPU_SCHEDULE_TOPOLOGY},{keys.NODE_GPU_SCHEDULE_CORE_MEM})"
        )


def decode_watch_events_with_orjson() -> None:
    """Kopf decodes every line of its watch streams with the standard library's ``json``
    (about a tenth of the operator's CPU under load); orjson gives the same objects in a
    fraction of the time. Kopf has no setting for it, so the name its streaming module decodes
    with is pointed at :func:`~mpijob.platform.kube.decode`; a Kopf without that name keeps its
    own decoding."""
    from kopf._cogs.clients import api

    if getattr(api, "json", None) is json:
        decoding = types.ModuleType(json.__name__, json.__doc__)
        vars(decoding).update({**vars(json), "loads": decode})
        api.json = decoding  # type: ignore[attr-defined]
    else:
        log.warning("Kopf's watch decoding was not found; watch events decode with json")


def views_without_cycles() -> None:
    """Kopf wraps every event's body in a ``Body`` and gives each handler call a ``Patch``;
    both keep their ``metadata``/``spec``/``status`` views as attributes, and the metadata view
    its ``labels``/``annotations`` views, while each view points back at its parent. So every
    event's whole object stayed until the garbage collector found the cycle. Built on each
    access instead (a view is a path over the same dict: reads and writes go where they went),
    the views leave no cycle and an event's body is freed as soon as Kopf drops it. A Kopf
    whose classes differ keeps its own."""
    from kopf._cogs.structs import bodies, dicts, patches

    views: dict[type, dict[str, type]] = {
        bodies.Body: {"metadata": bodies.Meta, "meta": bodies.Meta, "spec": bodies.Spec,
                      "status": bodies.Status},
        patches.Patch: {"metadata": patches.MetaPatch, "meta": patches.MetaPatch,
                        "spec": patches.SpecPatch, "status": patches.StatusPatch},
        bodies.Meta: {"labels": dicts.MappingView, "annotations": dicts.MappingView},
        patches.MetaPatch: {"labels": dicts.MutableMappingView,
                            "annotations": dicts.MutableMappingView},
    }  # fmt: skip
    cached = {"_meta", "_spec", "_status"}
    if not all(
        isinstance(vars(cls).get(name), property) for cls, named in views.items() for name in named
    ):
        log.warning("Kopf's body and patch views were not found; they keep their cycles")
        return

    def without_cached_views(init: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            for name in cached & vars(self).keys():
                delattr(self, name)  # the view goes, and with it the cycle

        return __init__

    # A body and a metadata view are only their path over the object now: nothing is built
    # first to be dropped (the properties below build the views when asked).
    bodies.Body.__init__ = _path_view(dicts.ReplaceableMappingView)  # type: ignore[method-assign,assignment]
    bodies.Meta.__init__ = _path_view(dicts.MappingView, "metadata")  # type: ignore[method-assign,assignment]
    patches.MetaPatch.__init__ = _path_view(dicts.MutableMappingView, "metadata")  # type: ignore[method-assign,assignment]
    patches.Patch.__init__ = without_cached_views(patches.Patch.__init__)  # type: ignore[method-assign]
    for cls, named in views.items():
        for name, view in named.items():
            setattr(cls, name, _view_property(view, name))


def _path_view(base: Any, *path: str) -> Callable[[Any, Any], None]:
    def __init__(self: Any, src: Any) -> None:
        base.__init__(self, src, *path)

    return __init__


def _view_property(view: type, name: str) -> property:
    """A parent's view built on access: metadata's labels and annotations are plain views by
    path, the others know their path."""
    if name in ("labels", "annotations"):
        return property(lambda self: view(self, name))
    return property(view)


def configure_logging(*, verbose: bool, json_lines: bool) -> None:
    """Kopf's lines and the operator's in one format (:mod:`mpijob.platform.logs`); without
    ``verbose``, none of Kopf's per-object success lines."""
    logs.configure(verbose=verbose, json_lines=json_lines)


class _SetCondition(asyncio.Condition):
    """A Kopf ``ToggleSet``'s condition that wakes its waiters only when the set's state is not
    the one they saw (see :func:`toggle_sets_wake_on_change`)."""

    def __init__(self, toggles: Any) -> None:
        super().__init__()
        self.toggles = toggles
        self.seen: set[bool | None] = set()
        """The set's state each task waiting now saw when it last looked; None: a task waiting
        on one of its toggles (woken at every change, as before)."""

    def notify_all(self) -> None:
        if self.seen - {self.toggles.is_on()}:
            self.seen.clear()  # every waiter looks again, and says what it saw
            super().notify_all()


def toggle_sets_wake_on_change() -> None:
    """Kopf holds every object's first event until all indices are filled: each object's task
    waits on one condition shared by a ``ToggleSet`` of one toggle per object still to index,
    and every object indexed wakes all of those tasks, each then looking at every toggle left.
    With N objects that is about N^2 wake-ups: with 10,000 MPIJobs, ten minutes after a start
    no job's status said it waited yet, the process busy in those wake-ups (make
    bench-queue-cluster, profiled). Here a set's waiters are woken only when the set's state is
    not the one they saw, which during the filling happens once, at its end. A Kopf whose
    toggles differ keeps its own."""
    from kopf._cogs.aiokits import aiotoggles

    toggle_set, toggle = aiotoggles.ToggleSet, aiotoggles.Toggle
    if getattr(toggle_set, "_wakes_on_change", False):
        return
    if not all(
        callable(getattr(cls, name, None))
        for cls, name in ((toggle_set, "wait_for"), (toggle_set, "is_on"), (toggle, "wait_for"))
    ):
        log.warning("Kopf's toggle sets were not found; their waiters wake at every change")
        return
    init, wait_on_toggle = toggle_set.__init__, toggle.wait_for

    def __init__(self: Any, fn: Any) -> None:
        init(self, fn)
        if not isinstance(getattr(self, "_condition", None), asyncio.Condition):
            raise TypeError("Kopf's ToggleSet has no condition")
        self._condition = _SetCondition(self)  # no toggle shares the old one yet

    async def wait_for_set(self: Any, state: bool) -> None:
        condition: _SetCondition = self._condition

        def reached() -> bool:
            on = bool(self.is_on())
            if on != bool(state):
                condition.seen.add(on)
            return on == bool(state)

        async with condition:
            await condition.wait_for(reached)

    async def wait_for_toggle(self: Any, state: bool) -> None:
        condition = self._condition
        if not isinstance(condition, _SetCondition):
            await wait_on_toggle(self, state)
            return

        def reached() -> bool:
            if self.is_on() != bool(state):
                condition.seen.add(None)
            return bool(self.is_on() == bool(state))

        async with condition:
            await condition.wait_for(reached)

    toggle_set.__init__ = __init__  # type: ignore[method-assign]
    toggle_set.wait_for = wait_for_set  # type: ignore[method-assign]
    toggle.wait_for = wait_for_toggle  # type: ignore[method-assign]
    toggle_set._wakes_on_change = True  # type: ignore[attr-defined]


#: What is kept of each object a Kopf watch streamed, to say it is gone after a list that no
#: longer holds it: who it is and whose, and what the filters and handlers of a deletion read
#: (the operator's labels and its own annotations, a closed set; the controller reference; the
#: node it was bound to), each bounded, whatever a tenant put on its object.
_GONE_LABELS = frozenset(
    {
        keys.LABEL_OPERATOR_NAME,
        keys.LABEL_JOB_NAME,
        keys.LABEL_JOB_ROLE,
        keys.LABEL_APP,
        keys.NODE_GPU_SCHEDULE_LABEL,
    }
)
_GONE_ANNOTATIONS, _GONE_VALUE_MAX = keys.own_annotations(), keys.MAX_OWN_VALUE
_OWNER_FIELDS = ("apiVersion", "kind", "name", "uid", "controller")


def _kept(values: Any, names: frozenset[str]) -> dict[str, str]:
    return {
        k: v
        for k, v in (values or {}).items()
        if k in names and isinstance(v, str) and len(v) <= _GONE_VALUE_MAX
    }


def _identity(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    kept: dict[str, Any] = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    if labels := _kept(meta.get("labels"), _GONE_LABELS):
        kept["labels"] = labels
    if annotations := _kept(meta.get("annotations"), _GONE_ANNOTATIONS):
        kept["annotations"] = annotations
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")][:1]
    if owners:
        kept["ownerReferences"] = [{k: owners[0].get(k) for k in _OWNER_FIELDS}]
    out = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}
    if node := (obj.get("spec") or {}).get("nodeName"):
        out["spec"] = {"nodeName": str(node)[:_GONE_VALUE_MAX]}
    return out


def relists_delete_what_is_gone() -> None:
    """Kopf lists a kind again when its watch broke (the API server restarted, the version it
    watched from is gone), but keeps, in its indices and in what its handlers were told, every
    object that list no longer holds: one deleted while no watch ran stays for good, and its
    deletion handlers never run. As an informer does
    (:mod:`mpijob.platform.informer`), each of Kopf's streams now ends a list after the first
    with a ``DELETED`` event for every object it streamed before and the list lacks, made from
    what was kept of it (:func:`_identity`), before the list's end is announced. What is
    kept per object is its identity alone, whatever the object holds."""
    from kopf._cogs.clients import watching

    original = watching.infinite_watch
    listed_mark = getattr(getattr(watching, "Bookmark", None), "LISTED", None)
    if listed_mark is None or getattr(original, "deletes_what_is_gone", False):
        if listed_mark is None:
            log.warning("Kopf's watch stream was not found; its relists keep deleted objects")
        return

    async def infinite_watch(**kwargs: Any) -> Any:
        known: dict[str, dict[str, Any]] = {}
        listing: set[str] | None = None  # the uids of the list in progress, after the first
        async for item in original(**kwargs):
            if item is listed_mark:
                for gone in [u for u in known if listing is not None and u not in listing]:
                    yield {"type": "DELETED", "object": known.pop(gone)}
                listing = set()  # the next list, if the watch breaks, is compared
            elif isinstance(item, Mapping):
                obj = item.get("object") or {}
                uid = (obj.get("metadata") or {}).get("uid")
                kind = item.get("type")
                if uid and kind == "DELETED":
                    known.pop(uid, None)
                elif uid and kind in (None, "ADDED", "MODIFIED"):
                    known[uid] = _identity(obj)
                    if kind is None and listing is not None:
                        listing.add(uid)
            yield item

    infinite_watch.deletes_what_is_gone = True  # type: ignore[attr-defined]
    watching.infinite_watch = infinite_watch


def causes_build_their_arguments_once() -> None:
    """Kopf builds a cause's keyword arguments (the body's views, every index) each time it
    asks for them: once to plan the handlers, once per ``when`` filter, once per call. A
    cause lives for one event and its arguments do not change meanwhile, so each cause now
    builds them once (the resource's part, shared by the plain and the async ones, too), and
    the metadata view once rather than once per field it gives. Every caller copies what it is
    given (``dict(...)``, ``**``, ``|=``, a subclass's ``dict(super()._kwargs)``): the one dict
    is never changed. In a ``make bench`` profile these builds were a third of Kopf's CPU per MPIJob
    event (docs/scale.md)."""
    from kopf._core.actions import invocation
    from kopf._core.intents import causes

    names = ("kwargs", "sync_kwargs", "async_kwargs")
    built = {name: vars(invocation.Kwargable).get(name) for name in names}
    resource_kwargs = vars(causes.ResourceCause).get("_kwargs")
    if not all(isinstance(p, property) for p in (*built.values(), resource_kwargs)):
        log.warning("Kopf's cause arguments were not found; they are built at every use")
        return

    def once(name: str, build: Callable[[Any], dict[str, Any]]) -> property:
        slot = "_mpijob_" + name

        def get(self: Any) -> dict[str, Any]:
            kept: dict[str, Any] | None = self.__dict__.get(slot)
            if kept is None:
                kept = self.__dict__[slot] = build(self)
            return kept

        return property(get)

    for name, prop in built.items():
        assert isinstance(prop, property)
        assert prop.fget is not None
        setattr(invocation.Kwargable, name, once(name, prop.fget))

    def resource_cause_kwargs(self: Any) -> dict[str, Any]:
        # Kopf's own arguments, unchanged (``status`` among them: Kopf gives every handler the
        # body's status view; no handler of the operator takes it, and what a job's status says
        # decides nothing of GPUs or of whether a job runs, docs/trust.md).
        meta = self.body.metadata  # a view built on access (views_without_cycles): once here
        return dict(
            super(causes.ResourceCause, self)._kwargs,
            spec=self.body.spec,
            meta=meta,
            status=self.body.status,
            uid=meta.uid,
            name=meta.name,
            namespace=meta.namespace,
            labels=meta.labels,
            annotations=meta.annotations,
        )

    causes.ResourceCause._kwargs = once("_kwargs", resource_cause_kwargs)  # type: ignore[method-assign,assignment]


def index_stores_replace_without_comparing() -> None:
    """Kopf's index store compares an object's new value with the one it holds before it
    replaces it, to spare a dict update. The values are the caches' summaries (a pod's, a job's
    whole spec and status): the comparison walks both, at every event of every indexed object,
    where the update it spares costs one assignment. It assigns now."""
    store = indexing.Store
    if not callable(vars(store).get("_replace")):
        log.warning("Kopf's index store was not found; it compares before it replaces")
        return
    items = f"_{store.__name__}__items"  # the store's private dict, by Python's name mangling

    def _replace(self: Any, acckey: Any, obj: Any) -> None:
        getattr(self, items)[acckey] = obj

    store._replace = _replace  # type: ignore[method-assign]


def patch_kopf() -> None:
    """Every change to Kopf's private classes; once per process, before Kopf starts."""
    decode_watch_events_with_orjson()
    views_without_cycles()
    toggle_sets_wake_on_change()
    relists_delete_what_is_gone()
    causes_build_their_arguments_once()
    index_stores_replace_without_comparing()


def namespace_matcher(patterns: Sequence[str]) -> Callable[[str], bool]:
    """Whether a namespace is one of ``patterns`` (``--namespace``), exactly as Kopf matches
    them (globs, ``!`` exclusions, comma-separated parts), for the watches that are not
    Kopf's (:mod:`mpijob.platform.informer`)."""
    from kopf._cogs.structs import references

    def matches(namespace: str) -> bool:
        name = references.NamespaceName(namespace)
        return any(references.match_namespace(name, p) for p in patterns)

    return matches


class InformedIndex(indexing.Index):  # type: ignore[type-arg]
    """An index of Kopf's own kind that an informer fills: it also says whether it may lack
    events (:mod:`mpijob.platform.informer`); Kopf's own indices say nothing of it."""

    complete: bool = False


class InformedIndexer(indexing.OperatorIndexer):
    """The writer of an :class:`InformedIndex`, kept among Kopf's indexers, so that Kopf's one
    mapping of indices holds every index, its own and the informers' alike. Kopf's events never
    reach it: Kopf discards each of its objects from every indexer by a (namespace, name, uid)
    key, and an informer files by uid alone."""

    index: InformedIndex

    def __init__(self) -> None:
        super().__init__()
        self.index = InformedIndex()

    @property
    def complete(self) -> bool:
        return self.index.complete

    @complete.setter
    def complete(self, value: bool) -> None:
        self.index.complete = value


def indexers_for(
    registry: kopf.OperatorRegistry, informed: Iterable[str] = ()
) -> tuple[Any, Mapping[str, Any], dict[str, InformedIndexer]]:
    """Kopf's indexers for ``registry``'s index handlers, made before Kopf starts (it takes them
    as ``kopf.operator(indexers=...)``), with an :class:`InformedIndexer` for each index the
    informers fill (``informed``); the one mapping of every index by name, live and empty until
    the watches fill it, so whatever reads the indices is built complete with it; and the
    informers' indexers by name. Kopf makes its own indexers anew when it starts and leaves the
    informers' as they are."""
    indexers = indexing.OperatorIndexers()
    indexers.ensure(registry._indexing.get_all_handlers())
    filled = {}
    for index in informed:
        name = str(index)  # Kopf formats ids with repr at every call: plain strings, no enums
        assert name not in indexers, f"{name} is filled by Kopf and by an informer"
        filled[name] = indexers[ids.HandlerId(name)] = InformedIndexer()
    return indexers, indexers.indices, filled

"""The pod informer against a scripted API server: list pages, a watch stream cut anywhere,
bookmarks, a version gone (410) and a list that no longer holds what was filed; and its index."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
import orjson
import pytest
from aiohttp import web

from mpijob.objects import JSON
from mpijob.platform import informer, kopf_tuning
from mpijob.platform.informer import Informer
from mpijob.platform.kopf_tuning import InformedIndexer
from mpijob.platform.kube import Kube
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


def pod(name: str, version: str, namespace: str = "ns", **labels: str) -> JSON:
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels}
    return {"metadata": {**meta, "resourceVersion": version}, "spec": {"nodeName": "n1"}}


def by_name(body: JSON) -> Mapping[tuple[str, ...], Any]:
    """The handler under test files each pod under its name, with its version."""
    return {("by-name", body["metadata"]["name"]): body["metadata"]["resourceVersion"]}


@dataclass
class Server:
    """Lists answer ``lists`` in turn (each a list of pages); watches stream ``watches`` in
    turn (each a list of raw chunks), then hold the last stream open."""

    lists: list[list[JSON]] = field(default_factory=list)
    watches: list[list[bytes]] = field(default_factory=list)
    queries: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append(dict(request.query))
        if request.query.get("watch") != "1":
            pages = self.lists.pop(0) if len(self.lists) > 1 else self.lists[0]
            page = int(request.query.get("continue") or 0)
            if page + 1 < len(pages):
                self.lists.insert(0, pages)  # the same list's next page comes next
            return web.Response(body=orjson.dumps(pages[page]))
        response = web.StreamResponse()
        await response.prepare(request)
        chunks = self.watches.pop(0) if self.watches else []
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0)
        if not self.watches and not chunks:
            await asyncio.sleep(3600)  # nothing more: an open, quiet watch
        return response


def page(items: list[JSON], version: str, more: str = "") -> JSON:
    return {"items": items, "metadata": {"resourceVersion": version, "continue": more}}


def line(type: str, obj: JSON) -> bytes:
    return orjson.dumps({"type": type, "object": obj}) + b"\n"


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, Kube]]:
    script = Server()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", script.handle)
    # A watch dropped ends its handler; the quiet one is not waited for at the end.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = Kube(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"))
    yield script, client
    await client.aclose()
    await runner.cleanup()


async def test_list_then_watch_then_a_gone_version_lists_again_and_deletes_what_vanished(
    server: tuple[Server, Kube],
) -> None:
    script, kube = server
    events: list[tuple[str | None, str]] = []
    listed: list[bool] = []
    relisted = asyncio.Event()

    def handle(type: str | None, body: JSON) -> Mapping[tuple[str, ...], Any]:
        events.append((type, body["metadata"]["name"]))
        if len(events) == 7:
            relisted.set()  # the last event the script leads to
        return {} if type == "DELETED" else by_name(body)

    script.lists = [
        [page([pod("a", "1")], "5", more="1"), page([pod("b", "2")], "5")],  # two pages
        [page([pod("a", "9")], "10")],  # after the 410: b was deleted while no watch ran
    ]
    modified = line("MODIFIED", pod("a", "6"))
    script.watches = [
        [
            modified[:7],  # a line cut anywhere
            modified[7:] + line("BOOKMARK", {"metadata": {"resourceVersion": "7"}}),
            line("ADDED", pod("c", "8")),
        ],
        [line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})],
        [],
    ]
    index = InformedIndexer()
    pods = Informer(
        kube, "v1", "Pod", index=index, handle=handle, on_listed=lambda: listed.append(True)
    )
    task = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(relisted.wait(), timeout=5)
    finally:
        task.cancel()
    assert events[:5] == [
        (None, "a"),
        (None, "b"),
        ("MODIFIED", "a"),
        ("ADDED", "c"),
        (None, "a"),  # listed again after the 410
    ]
    assert sorted(events[5:]) == [("DELETED", "b"), ("DELETED", "c")]  # filed, not listed
    assert listed == [True]  # once, at the first list
    assert dict(index.index) == {("by-name", "a"): index.index[("by-name", "a")]}
    assert list(index.index[("by-name", "a")]) == ["9"]
    watches = [q for q in script.queries if q.get("watch") == "1"]
    assert [q["resourceVersion"] for q in watches[:2]] == ["5", "8"]  # from the list, resumed
    assert all(q["allowWatchBookmarks"] == "true" for q in watches)


async def test_the_index_is_complete_once_listed_and_after_a_failed_watch_only_once_listed_again(
    server: tuple[Server, Kube],
) -> None:
    """A watch that fails may have missed events: the index says so (not complete) from then
    until a list of its namespace has come through, and the informer lists rather than resume
    the broken watch from its version."""
    script, kube = server
    index = InformedIndexer()
    seen: list[tuple[str | None, str, bool]] = []
    done = asyncio.Event()

    def handle(type: str | None, body: JSON) -> Mapping[tuple[str, ...], Any]:
        seen.append((type, body["metadata"]["name"], index.complete))
        if len(seen) == 4:
            done.set()
        return by_name(body)

    script.lists = [[page([pod("a", "1")], "5")], [page([pod("a", "7")], "9")]]
    script.watches = [
        [
            line("MODIFIED", pod("a", "6")),
            line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"}),
        ],
        [line("ADDED", pod("b", "10"))],
    ]
    pods = Informer(kube, "v1", "Pod", index=index, handle=handle)
    assert not index.complete  # nothing listed yet
    task = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        task.cancel()
    assert seen == [
        (None, "a", False),  # the first list, under way
        ("MODIFIED", "a", True),  # watched after it
        (None, "a", False),  # listed again after the failed watch, which may have missed some
        ("ADDED", "b", True),
    ]
    asked = [(q.get("watch"), q.get("resourceVersion")) for q in script.queries]
    assert asked[:4] == [(None, None), ("1", "5"), (None, None), ("1", "9")]


def test_an_update_refiles_an_object_and_a_deletion_unfiles_it_in_kopfs_own_index() -> None:
    """The informer files into an index of Kopf's own kind, kept among Kopf's indexers: one
    cache. Kopf's discards of its own objects (keyed by namespace, name and uid) leave the
    informer's objects (keyed by uid) alone."""
    registry = kopf.OperatorRegistry()
    indexers, indices, filings = kopf_tuning.indexers_for(registry, ["pods"])
    filed = {"u1": {("job", "x"): 1, ("node", "n1"): 1}, "u2": {("job", "x"): 2}}
    pods = Informer(
        None,  # type: ignore[arg-type]
        "v1",
        "Pod",
        index=filings["pods"],
        handle=lambda type, body: {} if type == "DELETED" else filed[body["metadata"]["uid"]],
    )
    for uid, name in (("u1", "a"), ("u2", "b")):
        pods.apply("ADDED", {"metadata": {"name": name, "namespace": "ns", "uid": uid}})
    index = indices["pods"]
    assert index is filings["pods"].index
    assert sorted(index[("job", "x")]) == [1, 2]
    filed["u1"] = {("node", "n2"): 3}  # moved
    pods.apply("MODIFIED", {"metadata": {"name": "a", "namespace": "ns", "uid": "u1"}})
    assert sorted(index) == [("job", "x"), ("node", "n2")]
    assert list(index[("job", "x")]) == [2]
    for indexer in indexers.values():  # as Kopf does for each object of its own kinds
        indexer.discard(("ns", "b", "u2"))
    assert list(index[("job", "x")]) == [2]
    pods.apply("DELETED", {"metadata": {"name": "b", "namespace": "ns", "uid": "u2"}})
    assert sorted(index) == [("node", "n2")]
    pods.relisted("ns", [])  # a list without u1: it goes, with a DELETED event
    assert dict(index) == {}


def test_objects_outside_the_patterns_are_ignored_and_a_failing_handler_stops_nothing() -> None:
    seen: list[str] = []

    def handle(type: str | None, body: JSON) -> Mapping[tuple[str, ...], Any]:
        name = body["metadata"]["name"]
        seen.append(name)
        if name == "bad":
            raise KeyError("spec")
        return by_name(body)

    pods = Informer(
        None,  # type: ignore[arg-type]
        "v1",
        "Pod",
        index=InformedIndexer(),
        handle=handle,
        admits=lambda namespace: namespace.startswith("team-"),
    )
    for body in (pod("a", "1", "team-a"), pod("x", "1", "other"), pod("bad", "1", "team-a")):
        pods.apply("ADDED", body)
    pods.apply("ADDED", pod("b", "2", "team-b"))
    assert seen == ["a", "bad", "b"]
    assert sorted(pods.index.index) == [("by-name", "a"), ("by-name", "b")]


def test_the_scope_watches_named_namespaces_each_and_globs_through_the_whole_cluster() -> None:
    def matcher(patterns: Any) -> Any:
        return lambda namespace: namespace in ("team-a",)

    assert informer.scope((), matcher) == ((None,), None)
    assert informer.scope(("a", "b", "a"), matcher) == (("a", "b"), None)
    namespaces, admits = informer.scope(("a", "team-*"), matcher)
    assert namespaces == (None,)
    assert admits is not None
    assert admits("team-a")
    assert not admits("b")


class Refusing:
    """An API server that lists, then ends every watch at once with nothing (one going away),
    or refuses it: what the informer must wait between, and say once, not once a try."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.watches: list[float] = []

    async def list_page(self, *_: Any, **__: Any) -> JSON:
        return page([], "1")

    async def watch(self, *_: Any, **__: Any) -> AsyncIterator[JSON]:
        self.watches.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0)
        if self.refuse:
            raise ConnectionRefusedError("connection refused")
        if len(self.watches) > 1000:
            raise AssertionError("a watch again at once, without a wait")
        for _ in ():
            yield {}


@pytest.mark.parametrize("refuse", [False, True])
@virtual_time
async def test_a_watch_that_ends_at_once_or_fails_is_tried_again_a_second_apart_and_said_once(
    refuse: bool, caplog: pytest.LogCaptureFixture
) -> None:
    kube: Any = Refusing(refuse)
    pods = Informer(kube, "v1", "Pod", index=InformedIndexer(), handle=by_name)
    with (
        caplog.at_level(logging.DEBUG, logger=informer.__name__),
        contextlib.suppress(TimeoutError),
    ):
        await asyncio.wait_for(pods.run(), timeout=30)
    gaps = [b - a for a, b in itertools.pairwise(kube.watches)]
    assert 25 <= len(kube.watches) <= 32  # about one a second
    assert all(gap >= informer.RETRY_FIRST_SECONDS for gap in gaps)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1  # the first failure; the others at debug level until 60 in a row


async def test_a_label_selector_is_sent_with_every_list_and_watch_and_a_node_leaving_it_goes(
    server: tuple[Server, Kube],
) -> None:
    """Nodes are informed by their opt-in label: the API server sends a node that loses the
    label as DELETED (its watch filters by the selector), and the index drops it."""
    script, kube = server
    gone = asyncio.Event()

    def handle(type: str | None, body: JSON) -> Mapping[tuple[str, ...], Any]:
        if type == "DELETED":
            gone.set()
            return {}
        return by_name(body)

    node = {"metadata": {"name": "n1", "uid": "uid-n1", "resourceVersion": "1"}}
    script.lists = [[page([node], "1")]]
    script.watches = [
        [line("DELETED", {**node, "metadata": {**node["metadata"], "resourceVersion": "2"}})]
    ]
    index = InformedIndexer()
    nodes = Informer(kube, "v1", "Node", index=index, handle=handle, labels="opt=in")
    task = asyncio.create_task(nodes.run())
    try:
        await asyncio.wait_for(gone.wait(), timeout=5)
    finally:
        task.cancel()
    assert [q.get("labelSelector") for q in script.queries[:2]] == ["opt=in", "opt=in"]
    assert [q.get("watch") for q in script.queries[:2]] == [None, "1"]
    assert dict(index.index) == {}

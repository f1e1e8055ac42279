"""The API adapter against a scripted HTTP server: typed errors, the bounded retry of what the
API server did not do (on virtual time: the adapter's sleep is recorded, not slept), and the
paths and content types of its verbs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import kopf
import orjson
import pytest
from aiohttp import web

from mpijob.platform import kube
from mpijob.platform.kube import (
    ApiError,
    Conflict,
    Invalid,
    Kube,
    NotFound,
    NotLeading,
    ServerError,
    TooManyRequests,
)

pytestmark = pytest.mark.unit


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    user_agent: str = ""


@dataclass
class Script:
    """Answers in order (status, body, headers); the last one repeats."""

    answers: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.seen.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Content-Type", ""),
                orjson.loads(raw) if raw else None,
                request.headers.get("User-Agent", ""),
            )
        )
        status, body, headers = self.answers[min(len(self.seen), len(self.answers)) - 1]
        return web.Response(status=status, body=orjson.dumps(body), headers=headers)


@dataclass
class Api:
    script: Script
    kube: Kube
    slept: list[float]


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    script = Script()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", script.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    client = Kube(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"), sleep=sleep)
    yield Api(script, client, slept)
    await client.aclose()
    await runner.cleanup()


def status(code: int, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"kind": "Status", "code": code, "reason": reason, "message": message}


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-0", "namespace": "ns"}}


def test_an_api_error_is_the_subclass_of_its_status_and_keeps_the_status() -> None:
    assert type(ApiError(404, "NotFound", "gone")) is NotFound
    assert type(ApiError(409, "AlreadyExists", "x")) is Conflict
    assert type(ApiError(422, "Invalid", "x")) is Invalid
    assert type(ApiError(429, "TooManyRequests", "x")) is TooManyRequests
    assert type(ApiError(503, "ServiceUnavailable", "x")) is ServerError
    assert type(ApiError(418, "Teapot", "x")) is ApiError
    error = ApiError(409, "Conflict", "the object has been modified")
    assert isinstance(error, ApiError)
    assert (error.status, error.conflict, error.not_found) == (409, True, False)
    assert str(error) == "409 Conflict: the object has been modified"


async def test_a_refusal_raises_its_type_with_the_apis_reason_and_message(api: Api) -> None:
    api.script.answers = [(422, status(422, "Invalid", "spec.x: Required value"), {})]
    with pytest.raises(Invalid) as caught:
        await api.kube.create(POD)
    assert (caught.value.status, caught.value.reason) == (422, "Invalid")
    assert caught.value.message == "spec.x: Required value"
    assert len(api.script.seen) == 1  # a refusal is not tried again
    assert api.slept == []


async def test_a_read_the_server_failed_is_tried_again_with_a_growing_wait(api: Api) -> None:
    api.script.answers = [(503, status(503), {}), (500, status(500), {}), (200, POD, {})]
    assert await api.kube.get("v1", "Pod", "ns", "w-0") == POD
    assert len(api.script.seen) == 3
    assert api.slept == [kube.RETRY_BASE_SECONDS, 2 * kube.RETRY_BASE_SECONDS]


async def test_too_many_requests_waits_the_retry_after_the_server_names_even_for_a_create(
    api: Api,
) -> None:
    api.script.answers = [(429, status(429), {"Retry-After": "2"}), (201, POD, {})]
    assert await api.kube.create(POD) == POD
    assert [s.method for s in api.script.seen] == ["POST", "POST"]
    assert api.slept == [2.0]


async def test_a_write_the_server_failed_without_retry_after_is_not_sent_twice(api: Api) -> None:
    # It may have been done: a JSON patch that adds, sent twice, would add twice.
    api.script.answers = [(500, status(500, "InternalError", "etcd timeout"), {}), (200, POD, {})]
    with pytest.raises(ServerError):
        await api.kube.json_patch(
            "v1", "Pod", "ns", "w-0", [{"op": "add", "path": "/x", "value": 1}]
        )
    assert len(api.script.seen) == 1


async def test_retries_are_bounded_and_a_long_retry_after_is_capped(api: Api) -> None:
    api.script.answers = [(503, status(503, "ServiceUnavailable", "busy"), {"Retry-After": "120"})]
    with pytest.raises(ServerError) as caught:
        await api.kube.replace(POD)
    assert caught.value.status == 503
    assert len(api.script.seen) == 1 + kube.MAX_RETRIES
    assert api.slept == [kube.RETRY_MAX_SECONDS] * kube.MAX_RETRIES


async def test_a_caller_with_its_own_clock_gets_the_first_answer(api: Api) -> None:
    api.script.answers = [(429, status(429), {"Retry-After": "1"})]
    with pytest.raises(TooManyRequests):
        await api.kube.get("coordination.k8s.io/v1", "Lease", "ops", "lock", retry=False)
    assert len(api.script.seen) == 1
    assert api.slept == []


async def test_a_missing_object_reads_as_none_and_a_missing_delete_as_false(api: Api) -> None:
    api.script.answers = [(404, status(404, "NotFound", "pods w-0 not found"), {})]
    assert await api.kube.get("v1", "Pod", "ns", "w-0") is None
    assert await api.kube.delete("v1", "Pod", "ns", "w-0") is False
    assert await api.kube.resources("resource.k8s.io/v1") is None


async def test_each_verb_names_its_path_and_content_type(api: Api) -> None:
    api.script.answers = [(200, {}, {})]
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "gpu-shares"},
    }
    await api.kube.apply(webhook)
    await api.kube.json_patch("v1", "Pod", "ns", "w-0", [{"op": "remove", "path": "/a"}])
    await api.kube.patch("v1", "Pod", "ns", "w-0", {"metadata": {}}, subresource="status")
    await api.kube.get("v1", "Namespace", None, "ops")
    await api.kube.create(
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"namespace": "ops"}}
    )
    await api.kube.resources("v1")
    await api.kube.resources("resource.k8s.io/v1")
    await api.kube.version()
    seen = [(s.method, s.path, s.content_type) for s in api.script.seen]
    assert seen == [
        (
            "PATCH",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpu-shares",
            "application/apply-patch+yaml",
        ),
        ("PATCH", "/api/v1/namespaces/ns/pods/w-0", "application/json-patch+json"),
        ("PATCH", "/api/v1/namespaces/ns/pods/w-0/status", "application/merge-patch+json"),
        ("GET", "/api/v1/namespaces/ops", "application/json"),
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/ops/leases", "application/json"),
        ("GET", "/api/v1", "application/json"),
        ("GET", "/apis/resource.k8s.io/v1", "application/json"),
        ("GET", "/version", "application/json"),
    ]
    assert api.script.seen[0].query == {"fieldManager": "mpijob-operator", "force": "true"}
    assert api.script.seen[0].body == webhook
    assert api.script.seen[1].body == [{"op": "remove", "path": "/a"}]


class Gate:
    """A fence the test opens and closes: writes may start while it holds, and must be done
    ``left`` seconds later."""

    def __init__(self) -> None:
        self.left: float | None = None

    def write_deadline(self) -> float | None:
        if self.left is None:
            return None
        return asyncio.get_running_loop().time() + self.left


async def test_a_fenced_write_is_refused_unsent_unless_the_lease_holds_and_reads_pass(
    api: Api,
) -> None:
    gate = Gate()
    server = api.kube._info.server
    fenced = Kube(kopf.ConnectionInfo(server=server), fence=gate, user_agent="ua/replica-1")
    try:
        api.script.answers = [(201, POD, {})]
        for write in (
            lambda: fenced.create(POD),
            lambda: fenced.patch("v1", "Pod", "ns", "w-0", {"metadata": {}}),
            lambda: fenced.delete("v1", "Pod", "ns", "w-0"),
            lambda: fenced.replace(POD),
            lambda: fenced.apply(POD),
        ):
            with pytest.raises(NotLeading):
                await write()
        assert api.script.seen == []  # nothing left the process
        assert await fenced.get("v1", "Pod", "ns", "w-0") == POD  # a read needs no Lease
        await fenced.apply(POD, needs_lease=False)  # what every replica writes at start-up
        gate.left = 5.0
        assert await fenced.create(POD) == POD
        assert [s.method for s in api.script.seen] == ["GET", "PATCH", "POST"]
        assert {s.user_agent for s in api.script.seen} == {"ua/replica-1"}
        gate.left = 0.0  # the deadline has come: too late to start
        with pytest.raises(NotLeading):
            await fenced.create(POD)
    finally:
        await fenced.aclose()


async def test_a_fenced_write_is_given_up_at_the_fences_deadline() -> None:
    """A write the API server does not answer (a partition) is abandoned when a standby could
    take the Lease, not after the adapter's 60 s."""
    hung = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        hung.set()
        await asyncio.sleep(3600)
        return web.Response(status=500)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    gate = Gate()
    gate.left = 0.3
    fenced = Kube(
        kopf.ConnectionInfo(server=f"http://127.0.0.1:{runner.addresses[0][1]}"), fence=gate
    )
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(TimeoutError):
            await fenced.create(POD)
        assert hung.is_set()
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        await fenced.aclose()
        await runner.cleanup()


async def test_kopfs_requests_name_the_replica_as_the_adapters_do(api: Api) -> None:
    from kopf._cogs.clients.auth import APIContext

    info = kube.named(
        kopf.ConnectionInfo(server=api.kube._info.server, token="t0k"), "ua/replica-2"
    )
    assert info.as_http_headers() == {"Authorization": "Bearer t0k", "User-Agent": "ua/replica-2"}
    context = APIContext(info)
    try:
        api.script.answers = [(200, POD, {})]
        async with context.session.get(info.server + "/api/v1/namespaces/ns/pods/w-0") as r:
            assert r.status == 200
    finally:
        await context.session.close()
    assert [s.user_agent for s in api.script.seen] == ["ua/replica-2"]


async def test_a_fenced_write_asks_again_as_its_body_goes_out_and_is_not_sent_if_expired() -> None:
    """Frozen between the fence and the send (aiohttp writes a request in a task of its own),
    a write finds the Lease expired on resuming: not a byte of it, headers included, leaves."""
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(1 << 16):
            received.extend(chunk)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    class Expiring:
        asked = 0

        def write_deadline(self) -> float | None:
            self.asked += 1
            return asyncio.get_running_loop().time() + 5 if self.asked == 1 else None

    fence = Expiring()
    fenced = Kube(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"), fence=fence)
    try:
        with pytest.raises(NotLeading):
            await fenced.create(POD)
        await asyncio.sleep(0.1)
        assert fence.asked == 2
        assert bytes(received) == b""
    finally:
        await fenced.aclose()
        server.close()

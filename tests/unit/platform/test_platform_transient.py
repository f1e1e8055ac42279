"""One rule for transient API errors (:func:`mpijob.platform.kube.transient`): each kind of error
is transient or not, the adapter's retries and the callers that try again on their own clock
follow it, and no other module decides it by hand."""

from __future__ import annotations

import ast
import asyncio
import logging
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from mpijob import keys
from mpijob.api import JobKey
from mpijob.desired.events import normal
from mpijob.handlers import watches
from mpijob.platform import kube as kube_module
from mpijob.platform.kube import (
    MAX_RETRIES,
    RETRY_BASE_SECONDS,
    ApiError,
    NotLeading,
    retry_after,
    transient,
)
from mpijob.platform.leader import LeaderElector
from mpijob.platform.recorder import Recorder
from mpijob.platform.workers import OwnershipError, Workers
from support.fake_kube import FakeKube
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit

PACKAGE = Path(kube_module.__file__).resolve().parents[1]

#: (error, transient, transient with refusals=True)
CASES: list[tuple[BaseException, bool, bool]] = [
    (ApiError(429, "TooManyRequests"), True, True),
    (ApiError(500, "InternalError"), True, True),
    (ApiError(502, "BadGateway"), True, True),
    (ApiError(503, "ServiceUnavailable"), True, True),
    (ApiError(504, "Timeout"), True, True),
    (ApiError(400, "BadRequest"), False, True),
    (ApiError(401, "Unauthorized"), False, True),
    (ApiError(403, "Forbidden"), False, True),
    (ApiError(404, "NotFound"), False, True),
    (ApiError(409, "Conflict"), False, True),
    (ApiError(410, "Gone"), False, True),
    (ApiError(422, "Invalid"), False, True),
    (ConnectionRefusedError(111, "refused"), True, True),
    (ConnectionResetError(104, "reset"), True, True),
    (aiohttp.ClientOSError(113, "no route to host"), True, True),
    (aiohttp.ServerDisconnectedError(), True, True),  # no OSError
    (aiohttp.ClientPayloadError("response cut short"), True, True),  # no OSError
    (aiohttp.ServerTimeoutError("read timed out"), True, True),
    (TimeoutError(), True, True),
    (ssl.SSLError("handshake"), True, True),
    (NotLeading("no Lease"), False, False),
    (OwnershipError("taken"), False, False),
    (KeyError("metadata"), False, False),
    (TypeError("a bug"), False, False),
    (ValueError("a bug"), False, False),
    (asyncio.CancelledError(), False, False),
]


@pytest.mark.parametrize(("error", "alone", "with_refusals"), CASES, ids=repr)
def test_each_kind_of_error_is_transient_or_not(
    error: BaseException, alone: bool, with_refusals: bool
) -> None:
    assert transient(error) is alone
    assert transient(error, refusals=True) is with_refusals


def test_the_adapter_resends_what_is_transient_and_a_write_only_when_the_server_says_when() -> None:
    unavailable = ApiError(503, "ServiceUnavailable")
    assert retry_after("GET", unavailable, None, 1) == RETRY_BASE_SECONDS
    assert retry_after("POST", ApiError(429, "TooManyRequests"), None, 1) == RETRY_BASE_SECONDS
    assert retry_after("POST", unavailable, None, 1) is None  # it may have been done
    assert retry_after("PATCH", unavailable, "2", 1) == 2.0
    for refused in (404, 409, 422):
        assert retry_after("GET", ApiError(refused, ""), "1", 1) is None
    assert retry_after("GET", unavailable, None, MAX_RETRIES + 1) is None


# --- the callers ----------------------------------------------------------------------------


@virtual_time
async def test_a_lease_renewal_whose_connection_dropped_is_a_failed_try_not_the_end() -> None:
    kube = FakeKube(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}, versions=True
    )
    leader = LeaderElector(namespace="ops", name="lock", kube=kube, identity="first")
    task = asyncio.create_task(leader.run())
    await asyncio.wait_for(leader.leading.wait(), 5)
    # Two renewals cut short (6 s < the renew deadline): aiohttp raises these for a connection
    # the API server closed, and neither is an OSError.
    dropped = [aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("cut")]
    kube.fail("replace", *dropped)
    kube.fail("get", *dropped)
    await asyncio.sleep(30)
    assert not task.done()
    assert leader.holds()
    task.cancel()


@virtual_time
async def test_an_event_whose_connection_dropped_is_sent_again_and_a_forbidden_one_is_not() -> None:
    job = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": "pi", "namespace": "ns", "uid": "u1"},
    }
    api = FakeKube()
    api.fail("create", aiohttp.ServerDisconnectedError(), ApiError(503, "ServiceUnavailable"))
    recorder = Recorder(api, instance="test")
    recorder.post(job, normal(keys.REASON_CREATED, "created"))
    await recorder.drain()
    assert [c.ok for c in api.calls] == [False, False, True]

    api = FakeKube()
    api.fail("create", ApiError(403, "Forbidden"))
    recorder = Recorder(api, instance="test")
    recorder.post(job, normal(keys.REASON_CREATED, "created"))
    await recorder.drain()
    assert [c.ok for c in api.calls] == [False]


@virtual_time
async def test_the_hypernode_poll_outlives_an_api_server_that_went_away() -> None:
    kube = FakeKube(
        {
            "apiVersion": keys.HYPERNODE_API_VERSION,
            "kind": "HyperNode",
            "metadata": {"name": "spine-0"},
            "spec": {"tier": 2},
        }
    )
    kube.fail("list", aiohttp.ServerDisconnectedError(), aiohttp.ClientOSError(111, "refused"))
    rt: Any = SimpleNamespace(kube=kube, cache=SimpleNamespace(hypernodes=[]), admission=None)
    poll = asyncio.create_task(watches.follow_hypernodes(rt))
    await asyncio.sleep(3 * watches.HYPERNODE_POLL_SECONDS)
    assert not poll.done()  # a runnable that ended would end the process
    assert [h["metadata"]["name"] for h in rt.cache.hypernodes] == ["spine-0"]
    poll.cancel()


@pytest.mark.parametrize(
    ("error", "traceback"),
    [
        (aiohttp.ServerDisconnectedError(), False),
        (ApiError(403, "Forbidden"), False),
        (NotLeading("no Lease"), False),
        (KeyError("spec"), True),
    ],
    ids=repr,
)
async def test_a_failed_reconcile_logs_a_traceback_only_for_a_bug(
    error: Exception, traceback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    workers = Workers(threadiness=1)
    workers.open(next(iter(workers.caches)))
    failed = asyncio.Event()

    async def reconcile(key: JobKey) -> None:
        failed.set()
        raise error

    workers.enqueue(("ns", "pi"))
    with caplog.at_level(logging.WARNING, logger="mpijob.platform.workers"):
        serving = asyncio.create_task(workers.serve(reconcile))
        await asyncio.wait_for(failed.wait(), 5)
        await asyncio.sleep(0)
        serving.cancel()
    (line,) = [r for r in caplog.records if "failed; retrying" in r.getMessage()]
    assert bool(line.exc_info) is traceback


# --- no second rule ---------------------------------------------------------------------------

#: Status codes that say whether an answer is transient.
TRANSIENT_STATUSES = {429, *range(500, 600)}
#: Exception types that, caught beside ApiError, make a rule of their own.
UNANSWERED = {"OSError", "TimeoutError", "ConnectionError", "ClientError"}


def hand_rules(path: Path) -> list[str]:
    """Where ``path`` decides by itself whether an API error is transient: a status compared
    with 429 or a 5xx, or ApiError caught (or tested) together with a connection error or a
    timeout, or any of aiohttp's errors named."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            constants = {
                c.value
                for side in sides
                for c in ast.walk(side)
                if isinstance(c, ast.Constant) and isinstance(c.value, int)
            }
            text = ast.unparse(node)
            if constants & TRANSIENT_STATUSES and ("status" in text or "code" in text):
                found.append(f"{where}: {text}")
        types: ast.expr | None = None
        if isinstance(node, ast.ExceptHandler):
            types = node.type
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
        ):
            types = node.args[1]
        if types is None:
            continue
        names = {
            n.attr if isinstance(n, ast.Attribute) else n.id
            for n in ast.walk(types)
            if isinstance(n, ast.Name | ast.Attribute)
        }
        aiohttp_error = "aiohttp" in names and any(n.endswith("Error") for n in names)
        if aiohttp_error or ("ApiError" in names and names & UNANSWERED):
            found.append(f"{where}: {ast.unparse(types)}")
    return found


def test_no_module_but_the_adapter_decides_what_is_transient() -> None:
    adapter = Path(kube_module.__file__).resolve()
    found = [
        rule
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.resolve() != adapter
        for rule in hand_rules(path)
    ]
    assert found == []
    # The check finds what it looks for: the adapter's own rule.
    assert any("OSError | TimeoutError | aiohttp.ClientError" in r for r in hand_rules(adapter))

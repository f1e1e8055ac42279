"""The liveness probe: Kopf's probe server on ``--health-port`` answers from the operator's
``kopf.on.probe`` handler, which reads the event loop's heartbeat; the flag, and the start-up
check that the port is free and not the monitoring port."""

from __future__ import annotations

import asyncio
import io
import json
import socket
from collections.abc import AsyncIterator, Iterator

import aiohttp
import kopf
import pytest
from click import BadParameter
from kopf._core.engines import indexing, probing

from mpijob import cli
from mpijob.handlers import startup
from mpijob.handlers.startup import (
    HEALTHY_WITHIN_SECONDS,
    LIVENESS_PROBE_ID,
    StartupFailed,
    liveness_endpoint,
    liveness_probe,
    step,
)
from mpijob.platform import kopf_tuning, logs
from mpijob.platform.workers import Workers
from mpijob.settings import OperatorSettings
from support.log_lines import restored_logging
from support.virtual_time import FakeClock

pytestmark = pytest.mark.unit


def beating() -> tuple[Workers, FakeClock]:
    clock = FakeClock()
    return Workers(threadiness=1, clock=clock), clock


async def test_a_loop_that_beat_lately_is_alive_and_says_how_long_ago() -> None:
    workers, clock = beating()
    probe = liveness_probe(kopf.OperatorRegistry(), workers)
    clock.advance(2.5)
    assert await probe() == 2.5
    clock.advance(HEALTHY_WITHIN_SECONDS - 3)
    assert await probe() == HEALTHY_WITHIN_SECONDS - 0.5


async def test_a_heartbeat_as_old_as_the_window_fails_the_probe_permanently() -> None:
    workers, clock = beating()
    probe = liveness_probe(kopf.OperatorRegistry(), workers)
    clock.advance(HEALTHY_WITHIN_SECONDS)
    with pytest.raises(kopf.PermanentError, match="the event loop last beat 30 s ago"):
        await probe()


def test_the_probe_is_one_coroutine_handler_of_the_registry() -> None:
    registry = kopf.OperatorRegistry()
    probe = liveness_probe(registry, beating()[0])
    assert asyncio.iscoroutinefunction(probe)  # Kopf's threads are refused (NoThreads)
    handlers = registry._activities.get_all_handlers()
    assert [(h.id, h.activity.value, h.fn) for h in handlers] == [
        (LIVENESS_PROBE_ID, "probe", probe)
    ]


@pytest.fixture
def kopf_lines() -> Iterator[io.StringIO]:
    """The operator's log set-up, its lines here; restored after."""
    with restored_logging() as out:
        logs.configure(stream=out)
        yield out


@pytest.fixture
async def served(kopf_lines: io.StringIO) -> AsyncIterator[tuple[str, Workers, FakeClock]]:
    """Kopf's own probe server, as ``kopf.operator(liveness_endpoint=...)`` runs it, with the
    operator's handler and Kopf's settings as the operator tunes them."""
    workers, clock = beating()
    registry = kopf.OperatorRegistry()
    liveness_probe(registry, workers)
    settings = kopf.OperatorSettings()
    kopf_tuning.configure(settings, OperatorSettings())
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    up = asyncio.Event()
    server = asyncio.create_task(
        probing.health_reporter(
            f"http://127.0.0.1:{port}/healthz",
            memo=kopf.Memo(),
            indices=indexing.OperatorIndexers().indices,
            registry=registry,
            settings=settings,
            ready_flag=up,
        )
    )
    await asyncio.wait_for(up.wait(), 10)
    try:
        yield f"http://127.0.0.1:{port}/healthz", workers, clock
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=5) as answer:
        return answer.status, await answer.text()


async def test_kopfs_probe_server_answers_500_at_once_while_the_heartbeat_is_stale_then_200(
    served: tuple[str, Workers, FakeClock], kopf_lines: io.StringIO
) -> None:
    url, workers, clock = served
    clock.advance(HEALTHY_WITHIN_SECONDS + 5)
    # Not retried after a backoff (the request would hang): answered within the timeout.
    status, _ = await get(url)
    assert status == 500
    assert "the event loop last beat 35 s ago" in kopf_lines.getvalue()
    workers.heartbeat = clock.monotonic()  # the loop beats again
    clock.advance(1.5)
    status, body = await get(url)
    assert (status, json.loads(body)) == (200, {LIVENESS_PROBE_ID: 1.5})


async def test_a_healthy_probe_leaves_no_line_in_the_log(
    served: tuple[str, Workers, FakeClock], kopf_lines: io.StringIO
) -> None:
    url, _, _ = served
    kopf_lines.truncate(0)
    assert (await get(url))[0] == 200
    assert kopf_lines.getvalue() == ""


def test_the_health_port_flag_defaults_to_8081_and_0_turns_it_off() -> None:
    assert (
        cli.run.make_context("run", []).params["health_port"]
        == 8081
        == OperatorSettings().health_port
    )
    assert cli.run.make_context("run", ["--health-port", "0"]).params["health_port"] == 0
    assert cli.run.make_context("run", ["--health-port=9000"]).params["health_port"] == 9000
    with pytest.raises(BadParameter):
        cli.run.make_context("run", ["--health-port", "70000"])


def test_the_liveness_endpoint_is_kopfs_on_every_interface() -> None:
    with socket.socket() as free:
        free.bind(("0.0.0.0", 0))
        port = free.getsockname()[1]
    assert liveness_endpoint(OperatorSettings(health_port=port)) == f"http://0.0.0.0:{port}/healthz"


def test_a_health_port_taken_ends_start_up_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        what = f"serving the liveness probe /healthz on port {port}"
        with pytest.raises(StartupFailed) as caught, step(what):
            liveness_endpoint(OperatorSettings(health_port=port))
    assert str(caught.value) == f"{what}: [Errno 98] Address already in use"


def test_the_health_port_must_not_be_the_monitoring_port() -> None:
    ours = OperatorSettings(monitoring_port=8080, health_port=8080)
    with pytest.raises(StartupFailed) as caught, step("serving"):
        startup.liveness_endpoint(ours)
    assert str(caught.value) == (
        "serving: --health-port and --monitoring-port are both 8080; Kopf's liveness probe "
        "and our /metrics and /readyz need a port each"
    )

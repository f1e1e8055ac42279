"""What an MPIJob's watch event asks of the work queue."""

from __future__ import annotations

from types import SimpleNamespace

import kopf
import pytest

from mpijob.handlers.cache import Cache
from mpijob.handlers.watches import mpijob_event
from mpijob.handlers.workers import Workers

pytestmark = pytest.mark.unit

KEY = ("ns", "pi")


def _event(version: str) -> kopf.Body:
    return kopf.Body({"metadata": {"namespace": "ns", "name": "pi", "resourceVersion": version}})


async def _queued_after(type: str, version: str) -> int:
    rt = SimpleNamespace(cache=Cache(), workers=Workers(threadiness=1))
    rt.cache.wrote_status(KEY, "1", {"metadata": {"resourceVersion": "2"}})
    memo = {"runtime": rt}
    await mpijob_event(namespace="ns", name="pi", type=type, body=_event(version), memo=memo)
    assert rt.workers.indexed.is_set()  # an event handler runs only once the indices are full
    return len(rt.workers.queue)


async def test_the_echo_of_our_own_status_write_asks_for_no_sync() -> None:
    assert await _queued_after("MODIFIED", "2") == 0


async def test_any_other_version_of_the_job_asks_for_its_sync() -> None:
    assert await _queued_after("MODIFIED", "3") == 1
    assert await _queued_after(None, "2") == 1  # listed at start: always synced

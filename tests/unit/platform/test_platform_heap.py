"""Freed memory is given back on a timer, off the event loop; nothing is done without glibc."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mpijob.platform import heap
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


def test_this_machines_glibc_has_malloc_trim() -> None:
    trim = heap.malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was given back, 0: there was none to give


@virtual_time
async def test_freed_memory_is_given_back_every_interval_in_a_worker_thread() -> None:
    loop_thread = threading.get_ident()
    calls: list[int] = []
    task = asyncio.create_task(
        heap.give_back_forever(60.0, trim=lambda: calls.append(threading.get_ident()))
    )
    await asyncio.sleep(59.0)
    assert calls == []  # not at start: there is nothing to give back yet
    await asyncio.sleep(2.0)
    await asyncio.sleep(0.5)  # the worker thread's result comes back to the loop
    assert len(calls) == 1
    assert calls[0] != loop_thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "malloc_trim", lambda: None)
    await asyncio.wait_for(heap.give_back_forever(0.01), timeout=1.0)  # returns at once

"""Deferred patches: one writer, not urgent; the newest patch of an object replaces one waiting;
a deleted job's patches go with it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpijob.platform.deferred import DeferredPatches
from support.fake_kube import FakeKube
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


def slow_api(*names: str) -> FakeKube:
    """An API whose patches take 10 ms, holding a ConfigMap of each name."""
    config_maps = (
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": "ns"}}
        for n in names
    )
    return FakeKube(*config_maps, latency=0.01)


def sent(api: FakeKube) -> list[tuple[str, Any, bool]]:
    """The patches the API applied: name, patch, whether sent as urgent."""
    return [(c.args[3], c.args[4], c.kwargs["urgent"]) for c in api.done("patch")]


def hosts(n: int) -> dict[str, Any]:
    return {"data": {"discover_hosts.sh": "\n".join(f"w-{i}" for i in range(n))}}


@virtual_time
async def test_the_newest_patch_of_an_object_replaces_the_one_waiting() -> None:
    api = slow_api("a-config", "b-config")
    deferred = DeferredPatches(api)
    deferred.patch(("ns", "a"), "v1", "ConfigMap", "ns", "a-config", hosts(1))
    await asyncio.sleep(0)  # the writer takes it
    for n in range(1, 4):
        deferred.patch(("ns", "b"), "v1", "ConfigMap", "ns", "b-config", hosts(n))
        deferred.patch(("ns", "a"), "v1", "ConfigMap", "ns", "a-config", hosts(n))
    await deferred.drain()
    # a's first patch was on its way when the others came; they left one, the newest, waiting.
    assert sent(api) == [
        ("a-config", hosts(1), False),
        ("b-config", hosts(3), False),
        ("a-config", hosts(3), False),
    ]
    assert api.most_in_flight == 1


@virtual_time
async def test_a_failed_patch_is_dropped_and_the_others_go_on() -> None:
    api = slow_api("a-config")
    deferred = DeferredPatches(api)
    deferred.patch(("ns", "gone"), "v1", "ConfigMap", "ns", "gone-config", hosts(1))
    deferred.patch(("ns", "a"), "v1", "ConfigMap", "ns", "a-config", hosts(2))
    await deferred.drain()
    assert sent(api) == [("a-config", hosts(2), False)]
    deferred.patch(("ns", "a"), "v1", "ConfigMap", "ns", "a-config", hosts(3))
    await deferred.drain()
    assert sent(api)[-1] == ("a-config", hosts(3), False)


@virtual_time
async def test_a_deleted_jobs_patches_still_waiting_go_with_it() -> None:
    """Under sustained load the line waits behind every urgent request: a deleted job's patch
    must not wait there for good."""
    api = slow_api("a-config", "b-config", "c-config")
    deferred = DeferredPatches(api)
    deferred.patch(("ns", "a"), "v1", "ConfigMap", "ns", "a-config", hosts(1))
    await asyncio.sleep(0)  # the writer takes a's
    deferred.patch(("ns", "b"), "v1", "ConfigMap", "ns", "b-config", hosts(1))
    deferred.patch(("ns", "c"), "v1", "ConfigMap", "ns", "c-config", hosts(1))
    deferred.forget(("ns", "a"))  # on its way already: nothing to take back
    deferred.forget(("ns", "b"))
    await deferred.drain()
    assert [name for name, _, _ in sent(api)] == ["a-config", "c-config"]
    assert deferred._of_job == {("ns", "c"): {("v1", "ConfigMap", "ns", "c-config")}}

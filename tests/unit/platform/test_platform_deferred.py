"""Deferred patches: one writer, not urgent; the newest patch of an object replaces one waiting."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpijob.platform.deferred import DeferredPatches
from mpijob.platform.kube import ApiError

pytestmark = pytest.mark.unit


class SlowPatches:
    def __init__(self, *, missing: frozenset[str] = frozenset()) -> None:
        self.sent: list[tuple[str, Any, bool]] = []
        self.in_flight = self.most_in_flight = 0
        self.missing = missing

    async def patch(self, *args: Any, urgent: bool = True) -> dict[str, Any]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            name, patch = args[3], args[4]
            if name in self.missing:
                raise ApiError(404, "NotFound", f'configmaps "{name}" not found')
            self.sent.append((name, patch, urgent))
            return {}
        finally:
            self.in_flight -= 1


def hosts(n: int) -> dict[str, Any]:
    return {"data": {"discover_hosts.sh": "\n".join(f"w-{i}" for i in range(n))}}


async def test_the_newest_patch_of_an_object_replaces_the_one_waiting() -> None:
    api = SlowPatches()
    deferred = DeferredPatches(api)  # type: ignore[arg-type]
    deferred.patch("v1", "ConfigMap", "ns", "a-config", hosts(1))
    await asyncio.sleep(0)  # the writer takes it
    for n in range(1, 4):
        deferred.patch("v1", "ConfigMap", "ns", "b-config", hosts(n))
        deferred.patch("v1", "ConfigMap", "ns", "a-config", hosts(n))
    await deferred.drain()
    # a's first patch was on its way when the others came; they left one, the newest, waiting.
    assert api.sent == [
        ("a-config", hosts(1), False),
        ("b-config", hosts(3), False),
        ("a-config", hosts(3), False),
    ]
    assert api.most_in_flight == 1


async def test_a_failed_patch_is_dropped_and_the_others_go_on() -> None:
    api = SlowPatches(missing={"gone-config"})
    deferred = DeferredPatches(api)  # type: ignore[arg-type]
    deferred.patch("v1", "ConfigMap", "ns", "gone-config", hosts(1))
    deferred.patch("v1", "ConfigMap", "ns", "a-config", hosts(2))
    await deferred.drain()
    assert api.sent == [("a-config", hosts(2), False)]
    deferred.patch("v1", "ConfigMap", "ns", "a-config", hosts(3))
    await deferred.drain()
    assert api.sent[-1] == ("a-config", hosts(3), False)

"""The API adapter's client-side limits: one bucket per API client, Events behind the rest."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from mpijob.handlers import kube
from mpijob.handlers.kube import TokenBucket, bucket_of
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


def test_mpijobs_podgroups_and_the_lease_have_their_own_buckets_as_upstreams_clients() -> None:
    core = bucket_of("/api/v1/namespaces/ns/pods")
    assert bucket_of("/apis/batch/v1/namespaces/ns/jobs") == core
    assert bucket_of("/api/v1/namespaces/ns/events") == core
    own = {
        bucket_of("/apis/kubeflow.org/v2beta1/namespaces/ns/mpijobs/pi/status"),
        bucket_of("/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups"),
        bucket_of("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups"),
        bucket_of("/apis/coordination.k8s.io/v1/namespaces/ns/leases/mpijob-operator"),
    }
    assert len(own) == 4
    assert core not in own


@virtual_time
async def test_an_event_waits_until_no_urgent_request_waits() -> None:
    bucket = TokenBucket(qps=50, burst=1)
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await bucket.take(urgent=urgent)
        order.append(name)

    await take("first", True)  # the burst is spent: every later take waits for a token
    tasks = [asyncio.create_task(take(f"child-{i}", True)) for i in range(2)]
    await asyncio.sleep(0)  # the children wait for tokens when the Event comes
    tasks.append(asyncio.create_task(take("event", False)))
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(take("child-2", True)))  # came later, still goes first
    await asyncio.gather(*tasks)
    assert order == ["first", "child-0", "child-1", "child-2", "event"]


@virtual_time
async def test_without_urgent_requests_an_event_is_not_held() -> None:
    bucket = TokenBucket(qps=50, burst=2)
    await asyncio.wait_for(bucket.take(urgent=False), timeout=0.01)


@virtual_time
async def test_a_spare_token_leaves_half_the_burst_to_urgent_requests() -> None:
    bucket = TokenBucket(qps=100, burst=21)
    for _ in range(12):  # 9 left: fewer than the 10 kept for urgent requests
        await bucket.take()
    waiting = asyncio.create_task(bucket.take(urgent=False))
    await asyncio.sleep(0.005)
    assert not waiting.done()
    await asyncio.wait_for(waiting, timeout=0.1)  # 10 ms later the bucket holds 11 again


@virtual_time
async def test_under_sustained_load_a_request_that_is_not_urgent_still_gets_its_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kube, "SPARE_WAIT_SECONDS", 0.05)
    bucket = TokenBucket(qps=200, burst=1)
    stop = asyncio.Event()

    async def urgent_load() -> None:
        while not stop.is_set():
            await bucket.take()

    loads = [asyncio.create_task(urgent_load()) for _ in range(3)]
    await asyncio.sleep(0.01)
    await asyncio.wait_for(bucket.take(urgent=False), timeout=0.5)
    stop.set()
    await asyncio.gather(*loads)


class LateWaking(TokenBucket):
    """A bucket on a clock of its own, whose sleepers wake 5 ms late (a busy event loop)."""

    def __init__(self, qps: float, burst: int) -> None:
        super().__init__(qps, burst)
        self.clock = 0.0

    def _now(self) -> float:
        return self.clock

    async def _sleep(self, seconds: float) -> None:
        self.clock += seconds + 0.005


async def test_a_late_wake_costs_no_rate() -> None:
    bucket = LateWaking(qps=100, burst=1)
    for _ in range(101):  # the burst, then 100 tokens at 100 per second
        await bucket.take()
    # Crediting tokens from each wake-up rather than from the clock would take 100 x 15 ms.
    assert bucket.clock == pytest.approx(1.0 + 0.005)


async def test_a_list_reads_every_page_with_its_selectors() -> None:
    class Pages(kube.Kube):
        """The adapter with its HTTP layer answered from here: two pages."""

        def __init__(self) -> None:
            super().__init__(kopf.ConnectionInfo(server="https://api.invalid"))
            self.queries: list[dict[str, str]] = []

        async def request(self, method: str, url: str, *_: Any, **kw: Any) -> dict[str, Any]:
            self.queries.append(dict(kw["query"]))
            more = {"continue": "next"} if len(self.queries) == 1 else {}
            return {"metadata": more, "items": [{"page": len(self.queries)}]}

    api = Pages()
    items = await api.list("v1", "Event", "ns", fields="source=x")
    assert items == [{"page": 1}, {"page": 2}]
    assert api.queries == [
        {"limit": "500", "fieldSelector": "source=x"},
        {"limit": "500", "fieldSelector": "source=x", "continue": "next"},
    ]

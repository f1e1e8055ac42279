"""The runner of the operator's work: what needs the Lease starts only once this replica leads,
is cancelled and the process exits when the Lease is lost, and a graceful stop releases it
after the lines drained; on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpijob.platform.leader import RENEW_DEADLINE_SECONDS, LeaderElector
from mpijob.platform.manager import Manager, Runnable
from support.fake_kube import FakeKube
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


def held_by(holder: str) -> FakeKube:
    return FakeKube(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}},
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "lock", "namespace": "ops"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        },
        versions=True,
    )


class Work:
    """A runnable's body that says when it ran and when it was cancelled."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.cancelled = False

    async def __call__(self) -> None:
        self.started = asyncio.get_running_loop().time()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


@virtual_time
async def test_work_that_writes_starts_only_once_the_lease_is_held() -> None:
    kube = held_by("other")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    reads, writes = Work(), Work()
    exits: list[int] = []
    manager = Manager(
        [Runnable("reads", reads, False), Runnable("writes", writes, True)],
        elector=elector,
        exit=exits.append,
    )
    assert not manager.ready()
    manager.start()
    await asyncio.sleep(1)
    assert manager.ready()  # a standby is ready to lead
    assert reads.started == 0
    assert writes.started is None
    with pytest.raises(RuntimeError):
        manager.start()  # never a second set of workers
    await asyncio.sleep(20)
    assert elector.holds()
    assert writes.started is not None
    assert 15 <= writes.started <= 18
    await manager.stop()
    assert writes.cancelled
    assert reads.cancelled
    assert exits == []
    assert kube.stored("Lease", "ops")[0]["spec"].get("holderIdentity") is None  # released


@virtual_time
async def test_the_lease_lost_cancels_the_writers_and_exits() -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    writes = Work()
    exits: list[int] = []
    manager = Manager([Runnable("writes", writes, True)], elector=elector, exit=exits.append)
    manager.start()
    await asyncio.sleep(1)
    assert elector.holds()
    assert writes.started is not None
    stored = kube.stored("Lease", "ops")[0]
    stored["spec"]["holderIdentity"] = "other"
    stored["metadata"]["resourceVersion"] = "999"
    await asyncio.sleep(RENEW_DEADLINE_SECONDS)
    assert exits == [1]
    assert writes.cancelled
    assert not elector.holds()


@virtual_time
async def test_without_an_elector_the_writers_start_at_once() -> None:
    writes = Work()
    manager = Manager([Runnable("writes", writes, True)], elector=None, exit=lambda s: None)
    manager.start()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert writes.started == 0
    assert manager.ready()
    await manager.stop()


@virtual_time
async def test_a_graceful_stop_drains_before_releasing() -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    order: list[Any] = []

    async def drain() -> None:
        order.append(("drain", elector.holds()))

    manager = Manager([], elector=elector, stopping=(drain,), exit=lambda s: None)
    manager.start()
    await asyncio.sleep(1)
    await manager.stop()
    assert order == [("drain", True)]  # the lines drained while the Lease still held
    assert not elector.holds()


@virtual_time
async def test_a_second_stop_waits_for_the_first_and_stops_nothing_again() -> None:
    # Kopf's cleanup activity stops the manager; start-up's ``finally`` stops it again.
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    drains: list[float] = []

    async def drain() -> None:
        await asyncio.sleep(1)
        drains.append(asyncio.get_running_loop().time())

    writes = Work()
    manager = Manager(
        [Runnable("writes", writes, True)], elector=elector, stopping=(drain,), exit=lambda s: 0
    )
    manager.start()
    await asyncio.sleep(1)
    first = asyncio.create_task(manager.stop())
    await asyncio.sleep(0)
    await manager.stop()  # returns only once the first stop has finished
    assert first.done()
    assert writes.cancelled
    assert not elector.holds()
    await manager.stop()
    assert len(drains) == 1


@virtual_time
async def test_a_campaign_that_fails_is_a_lost_lease() -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    writes = Work()
    exits: list[int] = []
    manager = Manager([Runnable("writes", writes, True)], elector=elector, exit=exits.append)
    manager.start()
    await asyncio.sleep(1)
    assert writes.started is not None
    kube.fail("replace", RuntimeError("a bug"))
    await asyncio.sleep(RENEW_DEADLINE_SECONDS)
    assert exits == [1]
    assert writes.cancelled

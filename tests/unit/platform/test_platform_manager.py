"""The runner of the operator's work: what needs the Lease starts only once this replica leads
and its caches are filled, is cancelled and the process exits when the Lease is lost or any
work fails, and a graceful stop releases it after the lines drained; on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpijob.platform.leader import RENEW_DEADLINE_SECONDS, LeaderElector
from mpijob.platform.manager import STOP_ON_FAILURE_SECONDS, Manager, Runnable
from mpijob.platform.workers import CACHE_SYNC_SECONDS, KOPF_INDICES, Workers
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


class Fails:
    """A runnable's body that raises ``seconds`` after it started (a bug in the workers)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.raised: float | None = None

    async def __call__(self) -> None:
        await asyncio.sleep(self.seconds)
        self.raised = asyncio.get_running_loop().time()
        raise RuntimeError("a bug in the workers")


@virtual_time
async def test_work_that_writes_and_raises_ends_the_process_and_releases_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    reads, failing, admission = Work(), Fails(5), Work()
    exits: list[tuple[int, float]] = []
    drained: list[bool] = []

    async def drain() -> None:
        drained.append(elector.holds())

    manager = Manager(
        [
            Runnable("informer", reads, False),
            Runnable("reconcile", failing, True),
            Runnable("admission", admission, True),
        ],
        elector=elector,
        stopping=(drain,),
        exit=lambda status: exits.append((status, asyncio.get_running_loop().time())),
    )
    manager.start()
    await asyncio.sleep(1)
    assert elector.holds()
    assert manager.ready()
    await asyncio.sleep(10)
    assert failing.raised is not None
    assert [status for status, _ in exits] == [1]
    assert exits[0][1] - failing.raised < 1  # at once: one Lease request
    assert not manager.ready()
    assert admission.cancelled  # the other work that writes stopped before the Lease went
    assert reads.cancelled
    assert drained == [True]  # the lines drained while the Lease still held
    assert kube.stored("Lease", "ops")[0]["spec"].get("holderIdentity") is None  # released
    failed = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(failed) == 1, failed
    assert (
        failed[0]
        .getMessage()
        .startswith("reconcile failed: RuntimeError: a bug in the workers; exiting (status 1)")
    )
    assert failed[0].exc_info is not None  # the traceback of the bug


@virtual_time
async def test_work_without_the_lease_that_raises_ends_the_process_too() -> None:
    writes = Work()
    exits: list[int] = []
    manager = Manager(
        [Runnable("informer-pods", Fails(3), False), Runnable("reconcile", writes, True)],
        elector=None,
        exit=exits.append,
    )
    manager.start()
    await asyncio.sleep(1)
    assert manager.ready()
    await asyncio.sleep(3)
    assert exits == [1]
    assert writes.cancelled


@virtual_time
async def test_work_cancelled_by_anything_but_the_manager_ends_the_process() -> None:
    async def cancelled_inside() -> None:
        await asyncio.sleep(2)
        raise asyncio.CancelledError  # as a bug's stray cancellation ends a task

    exits: list[int] = []
    manager = Manager(
        [Runnable("reconcile", cancelled_inside, True)], elector=None, exit=exits.append
    )
    manager.start()
    await asyncio.sleep(3)
    assert exits == [1]


@virtual_time
async def test_work_that_returns_has_finished_and_nothing_exits() -> None:
    async def nothing_to_do() -> None:  # the heap trimmer without malloc_trim
        return

    exits: list[int] = []
    writes = Work()
    manager = Manager(
        [Runnable("heap-trim", nothing_to_do, False), Runnable("reconcile", writes, True)],
        elector=None,
        exit=exits.append,
    )
    manager.start()
    await asyncio.sleep(60)
    assert exits == []
    assert manager.ready()
    assert not writes.cancelled
    await manager.stop()


@virtual_time
async def test_a_stop_that_hangs_after_a_failure_does_not_keep_the_process() -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    failing = Fails(2)
    exits: list[float] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    manager = Manager(
        [Runnable("reconcile", failing, True)],
        elector=elector,
        stopping=(hangs,),
        exit=lambda status: exits.append(asyncio.get_running_loop().time()),
    )
    manager.start()
    await asyncio.sleep(10)
    assert failing.raised is not None
    assert len(exits) == 1
    assert exits[0] - failing.raised == pytest.approx(STOP_ON_FAILURE_SECONDS)


@virtual_time
async def test_no_campaign_and_not_ready_until_the_caches_are_filled() -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    workers = Workers(threadiness=1, caches=frozenset({"pods", KOPF_INDICES}))
    writes = Work()
    manager = Manager(
        [Runnable("reconcile", writes, True)],
        elector=elector,
        synced=workers.synced,
        exit=lambda status: None,
    )
    manager.start()
    await asyncio.sleep(30)
    assert not manager.ready()
    assert not elector.holds()
    assert kube.stored("Lease", "ops")[0]["spec"]["holderIdentity"] == ""  # never asked for
    assert writes.started is None
    workers.open("pods")
    workers.open(KOPF_INDICES)
    await asyncio.sleep(1)
    assert manager.ready()
    assert elector.holds()
    assert writes.started == 30
    await manager.stop()


@virtual_time
async def test_caches_not_filled_in_time_end_the_process_without_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = held_by("")
    elector = LeaderElector(namespace="ops", name="lock", kube=kube, identity="me")
    workers = Workers(threadiness=1, caches=frozenset({"pods", "configmaps_by_job", KOPF_INDICES}))
    workers.open("pods")
    exits: list[tuple[int, float]] = []
    ready: list[bool] = []
    manager = Manager(
        [Runnable("heartbeat", Work(), False)],
        elector=elector,
        synced=workers.synced,
        exit=lambda status: exits.append((status, asyncio.get_running_loop().time())),
    )
    manager.start()
    for _ in range(int(CACHE_SYNC_SECONDS) + 5):
        ready.append(manager.ready())
        await asyncio.sleep(1)
    assert exits == [(1, CACHE_SYNC_SECONDS)]
    assert not any(ready)
    assert kube.stored("Lease", "ops")[0]["spec"]["holderIdentity"] == ""
    failed = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert failed == [
        "Start-up failed: filling the caches: not filled within 120 s: configmaps_by_job,"
        " kopf-indices; exiting (status 1) so that this replica restarts from empty state"
    ]

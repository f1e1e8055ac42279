"""Lease-based leader election: who takes the Lease, when a standby takes over, and that a
renewal is never retried past its deadline (on a clock of the test's own); then every
transition of the campaign (standby -> leading, renewals, lost by deadline, lost to another
holder, released) on virtual time, with the fence every write asks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpijob.platform import leader as leader_module
from mpijob.platform.clock import SYSTEM, Clock
from mpijob.platform.kube import ApiError
from mpijob.platform.leader import (
    LEASE_SECONDS,
    MARGIN_SECONDS,
    RENEW_DEADLINE_SECONDS,
    REQUEST_TIMEOUT_SECONDS,
    RETRY_SECONDS,
    LeaderElector,
)
from support.fake_kube import FakeKube
from support.virtual_time import FakeClock, virtual_time

pytestmark = pytest.mark.unit


def cluster() -> FakeKube:
    """Namespace ``ops`` and no Lease yet; a write on a stale ``resourceVersion`` is refused
    with 409, as the API server refuses it."""
    return FakeKube(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}, versions=True
    )


def lease(kube: FakeKube) -> dict[str, Any]:
    return kube.stored("Lease", "ops")[0]


def elector(kube: Any, clock: Clock = SYSTEM, name: str = "") -> LeaderElector:
    """An elector on ``clock``: the real one reads the (virtual) loop's time."""
    return LeaderElector(
        namespace="ops",
        name="lock",
        kube=kube,
        identity=name or leader_module.identity(),
        clock=clock,
    )


async def test_the_first_replica_creates_the_lease_and_a_second_waits_a_lease_duration() -> None:
    kube, clock = cluster(), FakeClock(0.0)
    first, second = elector(kube, clock), elector(kube, clock)
    assert await first._try_acquire_or_renew()
    assert lease(kube)["spec"]["holderIdentity"] == first.identity
    first.leading.set()
    assert not await second._try_acquire_or_renew()  # held: a first sight, a retry period on
    clock.advance(RETRY_SECONDS)
    assert await first._try_acquire_or_renew()  # the last renewal
    assert not await second._try_acquire_or_renew()  # seen changing just now
    clock.advance(LEASE_SECONDS - 1)
    assert not await second._try_acquire_or_renew()
    clock.advance(1)  # unchanged for a whole lease duration on the standby's own clock
    assert await second._try_acquire_or_renew()
    spec = lease(kube)["spec"]
    assert spec["holderIdentity"] == second.identity
    assert spec["leaseTransitions"] == 1


async def test_a_renewing_leader_keeps_the_lease_from_a_standby() -> None:
    kube, clock = cluster(), FakeClock(0.0)
    first, second = elector(kube, clock), elector(kube, clock)
    assert await first._try_acquire_or_renew()
    first.leading.set()
    for _ in range(10):  # 2 s apart, as the campaign retries: 20 s, longer than a lease
        clock.advance(leader_module.RETRY_SECONDS)
        assert await first._try_acquire_or_renew()
        assert not await second._try_acquire_or_renew()
    assert lease(kube)["spec"]["holderIdentity"] == first.identity


async def test_a_leader_whose_lease_was_taken_reads_it_and_stands_down() -> None:
    kube, clock = cluster(), FakeClock(0.0)
    first, second = elector(kube, clock), elector(kube, clock)
    assert await first._try_acquire_or_renew()
    first.leading.set()
    clock.advance(LEASE_SECONDS)  # the first stalled; the second saw no change for a lease
    assert not await second._try_acquire_or_renew()
    clock.advance(LEASE_SECONDS + RETRY_SECONDS)  # after a first sight, a retry period more
    assert await second._try_acquire_or_renew()
    # The first's renewal of the Lease it last wrote is refused (409): it reads, sees another
    # holder whose Lease just changed, and does not take it back.
    assert not await first._try_acquire_or_renew()
    assert lease(kube)["spec"]["holderIdentity"] == second.identity


async def test_no_lease_request_is_retried_by_the_adapter() -> None:
    kube, clock = cluster(), FakeClock(0.0)
    first = elector(kube, clock)
    await first._wait_for_namespace()
    await first._try_acquire_or_renew()
    first.leading.set()
    await first._try_acquire_or_renew()
    asked = [(c.verb, c.args[1] if c.verb == "get" else "", c.kwargs) for c in kube.calls]
    assert asked == [
        ("get", "Namespace", {"retry": False}),
        ("get", "Lease", {"retry": False}),
        ("create", "", {"urgent": True, "retry": False}),
        ("replace", "", {"retry": False}),
    ]


class Partition:
    """The fake API server behind a link the test cuts: while cut, every request hangs (it
    neither fails nor answers), as behind a TCP relay that stopped forwarding."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.healed = asyncio.Event()
        self.healed.set()
        self.sent: list[tuple[float, str]] = []

    def __getattr__(self, verb: str) -> Any:
        call = getattr(self.kube, verb)

        async def hanging(*args: Any, **kwargs: Any) -> Any:
            self.sent.append((asyncio.get_running_loop().time(), verb))
            await self.healed.wait()
            return await call(*args, **kwargs)

        return hanging


async def until(condition: Any, step: float = 0.1, limit: float = 600) -> float:
    """Virtual seconds until ``condition()`` holds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not condition():
        assert loop.time() - start < limit, "never happened"
        await asyncio.sleep(step)
    return loop.time() - start


@virtual_time
async def test_standby_to_leading_with_no_lease_at_once_and_the_fence_opens() -> None:
    kube = cluster()
    first = elector(kube, name="first")
    assert first.write_deadline() is None
    assert not first.holds()
    task = asyncio.create_task(first.run())
    assert await until(first.leading.is_set, step=0.01) < 0.1
    now = asyncio.get_running_loop().time()
    assert first.holds()
    assert first.write_deadline() == pytest.approx(now + LEASE_SECONDS - MARGIN_SECONDS, abs=0.1)
    assert lease(kube)["spec"]["holderIdentity"] == "first"
    task.cancel()


@virtual_time
async def test_leading_renews_every_retry_period_and_a_standby_never_takes_over() -> None:
    kube = cluster()
    first, second = elector(kube, name="first"), elector(kube, name="second")
    tasks = [asyncio.create_task(first.run())]
    await until(first.leading.is_set)
    tasks.append(asyncio.create_task(second.run()))
    await asyncio.sleep(10 * LEASE_SECONDS)
    assert first.holds()
    assert not second.leading.is_set()
    renewals = [c for c in kube.calls if c.verb == "replace"]
    assert len(renewals) >= 10 * LEASE_SECONDS // RETRY_SECONDS - 1
    for task in tasks:
        task.cancel()


@virtual_time
async def test_a_standby_takes_over_a_lease_left_unrenewed_for_its_duration() -> None:
    kube = cluster()
    kube.add(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "lock", "namespace": "ops"},
            "spec": {"holderIdentity": "gone", "leaseDurationSeconds": LEASE_SECONDS},
        }
    )
    second = elector(kube, name="second")
    task = asyncio.create_task(second.run())
    took = await until(second.leading.is_set)
    # From a first sight: no telling when "gone" last renewed, so a retry period more.
    assert LEASE_SECONDS + RETRY_SECONDS <= took <= LEASE_SECONDS + 2 * RETRY_SECONDS + 0.2
    assert lease(kube)["spec"]["leaseTransitions"] == 1
    task.cancel()


async def test_a_warm_standby_takes_a_dead_leaders_lease_before_a_replica_started_after() -> None:
    """The leader renews for the last time and dies. The standby, polling every retry period,
    sees that renewal late (1.75 s); the replacement starts and looks sooner (0.25 s). Still
    the standby is the one to take the Lease, and the replacement does not take it first."""
    kube, clock = cluster(), FakeClock(0.0)
    leader, standby, fresh = elector(kube, clock), elector(kube, clock), elector(kube, clock)
    assert await leader._try_acquire_or_renew()
    leader.leading.set()
    assert not await standby._try_acquire_or_renew()  # the standby has watched for a while
    clock.advance(RETRY_SECONDS)
    assert await leader._try_acquire_or_renew()  # its last renewal, then it is killed
    clock.advance(0.25)  # the replacement starts and looks, before the standby's next poll
    assert not await fresh._try_acquire_or_renew()
    clock.advance(RETRY_SECONDS - 0.5)  # the standby sees the last renewal, a poll late
    assert not await standby._try_acquire_or_renew()
    clock.advance(LEASE_SECONDS - (RETRY_SECONDS - 0.5))  # a lease after the fresh one's look
    assert not await fresh._try_acquire_or_renew()
    clock.advance(RETRY_SECONDS - 0.5)  # a lease after the standby saw the last change
    assert await standby._try_acquire_or_renew()
    assert not await fresh._try_acquire_or_renew()  # it reads the standby's new Lease
    assert lease(kube)["spec"]["holderIdentity"] == standby.identity


@virtual_time
async def test_a_renewal_that_hangs_is_abandoned_and_the_lease_is_lost_at_the_renew_deadline() -> (
    None
):
    kube = cluster()
    link = Partition(kube)
    first = elector(link, name="first")
    task = asyncio.create_task(first.run())
    await until(first.leading.is_set)
    await asyncio.sleep(5)
    link.healed.clear()
    cut_at = asyncio.get_running_loop().time()
    last_ok = max(t for t, verb in link.sent if verb == "replace" and t < cut_at)
    why = await asyncio.wait_for(task, timeout=60)
    lost_at = asyncio.get_running_loop().time()
    assert "renew deadline" in why
    # Lost at the deadline of the last renewal that got through, not after the adapter's 60 s.
    assert lost_at - last_ok == pytest.approx(RENEW_DEADLINE_SECONDS, abs=0.2)
    assert not first.holds()
    assert first.write_deadline() is None
    tries = [t for t, verb in link.sent if t > cut_at]
    assert len(tries) >= RENEW_DEADLINE_SECONDS // REQUEST_TIMEOUT_SECONDS  # each abandoned
    # The fence closed before a standby could have taken the Lease (a lease after that send).
    assert lost_at < last_ok + LEASE_SECONDS - MARGIN_SECONDS


@virtual_time
async def test_a_renewal_refused_for_a_while_is_retried_within_the_deadline() -> None:
    kube = cluster()
    first = elector(kube, name="first")
    task = asyncio.create_task(first.run())
    await until(first.leading.is_set)
    unavailable = ApiError(503, "ServiceUnavailable", "etcd")
    kube.fail("replace", *[unavailable] * 3)  # 3 refusals, 2 s apart: 6 s < 10 s
    kube.fail("get", *[unavailable] * 3)
    await asyncio.sleep(30)
    assert first.holds()
    assert not task.done()
    task.cancel()


@virtual_time
async def test_a_leader_that_sees_another_holder_has_lost_at_once() -> None:
    """Frozen past its Lease (the other took it meanwhile), the leader's renewal is refused;
    it reads the Lease, sees another holder, and never takes it back."""
    kube = cluster()
    first = elector(kube, name="first")
    task = asyncio.create_task(first.run())
    await until(first.leading.is_set)
    stored = lease(kube)
    stored["spec"]["holderIdentity"] = "second"
    stored["metadata"]["resourceVersion"] = "999"  # the other's write
    why = await asyncio.wait_for(task, timeout=RETRY_SECONDS + 1)
    assert why == "the Lease is held by second"
    assert not first.holds()
    assert lease(kube)["spec"]["holderIdentity"] == "second"


@virtual_time
async def test_release_hands_the_lease_to_a_standby_at_its_next_retry() -> None:
    kube = cluster()
    first, second = elector(kube, name="first"), elector(kube, name="second")
    leading = asyncio.create_task(first.run())
    await until(first.leading.is_set)
    standby = asyncio.create_task(second.run())
    await asyncio.sleep(5)
    leading.cancel()
    await first.release()
    assert not first.holds()
    assert first.write_deadline() is None
    spec = lease(kube)["spec"]
    assert spec.get("holderIdentity") is None
    assert spec["leaseDurationSeconds"] == 1
    took = await until(second.leading.is_set)
    assert took <= RETRY_SECONDS + 0.2  # not a lease duration
    standby.cancel()


@virtual_time
async def test_a_standby_does_not_release_what_it_does_not_hold() -> None:
    kube = cluster()
    first, second = elector(kube, name="first"), elector(kube, name="second")
    task = asyncio.create_task(first.run())
    await until(first.leading.is_set)
    await second.release()
    assert lease(kube)["spec"]["holderIdentity"] == "first"
    task.cancel()

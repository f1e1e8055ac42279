"""Lease-based leader election on a clock of the test's own: who takes the Lease, when a
standby takes over, and that a renewal is never retried past its deadline."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.platform import leader as leader_module
from mpijob.platform.leader import LEASE_SECONDS, LeaderElector
from support.fake_kube import FakeKube
from support.virtual_time import FakeClock

pytestmark = pytest.mark.unit


def cluster() -> FakeKube:
    """Namespace ``ops`` and no Lease yet; a write on a stale ``resourceVersion`` is refused
    with 409, as the API server refuses it."""
    return FakeKube(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}}, versions=True
    )


def lease(kube: FakeKube) -> dict[str, Any]:
    return kube.stored("Lease", "ops")[0]


def elector(kube: FakeKube, clock: FakeClock) -> LeaderElector:
    return LeaderElector(namespace="ops", name="lock", kube=kube, clock=clock)


async def test_the_first_replica_creates_the_lease_and_a_second_waits_a_lease_duration() -> None:
    kube, clock = cluster(), FakeClock(0.0)
    first, second = elector(kube, clock), elector(kube, clock)
    assert await first._try_acquire_or_renew()
    assert lease(kube)["spec"]["holderIdentity"] == first.identity
    assert not await second._try_acquire_or_renew()  # held, and seen changing just now
    clock.now += LEASE_SECONDS - 1
    assert not await second._try_acquire_or_renew()
    clock.now += 1  # unchanged for a whole lease duration on the standby's own clock
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
        clock.now += leader_module.RETRY_SECONDS
        assert await first._try_acquire_or_renew()
        assert not await second._try_acquire_or_renew()
    assert lease(kube)["spec"]["holderIdentity"] == first.identity


async def test_a_leader_whose_lease_was_taken_reads_it_and_stands_down() -> None:
    kube, clock = cluster(), FakeClock(0.0)
    first, second = elector(kube, clock), elector(kube, clock)
    assert await first._try_acquire_or_renew()
    first.leading.set()
    clock.now += LEASE_SECONDS  # the first stalled; the second saw no change for a lease
    assert not await second._try_acquire_or_renew()
    clock.now += LEASE_SECONDS
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

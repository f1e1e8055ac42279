"""Lease-based leader election on a clock of the test's own: who takes the Lease, when a
standby takes over, and that a renewal is never retried past its deadline."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpijob.platform import leader as leader_module
from mpijob.platform.kube import ApiError
from mpijob.platform.leader import LEASE_SECONDS, LeaderElector

pytestmark = pytest.mark.unit


class Leases:
    """One namespace's Leases as the API server keeps them: a write on a stale
    ``resourceVersion`` is refused with 409."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[tuple[str, bool]] = []

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.stored[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    async def get(
        self, api_version: str, kind: str, ns: str | None, name: str, *, retry: bool = True
    ) -> dict[str, Any] | None:
        self.calls.append((f"get {kind}", retry))
        if kind == "Namespace":
            return {"metadata": {"name": name}}
        found = self.stored.get(name)
        return copy.deepcopy(found) if found else None

    async def create(self, obj: dict[str, Any], *, retry: bool = True) -> dict[str, Any]:
        self.calls.append(("create", retry))
        if obj["metadata"]["name"] in self.stored:
            raise ApiError(409, "AlreadyExists", "exists")
        return self._stamp(obj)

    async def replace(self, obj: dict[str, Any], *, retry: bool = True) -> dict[str, Any]:
        self.calls.append(("replace", retry))
        live = self.stored[obj["metadata"]["name"]]
        if obj["metadata"].get("resourceVersion") != live["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        return self._stamp(obj)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def elector(leases: Leases, clock: Clock) -> LeaderElector:
    return LeaderElector(namespace="ops", name="lock", kube=leases, clock=clock)  # type: ignore[arg-type]


async def test_the_first_replica_creates_the_lease_and_a_second_waits_a_lease_duration() -> None:
    leases, clock = Leases(), Clock()
    first, second = elector(leases, clock), elector(leases, clock)
    assert await first._try_acquire_or_renew()
    assert leases.stored["lock"]["spec"]["holderIdentity"] == first.identity
    assert not await second._try_acquire_or_renew()  # held, and seen changing just now
    clock.now += LEASE_SECONDS - 1
    assert not await second._try_acquire_or_renew()
    clock.now += 1  # unchanged for a whole lease duration on the standby's own clock
    assert await second._try_acquire_or_renew()
    spec = leases.stored["lock"]["spec"]
    assert spec["holderIdentity"] == second.identity
    assert spec["leaseTransitions"] == 1


async def test_a_renewing_leader_keeps_the_lease_from_a_standby() -> None:
    leases, clock = Leases(), Clock()
    first, second = elector(leases, clock), elector(leases, clock)
    assert await first._try_acquire_or_renew()
    first.leading.set()
    for _ in range(10):  # 2 s apart, as the campaign retries: 20 s, longer than a lease
        clock.now += leader_module.RETRY_SECONDS
        assert await first._try_acquire_or_renew()
        assert not await second._try_acquire_or_renew()
    assert leases.stored["lock"]["spec"]["holderIdentity"] == first.identity


async def test_a_leader_whose_lease_was_taken_reads_it_and_stands_down() -> None:
    leases, clock = Leases(), Clock()
    first, second = elector(leases, clock), elector(leases, clock)
    assert await first._try_acquire_or_renew()
    first.leading.set()
    clock.now += LEASE_SECONDS  # the first stalled; the second saw no change for a lease
    assert not await second._try_acquire_or_renew()
    clock.now += LEASE_SECONDS
    assert await second._try_acquire_or_renew()
    # The first's renewal of the Lease it last wrote is refused (409): it reads, sees another
    # holder whose Lease just changed, and does not take it back.
    assert not await first._try_acquire_or_renew()
    assert leases.stored["lock"]["spec"]["holderIdentity"] == second.identity


async def test_no_lease_request_is_retried_by_the_adapter() -> None:
    leases, clock = Leases(), Clock()
    first = elector(leases, clock)
    await first._wait_for_namespace()
    await first._try_acquire_or_renew()
    first.leading.set()
    await first._try_acquire_or_renew()
    assert leases.calls == [
        ("get Namespace", False),
        ("get Lease", False),
        ("create", False),
        ("replace", False),
    ]

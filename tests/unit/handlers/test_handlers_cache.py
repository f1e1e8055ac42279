"""The reconciler's memories that end with time, on a clock the test moves: an expectation of a
created child lasts ``EXPECTATION_SECONDS`` unless its event comes first, and a Secret's age is
counted from when it was last read or written."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mpijob.handlers.cache import EXPECTATION_SECONDS, Cache, Index, PodsBy
from support import jobs
from support.virtual_time import FakeClock

pytestmark = pytest.mark.unit

KEY = ("bar", "foo")
JOB = jobs.parsed(jobs.body("foo", "bar", workers=1, launcher={}))


def child(kind: str, name: str) -> dict[str, Any]:
    owner = {"controller": True, "uid": JOB.metadata.uid, "kind": "MPIJob", "name": "foo"}
    meta = {"name": name, "namespace": "bar", "ownerReferences": [owner]}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


def expected_pods(cache: Cache) -> list[str]:
    """The pods a sync sees now: the index's and those created but not yet seen."""
    return [p["metadata"]["name"] for p in cache.observe(KEY, JOB).pods]


def test_an_expectation_lasts_its_time_and_not_a_moment_more() -> None:
    clock = FakeClock()
    cache = Cache(clock=clock)
    cache.expect(KEY, child("Pod", "foo-worker-0"))
    clock.advance(EXPECTATION_SECONDS)
    assert expected_pods(cache) == ["foo-worker-0"]  # its event may still come
    clock.advance(0.001)
    assert expected_pods(cache) == []  # it never came: the index is the truth again
    assert cache.expected == {}


def test_an_expectation_ends_with_the_childs_event_or_its_sight_in_the_index() -> None:
    clock = FakeClock()
    cache = Cache(clock=clock)
    cache.expect(KEY, child("Pod", "foo-worker-0"))
    cache.expect(KEY, child("Service", "foo"))
    cache.seen(KEY, "Service", "foo")
    pod = child("Pod", "foo-worker-0")
    cache.indices = {Index.PODS: {(PodsBy.JOB, *KEY): [pod]}}
    assert expected_pods(cache) == ["foo-worker-0"]  # once, from the index
    assert cache.expected == {}


def test_each_expectation_is_timed_from_its_own_creation() -> None:
    clock = FakeClock()
    cache = Cache(clock=clock)
    cache.expect(KEY, child("Pod", "foo-worker-0"))
    clock.advance(EXPECTATION_SECONDS / 2)
    cache.expect(KEY, child("Pod", "foo-worker-1"))
    clock.advance(EXPECTATION_SECONDS / 2 + 1)
    assert expected_pods(cache) == ["foo-worker-1"]
    clock.advance(EXPECTATION_SECONDS / 2)
    assert expected_pods(cache) == []


def test_a_secrets_age_counts_from_its_last_read_or_write() -> None:
    clock = FakeClock()
    cache = Cache(clock=clock)
    assert math.isinf(cache.secret_age(KEY))  # never read nor written
    cache.saw_secret(KEY, None)  # read: there is none
    clock.advance(7)
    assert cache.secret_age(KEY) == 7
    cache.saw_secret(KEY, child("Secret", "foo-ssh"))
    assert cache.secret_age(KEY) == 0
    clock.advance(2.5)
    assert cache.secret_age(KEY) == 2.5
    cache.forget(KEY)
    assert math.isinf(cache.secret_age(KEY))

"""The test kit itself: the in-memory API answers as the API server would, and virtual time
moves only the event loop's clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from mpijob.platform.kube import ApiError, Conflict, Invalid
from support import audit, jobs
from support.fake_kube import FakeKube
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit


def config_map(name: str, **labels: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "data": {"a": "1", "b": "2"},
    }


async def test_a_name_is_created_once_and_read_back_as_made() -> None:
    kube = FakeKube()
    made = await kube.create(config_map("c"))
    assert made["metadata"]["resourceVersion"] == "1"
    assert await kube.get("v1", "ConfigMap", "ns", "c") == made
    with pytest.raises(ApiError) as refused:
        await kube.create(config_map("c"))
    assert refused.value.conflict
    assert await kube.get("v1", "ConfigMap", "other", "c") is None
    assert kube.created() == ["ConfigMap/c", "ConfigMap/c"]
    assert [c.ok for c in kube.calls] == [True, True, False, True]


async def test_a_patch_merges_and_a_write_to_a_missing_object_is_a_404() -> None:
    kube = FakeKube(config_map("c"))
    patched = await kube.patch("v1", "ConfigMap", "ns", "c", {"data": {"a": None, "c": "3"}})
    assert patched["data"] == {"b": "2", "c": "3"}
    assert patched["metadata"]["resourceVersion"] == "2"
    with pytest.raises(ApiError) as missing:
        await kube.patch("v1", "ConfigMap", "ns", "gone", {"data": {}})
    assert missing.value.not_found
    with pytest.raises(ApiError):
        await kube.replace_status(jobs.body("absent"))


async def test_a_delete_names_its_uid_and_a_list_its_labels() -> None:
    kube = FakeKube(
        {**config_map("a", role="x"), "metadata": {"name": "a", "namespace": "ns", "uid": "u"}},
        config_map("b", role="y"),
    )
    assert [o["metadata"]["name"] for o in await kube.list("v1", "ConfigMap", None)] == ["a", "b"]
    assert [
        o["metadata"]["name"] for o in await kube.list("v1", "ConfigMap", "ns", labels="role=y")
    ] == ["b"]
    assert not await kube.delete("v1", "ConfigMap", "ns", "a", uid="someone-else")
    assert await kube.delete("v1", "ConfigMap", "ns", "a", uid="u")
    assert not await kube.delete("v1", "ConfigMap", "ns", "a")


async def test_a_json_patch_applies_whole_or_not_at_all_and_an_apply_creates_or_merges() -> None:
    kube = FakeKube(config_map("c"))
    ops = [{"op": "test", "path": "/data/a", "value": "1"}, {"op": "remove", "path": "/data/a"}]
    assert (await kube.json_patch("v1", "ConfigMap", "ns", "c", ops))["data"] == {"b": "2"}
    with pytest.raises(Invalid):  # the test operation fails now: nothing is removed
        await kube.json_patch(
            "v1", "ConfigMap", "ns", "c", [*ops[:1], {"op": "remove", "path": "/data/b"}]
        )
    assert kube.stored("ConfigMap")[0]["data"] == {"b": "2"}
    made = await kube.apply(config_map("d"))
    assert made["metadata"]["resourceVersion"] == "1"
    merged = await kube.apply({**config_map("d"), "data": {"c": "3"}})
    assert merged["data"] == {"a": "1", "b": "2", "c": "3"}
    assert merged["metadata"]["resourceVersion"] == "2"


async def test_discovery_answers_what_is_served() -> None:
    kube = FakeKube()
    kube.served["/version"] = {"major": "1", "minor": "34"}
    kube.served["/apis/resource.k8s.io/v1"] = {"kind": "APIResourceList"}
    assert (await kube.version())["minor"] == "34"
    assert await kube.resources("resource.k8s.io/v1") == {"kind": "APIResourceList"}
    assert await kube.resources("resource.k8s.io/v1beta1") is None


async def test_with_versions_a_replace_on_a_stale_version_is_a_conflict() -> None:
    loose, strict = FakeKube(config_map("c")), FakeKube(config_map("c"), versions=True)
    read = {**config_map("c"), "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "1"}}
    for kube in (loose, strict):
        await kube.replace({**read, "data": {"first": "1"}})  # now at version 2
    with pytest.raises(Conflict):
        await strict.replace({**read, "data": {"second": "2"}})
    assert (await loose.replace({**read, "data": {"second": "2"}}))["data"] == {"second": "2"}


async def test_scripted_failures_come_in_order_then_the_answers() -> None:
    kube = FakeKube(config_map("c"))
    kube.fail("get", ApiError(503, "ServiceUnavailable", "down"))
    with pytest.raises(ApiError):
        await kube.get("v1", "ConfigMap", "ns", "c")
    assert await kube.get("v1", "ConfigMap", "ns", "c") is not None


@virtual_time
async def test_virtual_time_moves_the_loops_clock_and_not_the_wall_clock() -> None:
    loop = asyncio.get_running_loop()
    wall = time.monotonic()
    await asyncio.sleep(3600)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.Event().wait(), 60)
    assert loop.time() == pytest.approx(3660)
    assert time.monotonic() - wall < 60


@virtual_time
async def test_calls_with_latency_overlap_on_virtual_time() -> None:
    kube = FakeKube(config_map("c"), latency=1.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*(kube.get("v1", "ConfigMap", "ns", "c") for _ in range(3)))
    assert loop.time() - start == pytest.approx(1.0)
    assert kube.most_in_flight == 3


def _audit(verb: str, agent: str, resource: str, namespace: str | None, at: str) -> dict:
    ref = {"resource": resource, "name": "x", **({"namespace": namespace} if namespace else {})}
    stamp = f"2026-11-27T10:00:{at}Z"
    return {
        "verb": verb,
        "userAgent": f"mpijob-operator/{agent}",
        "objectRef": ref,
        "requestReceivedTimestamp": stamp,
        "stageTimestamp": stamp,
        "responseStatus": {"code": 200},
    }


def test_the_lease_audit_checks_this_namespace_and_its_replicas_not_other_tests() -> None:
    found = [
        _audit("update", "a", "leases", "mine", "00"),  # a holds from 0 s
        _audit("get", "b", "leases", "mine", "01"),  # b, the standby, reads the Lease here
        _audit("create", "a", "pods", "mine", "02"),  # the holder: fine
        _audit("create", "b", "pods", "mine", "03"),  # not the holder: flagged
        _audit("patch", "b", "nodes", None, "04"),  # cluster-scoped, by a replica here: flagged
        _audit("create", "c", "pods", "theirs", "05"),  # another test's operator: not ours
        _audit("patch", "c", "nodes", None, "06"),  # ... cluster-scoped: not ours either
    ]
    bad, checked = audit.writes_outside_terms(found, "mine")
    assert checked == 3
    assert [line.split(" at ")[0] for line in bad] == [
        "create pods/x by mpijob-operator/b",
        "patch nodes/x by mpijob-operator/b",
    ]

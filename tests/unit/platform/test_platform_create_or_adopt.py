"""The one create-or-adopt (``mpijob.platform.kube.create_or_adopt``): a taken name is adopted
only when its holder is the caller's, someone else's is never touched, a holder deleted meanwhile
leaves the 409 to retry, and a name unique to one create takes a 409 as made, unread."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.objects import JSON
from mpijob.platform.kube import ApiError, Conflict, Made, NameTaken, create_or_adopt
from support.fake_kube import FakeKube

pytestmark = pytest.mark.unit


def config_map(owner: str, data: str = "new") -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "ns", "labels": {"owner": owner}},
        "data": {"v": data},
    }


def owned_by(owner: str) -> Any:
    return lambda live: live["metadata"]["labels"].get("owner") == owner


def verbs(kube: FakeKube) -> list[str]:
    return [verb for verb, _ in kube.requests]


async def test_a_free_name_is_created() -> None:
    kube = FakeKube()
    made = await create_or_adopt(kube.create, config_map("me"), read=kube.get, ours=owned_by("me"))
    assert not made.adopted
    assert made.obj["metadata"]["resourceVersion"] == "1"  # what the API returned
    assert verbs(kube) == ["create"]


async def test_a_name_held_by_the_callers_own_object_is_adopted_as_it_is() -> None:
    kube = FakeKube(config_map("me", data="old"))
    made = await create_or_adopt(kube.create, config_map("me"), read=kube.get, ours=owned_by("me"))
    assert made == Made(kube.stored("ConfigMap", "ns")[0], adopted=True)
    assert made.obj["data"] == {"v": "old"}, "adopted, not overwritten"
    assert verbs(kube) == ["create", "get"]


async def test_a_name_held_by_someone_elses_object_is_refused_and_left_alone() -> None:
    theirs = config_map("them", data="theirs")
    kube = FakeKube(theirs)
    with pytest.raises(NameTaken) as taken:
        await create_or_adopt(kube.create, config_map("me"), read=kube.get, ours=owned_by("me"))
    assert taken.value.existing["data"] == {"v": "theirs"}
    assert taken.value.obj["data"] == {"v": "new"}
    assert verbs(kube) == ["create", "get"]
    assert kube.stored("ConfigMap", "ns")[0]["data"] == {"v": "theirs"}


async def test_a_holder_deleted_between_the_create_and_the_read_leaves_the_409() -> None:
    kube = FakeKube()
    kube.fail("create", ApiError(409, "AlreadyExists", "configmaps c already exists"))
    with pytest.raises(Conflict):
        await create_or_adopt(kube.create, config_map("me"), read=kube.get, ours=owned_by("me"))
    assert verbs(kube) == ["create", "get"]
    assert kube.stored("ConfigMap") == []


async def test_any_other_refusal_is_raised_as_it_came_and_nothing_is_read() -> None:
    kube = FakeKube()
    kube.fail("create", ApiError(422, "Invalid", "bad"))
    with pytest.raises(ApiError) as refused:
        await create_or_adopt(kube.create, config_map("me"), read=kube.get, ours=owned_by("me"))
    assert refused.value.status == 422
    assert verbs(kube) == ["create"]


async def test_a_unique_name_taken_is_an_earlier_try_of_the_same_create_counted_as_made() -> None:
    kube = FakeKube()
    kube.fail("create", ApiError(409, "AlreadyExists", "events e.1a2b already exists"))
    obj = config_map("me")
    made = await create_or_adopt(kube.create, obj, ours=None)
    assert made == Made(obj, adopted=True)
    assert verbs(kube) == ["create"], "nothing read"


async def test_whose_object_it_is_cannot_be_asked_without_reading_it() -> None:
    kube = FakeKube(config_map("me"))
    with pytest.raises(TypeError):
        await create_or_adopt(kube.create, config_map("me"), ours=owned_by("me"))

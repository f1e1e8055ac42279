"""Kopf's relist after a broken watch deletes what it no longer finds, as an informer does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kopf._cogs.clients import watching

from mpijob.platform import kopf_tuning

pytestmark = pytest.mark.unit

LISTED = watching.Bookmark.LISTED


def obj(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mpijob.io/v1alpha1",
        "kind": "PlacementDecision",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {"a": "b"}},
        "spec": spec,
    }


def event(kind: str | None, name: str, **spec: Any) -> dict[str, Any]:
    return {"type": kind, "object": obj(name, **spec)}


async def streamed(items: list[Any], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    async def kopfs(**_: Any) -> AsyncIterator[Any]:
        for item in items:
            yield item

    monkeypatch.setattr(watching, "infinite_watch", kopfs)
    kopf_tuning.relists_delete_what_is_gone()
    return [item async for item in watching.infinite_watch()]


def names(items: list[Any]) -> list[tuple[str | None, str] | str]:
    return [
        "LISTED" if i is LISTED else (i["type"], i["object"]["metadata"]["name"]) for i in items
    ]


async def test_a_relist_deletes_the_objects_it_no_longer_holds_before_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = await streamed(
        [
            event(None, "a"),
            event(None, "b", job="j"),
            event(None, "c"),
            LISTED,
            event("MODIFIED", "a"),
            event("DELETED", "c"),
            # The watch broke: Kopf lists again, and "b" was deleted meanwhile.
            event(None, "a"),
            LISTED,
            event("ADDED", "d"),
        ],
        monkeypatch,
    )
    assert names(out) == [
        (None, "a"), (None, "b"), (None, "c"), "LISTED",
        ("MODIFIED", "a"), ("DELETED", "c"),
        (None, "a"), ("DELETED", "b"), "LISTED",
        ("ADDED", "d"),
    ]  # fmt: skip
    gone = out[7]["object"]
    # Its identity, and nothing else it held (its spec, a label not the operator's).
    assert gone == {
        "apiVersion": "mpijob.io/v1alpha1",
        "kind": "PlacementDecision",
        "metadata": {"name": "b", "namespace": "ns", "uid": "uid-b"},
    }


async def test_the_first_list_deletes_nothing_and_an_object_added_while_watching_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = await streamed(
        [
            event(None, "a"),
            LISTED,
            event("ADDED", "b"),
            event(None, "a"),  # relisted: "b", added while watching, is gone
            LISTED,
            event(None, "a"),  # relisted again: nothing more is gone
            LISTED,
        ],
        monkeypatch,
    )
    assert names(out) == [
        (None, "a"), "LISTED", ("ADDED", "b"),
        (None, "a"), ("DELETED", "b"), "LISTED",
        (None, "a"), "LISTED",
    ]  # fmt: skip


async def test_what_is_kept_of_a_tenants_object_is_bounded_whatever_it_carries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's pod with many labels, annotations and owners, and a large spec: what is
    kept for its deletion is its identity, the operator's own keys and its node alone."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "uid-p",
            "labels": {
                **{f"l{i}": "x" * 60 for i in range(200)},
                "training.kubeflow.org/job-name": "pi",
            },
            "annotations": {
                **{f"mpijob.io/made-up-{i}": "y" * 1000 for i in range(200)},
                "mpijob.io/gpu-share": "2",
                "mpijob.io/gpu-ids": "z" * 5000,
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "X", "name": f"o{i}", "uid": f"u{i}"}
                for i in range(50)
            ]
            + [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "pi", "uid": "j",
                "controller": True, "blockOwnerDeletion": True, "extra": "e" * 4000}],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "env": [{"value": "v" * 100_000}]}],
        },
    }  # fmt: skip
    relisted = [{"type": None, "object": pod}, LISTED, LISTED]
    out = await streamed(relisted, monkeypatch)
    gone = out[2]["object"]
    assert gone == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "uid-p",
            "labels": {"training.kubeflow.org/job-name": "pi"},
            "annotations": {"mpijob.io/gpu-share": "2"},
            "ownerReferences": [
                {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": "pi",
                 "uid": "j", "controller": True}
            ],
        },
        "spec": {"nodeName": "n1"},
    }  # fmt: skip


async def test_kopf_is_patched_once(monkeypatch: pytest.MonkeyPatch) -> None:
    await streamed([], monkeypatch)
    wrapped = watching.infinite_watch
    kopf_tuning.relists_delete_what_is_gone()
    assert watching.infinite_watch is wrapped

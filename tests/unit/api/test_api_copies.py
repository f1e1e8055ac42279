"""Copies the reconcile makes on every sync: JSON data through :func:`mpijob.objects.clone`, job
statuses through their own ``__deepcopy__``. Each must be a deep copy, exact, whatever it holds."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob.api.models import MPIJobStatus
from mpijob.objects import clone

pytestmark = pytest.mark.unit

TEMPLATE = {
    "metadata": {"labels": {"app": "pi"}, "annotations": {}},
    "spec": {
        "containers": [{"name": "w", "args": ["-n", "8"], "resources": {"limits": {"x": 1.5}}}],
        "tolerations": [{"key": "k", "operator": "Exists", "value": None}],
        "hostNetwork": False,
    },
}


def test_clone_is_an_equal_copy_that_shares_nothing() -> None:
    copied = clone(TEMPLATE)
    assert copied == TEMPLATE
    copied["spec"]["containers"][0]["args"].append("x")
    copied["metadata"]["labels"]["app"] = "changed"
    assert TEMPLATE["spec"]["containers"][0]["args"] == ["-n", "8"]
    assert TEMPLATE["metadata"]["labels"] == {"app": "pi"}
    assert isinstance(copied["spec"]["containers"][0]["resources"]["limits"]["x"], float)


@pytest.mark.parametrize(
    "odd",
    [
        2**70,  # beyond 64 bits: the standard library decodes it, orjson will not write it
        json.loads('"\\ud800"'),  # a lone surrogate, as the standard library decodes it
        datetime(2026, 11, 27, tzinfo=UTC),  # not JSON: kept a datetime, not made a string
        {1: "a non-string key"},
    ],
)
def test_clone_copies_exactly_what_orjson_would_not_write(odd: Any) -> None:
    body = {"spec": {"template": {"metadata": {"annotations": {"odd": odd}}}}}
    copied = clone(body)
    assert copied == body
    kept = copied["spec"]["template"]["metadata"]["annotations"]["odd"]
    assert type(kept) is type(odd)
    assert copied["spec"] is not body["spec"]


def test_clone_keeps_dataclasses_as_they_are() -> None:
    @dataclass
    class Point:
        x: list[int]

    point = Point([1])
    copied = clone({"p": point})
    assert copied == {"p": point}  # still a Point, not a dict
    assert copied["p"] is not point


def status(**replica: Any) -> MPIJobStatus:
    return MPIJobStatus.model_validate(
        {
            "conditions": [
                {"type": "Created", "status": "True", "reason": "MPIJobCreated", "message": "m"},
                {"type": "Running", "status": "True", "lastTransitionTime": "2026-11-27T10:00:00Z"},
            ],
            "replicaStatuses": {"Worker": {"active": 2, **replica}, "Launcher": {"active": 1}},
            "startTime": "2026-11-27T10:00:00Z",
        }
    )


@pytest.mark.parametrize(
    "original",
    [
        status(),
        status(labelSelector={"matchLabels": {"a": "b"}}),  # a dict inside: the generic copy
        MPIJobStatus.model_validate({"newerField": {"nested": [1]}, "conditions": []}),
    ],
    ids=["flat", "label-selector", "unknown-field"],
)
def test_a_status_copy_is_deep_and_keeps_what_was_set(original: MPIJobStatus) -> None:
    before = original.model_dump(by_alias=True)
    for copied in (original.model_copy(deep=True), copy.deepcopy(original)):
        assert copied == original
        assert copied.model_fields_set == original.model_fields_set
        for c in copied.conditions:
            c.reason = "Changed"
        for r in copied.replica_statuses.values():
            r.active = 99
            if r.label_selector is not None:
                r.label_selector["matchLabels"]["a"] = "changed"
        if copied.model_extra:
            copied.model_extra["newerField"]["nested"].append(2)
        copied.conditions.clear()
        assert original.model_dump(by_alias=True) == before

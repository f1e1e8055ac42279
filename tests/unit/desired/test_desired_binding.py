"""Time from job creation until every pod of the gang is bound."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob.desired import binding

pytestmark = pytest.mark.unit

CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def pod(bound: str | None) -> dict[str, Any]:
    if bound is None:
        return {"spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}}
    return {
        "spec": {"nodeName": "node-1"},
        "status": {
            "conditions": [
                {
                    "type": "Initialized",
                    "status": "True",
                    "lastTransitionTime": "2026-01-01T09:00:00Z",
                },
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": bound},
            ]
        },
    }


def test_seconds_until_the_last_pod_was_bound() -> None:
    pods = [pod("2026-01-01T00:00:05Z"), pod("2026-01-01T00:01:00Z"), pod("2026-01-01T00:00:30Z")]
    assert binding.seconds_to_bind(CREATED, pods, expected=3) == 60.0


def test_nothing_while_a_pod_is_unbound_or_missing() -> None:
    bound = pod("2026-01-01T00:00:05Z")
    assert binding.seconds_to_bind(CREATED, [bound, pod(None)], expected=2) is None
    assert binding.seconds_to_bind(CREATED, [bound], expected=2) is None
    assert binding.seconds_to_bind(CREATED, [], expected=0) is None


def test_a_pod_without_a_binding_time_is_not_counted_as_bound() -> None:
    assert binding.bound_at({"spec": {"nodeName": "n"}, "status": {}}) is None

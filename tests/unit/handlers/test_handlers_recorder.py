"""Event posting: repeats of one event count up a single Event object, as client-go does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mpijob.desired.events import normal
from mpijob.handlers.recorder import Recorder

pytestmark = pytest.mark.unit

JOB = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "pi", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
}


class SlowEvents:
    """An API whose creates take a moment, so repeats arrive while the first is in flight."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.counts: list[int] = []

    async def create(self, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        self.created.append(obj)
        return obj

    async def patch(self, *args: Any, **_: Any) -> dict[str, Any]:
        self.counts.append(args[-1]["count"])
        return {}


RUNNING = normal("MPIJobRunning", "MPIJob ns/pi is running")


async def post_running(times: int) -> tuple[SlowEvents, Recorder]:
    """The same Running Event posted ``times`` times in a burst, then drained."""
    api = SlowEvents()
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    for _ in range(times):
        recorder.post(JOB, RUNNING)
    await recorder.drain()
    return api, recorder


async def test_a_burst_of_repeats_creates_one_event_and_counts_up() -> None:
    api, _ = await post_running(5)
    assert len(api.created) == 1
    event = api.created[0]
    assert (event["reason"], event["source"], event["involvedObject"]["uid"]) == (
        "MPIJobRunning",
        {"component": "mpi-job-controller"},
        "u1",
    )
    # The four repeats arrived while the create was in flight: one count update carries them.
    assert api.counts == [5]


async def test_repeats_after_the_update_count_up_again() -> None:
    api, recorder = await post_running(2)
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert len(api.created) == 1
    assert api.counts == [2, 3]


async def test_different_events_are_different_objects() -> None:
    api = SlowEvents()
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    recorder.post(JOB, normal("MPIJobCreated", "MPIJob ns/pi is created."))
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert sorted(e["reason"] for e in api.created) == ["MPIJobCreated", "MPIJobRunning"]
    assert api.counts == []

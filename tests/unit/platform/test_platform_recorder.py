"""Event posting: repeats of one event count up a single Event object, as client-go does."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob.desired.events import Event, Implied, normal
from mpijob.platform import recorder as recorder_module
from mpijob.platform.kube import ApiError
from mpijob.platform.recorder import Recorder

pytestmark = pytest.mark.unit

JOB = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "pi", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
}


class SlowEvents:
    """An API whose creates take a moment, so repeats arrive while the first is in flight."""

    def __init__(self, *, refuse: int = 0) -> None:
        self.created: list[dict[str, Any]] = []
        self.counts: list[int] = []
        self.in_flight = self.most_in_flight = 0
        self.refuse = refuse

    async def create(self, obj: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            if self.refuse:
                self.refuse -= 1
                raise ApiError(403, "Forbidden", "events is forbidden")
            self.created.append(obj)
            return obj
        finally:
            self.in_flight -= 1

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


async def test_one_request_at_a_time_in_the_order_posted() -> None:
    api = SlowEvents()
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    reasons = [f"Reason{i}" for i in range(5)]
    for reason in reasons:
        recorder.post(JOB, normal(reason, "m"))
    await recorder.drain()
    assert [e["reason"] for e in api.created] == reasons
    assert api.most_in_flight == 1


async def test_an_event_that_could_not_be_created_is_created_anew_by_its_next_repeat() -> None:
    api = SlowEvents(refuse=1)
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert api.created == []
    recorder.post(JOB, RUNNING)
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert len(api.created) == 1
    assert api.counts == [2]


# --- at least once: through an outage, and across a restart -----------------------------------


class FlakyEvents(SlowEvents):
    """An API that does not answer the first ``down`` requests, and lists ``stored`` Events."""

    def __init__(self, *, down: int = 0, stored: list[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.down = down
        self.stored = stored or []
        self.lists: list[tuple[Any, ...]] = []

    async def create(self, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        if self.down:
            self.down -= 1
            raise ApiError(503, "ServiceUnavailable", "the API server is restarting")
        return await super().create(obj, **kw)

    async def list(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        self.lists.append((*args, kw.get("fields")))
        return self.stored


async def test_an_event_the_api_did_not_answer_is_sent_again_until_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recorder_module, "RETRY_FIRST_SECONDS", 0.001)
    api = FlakyEvents(down=3)
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    recorder.post(JOB, CREATED)
    await recorder.drain()
    assert [e["reason"] for e in api.created] == ["MPIJobCreated"]


async def test_a_refused_event_is_not_retried() -> None:
    api = SlowEvents(refuse=1)
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    recorder.post(JOB, CREATED)
    await recorder.drain()
    assert api.created == []
    assert api.refuse == 0


NOW = datetime.now(UTC)
CREATED = normal("MPIJobCreated", "MPIJob ns/pi is created.")


def stored(event: Event, count: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "pi.0123", "namespace": "ns"},
        "involvedObject": {"uid": "u1", "kind": "MPIJob"},
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "count": count,
    }


async def test_after_a_restart_the_events_the_api_lacks_are_posted_once() -> None:
    succeeded = normal("MPIJobSucceeded", "MPIJob ns/pi successfully completed.")
    old = normal("GangAdmitted", "MPIJob ns/pi is admitted.")
    api = FlakyEvents(stored=[stored(CREATED)])
    recorder = Recorder(api, instance="test", namespaces=["ns"])  # type: ignore[arg-type]
    implied = [
        Implied(CREATED, NOW),  # the API has it
        Implied(succeeded, NOW - timedelta(seconds=5)),  # lost to a kill
        Implied(old, NOW - timedelta(hours=2)),  # may have expired: says nothing
    ]
    recorder.ensure(JOB, lambda: implied)
    recorder.ensure(JOB, lambda: implied)  # once per job and process
    await recorder.drain()
    assert [(e["reason"], e["firstTimestamp"]) for e in api.created] == [
        ("MPIJobSucceeded", (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    ]
    assert api.lists == [
        ("v1", "Event", "ns", "source=mpi-job-controller,involvedObject.kind=MPIJob")
    ]


async def test_a_repeat_after_a_restart_counts_up_the_event_the_last_process_made() -> None:
    api = FlakyEvents(stored=[stored(RUNNING, count=4)])
    recorder = Recorder(api, instance="test")  # type: ignore[arg-type]
    recorder.ensure(JOB, lambda: [Implied(RUNNING, NOW)])
    await recorder.drain()
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert api.created == []
    assert api.counts == [5]
    assert api.lists == [
        ("v1", "Event", None, "source=mpi-job-controller,involvedObject.kind=MPIJob")
    ]

"""Event posting: repeats of one event count up a single Event object, as client-go does."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpijob.desired.events import Event, Implied, normal
from mpijob.platform.kube import ApiError
from mpijob.platform.recorder import (
    EVENT_TTL_SECONDS,
    MAX_TRACKED,
    MAX_WAITING,
    MESSAGE_LIMIT,
    REASON_LIMIT,
    Recorder,
)
from support.fake_kube import FakeKube
from support.virtual_time import FakeClock, virtual_time

pytestmark = pytest.mark.unit

JOB = {
    "apiVersion": "kubeflow.org/v2beta1",
    "kind": "MPIJob",
    "metadata": {"name": "pi", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
}


def slow_api(*stored: dict[str, Any]) -> FakeKube:
    """An API whose calls take 50 ms, so repeats arrive while the first create is in flight;
    holding ``stored`` Events."""
    return FakeKube(*({"apiVersion": "v1", "kind": "Event", **e} for e in stored), latency=0.05)


def created(api: FakeKube) -> list[dict[str, Any]]:
    """The Events the API made, in order."""
    return [c.args[0] for c in api.done("create")]


def counts(api: FakeKube) -> list[int]:
    """The counts of the Events' count updates, in order."""
    return [c.args[-1]["count"] for c in api.calls if c.verb == "patch"]


def lists(api: FakeKube) -> list[tuple[Any, ...]]:
    """Each list of Events: its apiVersion, kind, namespace and field selector."""
    return [(*c.args, c.kwargs["fields"]) for c in api.calls if c.verb == "list"]


def refuse(api: FakeKube) -> None:
    api.fail("create", ApiError(403, "Forbidden", "events is forbidden"))


RUNNING = normal("MPIJobRunning", "MPIJob ns/pi is running")


async def post_running(times: int) -> tuple[FakeKube, Recorder]:
    """The same Running Event posted ``times`` times in a burst, then drained."""
    api = slow_api()
    recorder = Recorder(api, instance="test")
    for _ in range(times):
        recorder.post(JOB, RUNNING)
    await recorder.drain()
    return api, recorder


@virtual_time
async def test_a_burst_of_repeats_creates_one_event_and_counts_up() -> None:
    api, _ = await post_running(5)
    assert len(created(api)) == 1
    event = created(api)[0]
    assert (event["reason"], event["source"], event["involvedObject"]["uid"]) == (
        "MPIJobRunning",
        {"component": "mpi-job-controller"},
        "u1",
    )
    # The four repeats arrived while the create was in flight: one count update carries them.
    assert counts(api) == [5]


@virtual_time
async def test_repeats_after_the_update_count_up_again() -> None:
    api, recorder = await post_running(2)
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert len(created(api)) == 1
    assert counts(api) == [2, 3]


@virtual_time
async def test_different_events_are_different_objects() -> None:
    api = slow_api()
    recorder = Recorder(api, instance="test")
    recorder.post(JOB, normal("MPIJobCreated", "MPIJob ns/pi is created."))
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert sorted(e["reason"] for e in created(api)) == ["MPIJobCreated", "MPIJobRunning"]
    assert counts(api) == []


@virtual_time
async def test_one_request_at_a_time_in_the_order_posted() -> None:
    api = slow_api()
    recorder = Recorder(api, instance="test")
    reasons = [f"Reason{i}" for i in range(5)]
    for reason in reasons:
        recorder.post(JOB, normal(reason, "m"))
    await recorder.drain()
    assert [e["reason"] for e in created(api)] == reasons
    assert api.most_in_flight == 1


@virtual_time
async def test_an_event_that_could_not_be_created_is_created_anew_by_its_next_repeat() -> None:
    api = slow_api()
    refuse(api)
    recorder = Recorder(api, instance="test")
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert created(api) == []
    recorder.post(JOB, RUNNING)
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert len(created(api)) == 1
    assert counts(api) == [2]


# --- at least once: through an outage, and across a restart -----------------------------------


@virtual_time
async def test_an_event_the_api_did_not_answer_is_sent_again_until_it_is() -> None:
    api = slow_api()
    api.fail("create", *[ApiError(503, "ServiceUnavailable", "restarting")] * 3)
    recorder = Recorder(api, instance="test")
    recorder.post(JOB, CREATED)
    await recorder.drain()
    assert [e["reason"] for e in created(api)] == ["MPIJobCreated"]
    assert len(api.calls) == 4  # three unanswered, then made


@virtual_time
async def test_a_refused_event_is_not_retried() -> None:
    api = slow_api()
    refuse(api)
    recorder = Recorder(api, instance="test")
    recorder.post(JOB, CREATED)
    await recorder.drain()
    assert created(api) == []
    refused = [(c.verb, getattr(c.error, "status", None)) for c in api.calls]
    assert refused == [("create", 403)]  # one try, refused


@virtual_time
async def test_a_refused_event_is_logged_with_its_object_and_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = slow_api()
    refuse(api)
    recorder = Recorder(api, instance="test")
    with caplog.at_level(logging.WARNING, "mpijob.platform.recorder"):
        recorder.post(JOB, CREATED)
        await recorder.drain()
    (record,) = [r for r in caplog.records if r.getMessage() == "Failed to post event"]
    assert record.k8s_ref == {"kind": "MPIJob", "namespace": "ns", "name": "pi"}  # type: ignore[attr-defined]
    assert "403" in record.error  # type: ignore[attr-defined]


NOW = datetime.now(UTC)
CREATED = normal("MPIJobCreated", "MPIJob ns/pi is created.")


def stored(
    event: Event,
    count: int = 1,
    *,
    namespace: str = "ns",
    name: str = "pi.0123",
    about: dict[str, Any] | None = None,
    last: str = "2024-05-01T10:00:00Z",
) -> dict[str, Any]:
    """An Event the API holds, as this recorder writes one about ``about`` (JOB's object
    reference by default) in ``namespace``."""
    return {
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": about
        or {"apiVersion": JOB["apiVersion"], "kind": "MPIJob", "namespace": "ns", "uid": "u1"},
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "count": count,
        "source": {"component": "mpi-job-controller"},
        "lastTimestamp": last,
    }


@virtual_time
async def test_after_a_restart_the_events_the_api_lacks_are_posted_once() -> None:
    succeeded = normal("MPIJobSucceeded", "MPIJob ns/pi successfully completed.")
    old = normal("GangAdmitted", "MPIJob ns/pi is admitted.")
    api = slow_api(stored(CREATED))
    recorder = Recorder(api, instance="test", namespaces=["ns"])
    implied = [
        Implied(CREATED, NOW),  # the API has it
        Implied(succeeded, NOW - timedelta(seconds=5)),  # lost to a kill
        Implied(old, NOW - timedelta(hours=2)),  # may have expired: says nothing
    ]
    recorder.ensure(JOB, lambda: implied)
    recorder.ensure(JOB, lambda: implied)  # once per job and process
    await recorder.drain()
    assert [(e["reason"], e["firstTimestamp"]) for e in created(api)] == [
        ("MPIJobSucceeded", (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    ]
    assert lists(api) == [
        ("v1", "Event", "ns", "source=mpi-job-controller,involvedObject.kind=MPIJob")
    ]


@virtual_time
async def test_a_lost_event_is_posted_again_up_to_the_event_ttl_and_not_after() -> None:
    """Its age is read on the recorder's clock: at the API server's ``--event-ttl`` it may still
    be there to find missing; past it, it may have expired, which says nothing."""
    clock = FakeClock()
    since = clock.now() - timedelta(seconds=EVENT_TTL_SECONDS)

    async def posted_after_a_restart() -> list[str]:
        api = slow_api()
        recorder = Recorder(api, instance="test", clock=clock)
        recorder.ensure(JOB, lambda: [Implied(CREATED, since)])
        await recorder.drain()
        return [e["firstTimestamp"] for e in created(api)]

    assert await posted_after_a_restart() == [since.strftime("%Y-%m-%dT%H:%M:%SZ")]
    clock.advance(1)
    assert await posted_after_a_restart() == []


@virtual_time
async def test_an_events_times_are_the_recorders_clocks() -> None:
    clock = FakeClock()
    api = slow_api()
    recorder = Recorder(api, instance="test", clock=clock)
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    clock.advance(90)
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    [event] = created(api)
    first = (clock.now() - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (event["firstTimestamp"], event["lastTimestamp"]) == (first, first)
    [update] = [c.args[-1] for c in api.calls if c.verb == "patch"]
    assert update == {"count": 2, "lastTimestamp": clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")}


@virtual_time
async def test_a_create_answered_409_is_an_earlier_try_that_made_it_and_is_counted_up() -> None:
    """An Event's name is its own (a random suffix): a 409 is a try whose answer was lost, so
    the series is made, nothing is read, and a repeat counts it up."""
    api = slow_api()
    api.fail("create", ApiError(409, "AlreadyExists", "events pi.1a2b already exists"))
    recorder = Recorder(api, instance="test")
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert [c.verb for c in api.calls] == ["create", "patch"]
    assert counts(api) == [2]


@virtual_time
async def test_a_repeat_after_a_restart_counts_up_the_event_the_last_process_made() -> None:
    api = slow_api(stored(RUNNING, count=4))
    recorder = Recorder(api, instance="test")
    recorder.ensure(JOB, lambda: [Implied(RUNNING, NOW)])
    await recorder.drain()
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert created(api) == []
    assert counts(api) == [5]
    assert lists(api) == [
        ("v1", "Event", None, "source=mpi-job-controller,involvedObject.kind=MPIJob")
    ]


@virtual_time
async def test_a_deleted_job_is_forgotten_and_one_made_again_under_its_name_is_checked_afresh() -> (
    None
):
    """What the recorder keeps per job lasts as long as the job: 10,000 jobs run one after
    another leave nothing behind, those checked after a restart or not (a full line skips the
    check), and the name's next job is a job of its own."""
    api = slow_api()
    recorder = Recorder(api, instance="test", namespaces=["ns"])
    for i in range(10_000):
        job = {**JOB, "metadata": {**JOB["metadata"], "name": f"j{i}", "uid": f"u{i}"}}
        if i % 2 == 0:  # the first one reads what the API has: nothing yet
            recorder.ensure(job, list)
        recorder.post(job, RUNNING)
        await recorder.drain()
        recorder.forget(("ns", f"j{i}"))
    assert len(created(api)) == 10_000
    assert (recorder._ensured, recorder._seen, recorder._posted) == ({}, {}, {})
    checked: list[str] = []
    again = {**JOB, "metadata": {**JOB["metadata"], "uid": "u2"}}
    recorder.ensure(JOB, lambda: checked.append("u1") or [])
    recorder.ensure(again, lambda: checked.append("u2") or [])
    assert checked == ["u1", "u2"]


def dropped() -> float:
    return REGISTRY.get_sample_value("mpi_operator_events_dropped_total") or 0.0


@virtual_time
async def test_events_beyond_the_line_limit_are_dropped_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Jobs that come faster than the rate limit lets their Events out must not make the
    recorder hold ever more of them: 1,000 wait at most, as in client-go's broadcaster."""
    api = slow_api()
    recorder = Recorder(api, instance="test")
    before = dropped()
    with caplog.at_level(logging.WARNING, "mpijob.platform.recorder"):
        for i in range(MAX_WAITING + 500):
            recorder.post(JOB, normal("MPIJobRunning", f"run {i}"))
        await recorder.drain()
    assert len(created(api)) == MAX_WAITING
    assert dropped() - before == 500
    assert [r.getMessage()[:24] for r in caplog.records] == ["Dropped Event MPIJobRunn"]
    # Once there is room, Events are taken again.
    recorder.post(JOB, normal("MPIJobRunning", "later"))
    await recorder.drain()
    assert created(api)[-1]["message"] == "later"


@virtual_time
async def test_the_check_of_a_job_deleted_before_its_turn_is_taken_out_of_line() -> None:
    api = slow_api()
    recorder = Recorder(api, instance="test", namespaces=["ns"])
    recorder.post(JOB, RUNNING)  # in line first: the check waits behind it
    recorder.ensure(JOB, lambda: [Implied(CREATED, NOW)])  # the API lacks it: would post it
    recorder.forget(("ns", "pi"))
    await recorder.drain()
    assert [e["reason"] for e in created(api)] == ["MPIJobRunning"]


# --- what a tenant can put in the list: Events of its own, forged ------------------------------

SUCCEEDED = normal("MPIJobSucceeded", "MPIJob ns/pi successfully completed.")
#: JOB's object reference, as an Event in the tenant's namespace names it (with an ``eventTime``,
#: the API server lets an Event name an object of another namespace).
VICTIM = {"apiVersion": JOB["apiVersion"], "kind": "MPIJob", "name": "pi", "namespace": "ns"}


def forged(event: Event, involved_namespace: str) -> dict[str, Any]:
    """An Event in the tenant's namespace under JOB's uid, with JOB's reason and message."""
    about = {**VICTIM, "uid": "u1", "namespace": involved_namespace}
    return stored(event, 7, namespace="tenant", name=f"forged.{event.reason}", about=about)


@pytest.mark.parametrize("involved_namespace", ["ns", "tenant"])
@virtual_time
async def test_events_forged_in_another_namespace_under_a_jobs_uid_receive_none_of_its_events(
    involved_namespace: str,
) -> None:
    """A tenant's Events in its own namespace, naming the victim's uid (and its namespace, or
    the tenant's own), are listed at start-up but count up nothing of the victim's: its Events
    are made in its namespace, checked and posted alike, and the forged ones are untouched."""
    api = slow_api(*(forged(e, involved_namespace) for e in (CREATED, RUNNING, SUCCEEDED)))
    recorder = Recorder(api, instance="test", namespaces=["ns", "tenant"])
    recorder.ensure(JOB, lambda: [Implied(CREATED, NOW)])  # the API lacks it in "ns"
    await recorder.drain()
    recorder.post(JOB, RUNNING)
    recorder.post(JOB, SUCCEEDED)
    recorder.post(JOB, SUCCEEDED)
    await recorder.drain()
    made = [(e["metadata"]["namespace"], e["reason"]) for e in created(api)]
    assert made == [("ns", "MPIJobCreated"), ("ns", "MPIJobRunning"), ("ns", "MPIJobSucceeded")]
    # The repeat counts up the victim's own Event, in its namespace.
    assert [c.args[2:4] for c in api.calls if c.verb == "patch"] == [("ns", made_name(api, 2))]
    assert counts(api) == [2]
    assert [(e["metadata"]["name"], e["count"]) for e in api.stored("Event", "tenant")] == [
        ("forged.MPIJobCreated", 7),
        ("forged.MPIJobRunning", 7),
        ("forged.MPIJobSucceeded", 7),
    ]


def made_name(api: FakeKube, index: int) -> str:
    name: str = created(api)[index]["metadata"]["name"]
    return name


def _not_ours() -> dict[str, dict[str, Any]]:
    """Events in JOB's namespace, about JOB's uid, with RUNNING's reason or message (unless
    that is what is wrong), which this recorder cannot have made."""
    ours = stored(RUNNING)
    involved = ours["involvedObject"]
    return {
        "a pod's": {**ours, "involvedObject": {**involved, "kind": "Pod"}},
        "another version's": {**ours, "involvedObject": {**involved, "apiVersion": "x/v1"}},
        "another namespace's object": {**ours, "involvedObject": {**involved, "namespace": "t"}},
        "another component's": {**ours, "source": {"component": "kubelet"}},
        "a message too long": {**ours, "message": "m" * (MESSAGE_LIMIT + 1)},
        "a reason too long": {**ours, "reason": "R" * (REASON_LIMIT + 1)},
        "a uid too long": {**ours, "involvedObject": {**involved, "uid": "u" * 37}},
        "a name too long": {**ours, "involvedObject": {**involved, "name": "n" * 254}},
        "no type": {**ours, "type": ""},
    }


@pytest.mark.parametrize("case", sorted(_not_ours()))
@virtual_time
async def test_a_listed_event_this_recorder_cannot_have_made_is_not_kept(case: str) -> None:
    """What the list finds is not kept unless this recorder could have posted it: about an
    MPIJob of its namespace, from this component, no longer than any Event posted here."""
    api = slow_api(_not_ours()[case])
    recorder = Recorder(api, instance="test", namespaces=["ns"])
    recorder.ensure(JOB, list)
    await recorder.drain()
    assert (len(lists(api)), len(recorder._seen)) == (1, 0)


@virtual_time
async def test_the_same_event_stored_as_this_recorder_writes_it_is_kept() -> None:
    """The control for the cases above: the Event they alter is counted up after a restart."""
    api = slow_api(stored(RUNNING, count=2))
    recorder = Recorder(api, instance="test", namespaces=["ns"])
    recorder.ensure(JOB, list)
    await recorder.drain()
    recorder.post(JOB, RUNNING)
    await recorder.drain()
    assert (created(api), counts(api)) == ([], [3])


@virtual_time
async def test_a_message_longer_than_the_limit_is_posted_cut_and_counted_up_after_a_restart() -> (
    None
):
    """Every Event is posted within the limits the list is read by, so the next process
    counts up even the longest one."""
    long = normal("MPIJobFailed", "é" * MESSAGE_LIMIT)
    first = slow_api()
    recorder = Recorder(first, instance="test", namespaces=["ns"])
    recorder.post(JOB, long)
    await recorder.drain()
    [event] = created(first)
    assert len(event["message"].encode()) == MESSAGE_LIMIT - 1  # a 2-byte character not split
    assert event["message"].endswith("...")
    again = slow_api({**event, "count": 1, "metadata": dict(event["metadata"])})
    recorder = Recorder(again, instance="test", namespaces=["ns"])
    recorder.ensure(JOB, lambda: [Implied(long, NOW)])
    await recorder.drain()
    recorder.post(JOB, long)
    await recorder.drain()
    assert (created(again), counts(again)) == ([], [2])


@virtual_time
async def test_at_most_max_tracked_listed_events_are_kept_the_latest_ones() -> None:
    """A namespace full of Events (a tenant's forged ones, say) does not decide how much the
    recorder holds: of those listed, the latest :data:`MAX_TRACKED` are kept."""
    extra = 50
    listed = [
        stored(
            normal("MPIJobRunning", f"run {i}"),
            name=f"pi.{i:05d}",
            last=f"2024-05-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
        )
        for i in range(MAX_TRACKED + extra)
    ]
    api = FakeKube(*({"apiVersion": "v1", "kind": "Event", **e} for e in reversed(listed)))
    recorder = Recorder(api, instance="test", namespaces=["ns"])
    recorder.ensure(JOB, list)
    await recorder.drain()
    assert len(recorder._seen) == MAX_TRACKED
    recorder.post(JOB, normal("MPIJobRunning", f"run {MAX_TRACKED + extra - 1}"))  # the latest
    recorder.post(JOB, normal("MPIJobRunning", f"run {extra - 1}"))  # too old to be kept
    await recorder.drain()
    assert [c.args[3] for c in api.calls if c.verb == "patch"] == [
        f"pi.{MAX_TRACKED + extra - 1:05d}"
    ]
    assert [e["message"] for e in created(api)] == [f"run {extra - 1}"]
    assert len(recorder._seen) == MAX_TRACKED

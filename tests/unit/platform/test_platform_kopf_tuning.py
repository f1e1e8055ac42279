"""The changes to Kopf's private classes: its watch streams' JSON decoding, its views without
reference cycles; and that no handler of the operator runs in Kopf's threads."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
import threading

import kopf
import pytest
from kopf._cogs.clients import api
from kopf._core.actions import invocation

from mpijob import keys
from mpijob.desired.gpu_binding import GpuBinding
from mpijob.handlers import startup
from mpijob.platform import kopf_tuning, kube
from mpijob.settings import OperatorSettings
from mpijob.shares.service import ShareService

pytestmark = pytest.mark.unit


def test_kopfs_watch_lines_decode_through_orjson_to_the_same_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kopf's module is the process's: give its own decoding back when the test ends.
    monkeypatch.setattr(api, "json", api.json)
    kopf_tuning.decode_watch_events_with_orjson()
    line = '{"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "pi-worker-0"}}}'
    assert api.json is not json
    assert api.json.loads is kube.decode
    assert api.json.loads(line) == json.loads(line)
    assert api.json.loads('"\\ud800"') == "\ud800"  # orjson refuses a lone surrogate; json takes it
    assert api.json.dumps({"a": 1}) == json.dumps({"a": 1})


def test_kopfs_body_and_patch_views_read_and_write_as_before_and_leave_no_cycle() -> None:
    # In a fresh interpreter: the change is to Kopf's classes, for the whole process.
    script = textwrap.dedent(
        """
        import gc
        from mpijob.platform import kopf_tuning
        from kopf._cogs.structs import bodies, patches

        def one_event():
            raw = {"metadata": {"name": "w", "labels": {"a": "b"}}, "spec": {"s": 1}}
            body = bodies.Body(raw)
            patch = patches.Patch(body=body)
            patch.meta.annotations["k"] = "v"
            patch.status["phase"] = "Running"
            seen = (body.meta.name, dict(body.metadata.labels), body.spec["s"], dict(body.status))
            return seen, dict(patch), body.meta.annotations.get("k")

        before = one_event()
        kopf_tuning.views_without_cycles()
        gc.collect()
        gc.disable()
        after = one_event()
        assert after == before == (
            ("w", {"a": "b"}, 1, {}),
            {"metadata": {"annotations": {"k": "v"}}, "status": {"phase": "Running"}},
            None,
        ), after
        print(gc.collect())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_the_watch_decoding_is_given_back_after_the_test_that_changed_it() -> None:
    # Runs after the test above (file order): Kopf decodes with the standard library again.
    assert api.json is json


def test_kopfs_index_filling_wakes_its_waiters_once_not_at_every_object() -> None:
    """N objects' tasks wait for the set to be all on while N toggles are dropped one by one:
    the set's state is looked at about 2N times (once by each waiter, when it starts and when
    the last toggle goes), not N^2 times (every waiter at every drop)."""
    script = textwrap.dedent(
        """
        import asyncio
        from kopf._cogs.aiokits import aiotoggles
        from mpijob.platform import kopf_tuning

        kopf_tuning.toggle_sets_wake_on_change()
        N = 400
        looks = [0]

        def every(states):
            looks[0] += 1
            return all(states)

        async def main():
            indexed = aiotoggles.ToggleSet(every)
            toggles = [await indexed.make_toggle(name=str(i)) for i in range(N)]
            waiters = [asyncio.create_task(indexed.wait_for(True)) for _ in range(N)]
            paused = aiotoggles.ToggleSet(any)
            one = await paused.make_toggle()
            off = asyncio.create_task(paused.wait_for(True))  # waits for the set to turn on
            on_one = asyncio.create_task(one.wait_for(True))  # waits on the toggle itself
            await asyncio.sleep(0)
            before = looks[0]
            for t in toggles[:-1]:
                await indexed.drop_toggle(t)
                await asyncio.sleep(0)
            assert not any(w.done() for w in waiters)
            await indexed.drop_toggle(toggles[-1])
            await asyncio.wait_for(asyncio.gather(*waiters), 5)
            late = await indexed.make_toggle()  # a new object: the set is off again
            again = asyncio.create_task(indexed.wait_for(True))
            await asyncio.sleep(0)
            assert not again.done()
            await late.turn_to(True)
            await asyncio.wait_for(again, 5)
            await one.turn_to(True)
            await asyncio.wait_for(asyncio.gather(off, on_one), 5)
            print(looks[0] - before)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) <= 3 * 400, f"{done.stdout.strip()} looks at the set for 400 objects"


def test_kopf_retries_an_unanswered_request_every_second_for_an_hour() -> None:
    """After an API server restart a watch is back within a second of the server, and never
    given up while the server is away for minutes (Kopf's own waits grow to 21 s, then stop)."""
    import kopf

    from mpijob.settings import OperatorSettings

    settings = kopf.OperatorSettings()
    kopf_tuning.configure(settings, OperatorSettings())
    waits = list(settings.networking.error_backoffs)  # type: ignore[arg-type]
    assert max(waits) <= 1.0
    assert sum(waits) >= 3600
    assert list(settings.networking.error_backoffs) == waits  # read afresh by every request


@pytest.mark.parametrize("gang", ["", keys.VOLCANO_SCHEDULER_NAME, "scheduler-plugins-scheduler"])
@pytest.mark.parametrize("binding", list(GpuBinding))
def test_every_handler_the_operator_gives_kopf_is_a_coroutine_function(
    gang: str, binding: GpuBinding
) -> None:
    """Kopf runs a plain function in a thread, beside the loop that changes what it reads (the
    share ledger, the caches): every handler, in every mode, runs on the loop instead."""
    ours = OperatorSettings(gang_scheduling=gang, fractional_gpus=True)
    registry = startup.registry_for(ours, binding, ShareService())
    kinds = (registry._activities, registry._indexing, registry._watching, registry._spawning)
    kinds += (registry._changing, registry._webhooks)
    handlers = [handler for kind in kinds for handler in kind.get_all_handlers()]
    assert len(handlers) > 10
    plain = [str(h.id) for h in handlers if not invocation.is_async_fn(h.fn)]
    assert plain == []


async def test_kopf_as_the_operator_configures_it_runs_no_handler_in_a_thread() -> None:
    settings = kopf.OperatorSettings()
    kopf_tuning.configure(settings, OperatorSettings())
    loop = threading.get_ident()
    ran: list[int] = []

    async def coroutine(**_: object) -> str:
        ran.append(threading.get_ident())
        return "ran"

    def plain(**_: object) -> str:
        ran.append(threading.get_ident())
        return "ran"

    assert await invocation.invoke(coroutine, settings=settings) == "ran"
    with pytest.raises(TypeError, match=r"never run in a thread: .*plain"):
        await invocation.invoke(plain, settings=settings)
    assert ran == [loop]  # the plain one never ran


def test_a_kopf_cause_builds_its_handlers_arguments_once_and_the_same_as_before() -> None:
    # In a fresh interpreter: the change is to Kopf's classes, for the whole process.
    script = textwrap.dedent(
        """
        import logging
        from kopf._cogs.structs import bodies, patches, references
        from kopf._core.intents import causes
        from mpijob.platform import kopf_tuning

        built = []
        original = causes.BaseCause._kwargs.fget
        causes.BaseCause._kwargs = property(lambda self: built.append(1) or original(self))
        resource = references.Resource("kubeflow.org", "v2beta1", "mpijobs", namespaced=True)

        def cause():
            raw = {"metadata": {"name": "pi", "namespace": "ns", "uid": "u", "labels": {"a": "b"}},
                   "spec": {"slotsPerWorker": 8}, "status": {}}
            body = bodies.Body(raw)
            return causes.WatchingCause(
                resource=resource, indices={"jobs": {"k": 1}}, logger=logging.getLogger("t"),
                patch=patches.Patch(body=body), memo=None, body=body, type="MODIFIED",
                event={"type": "MODIFIED", "object": raw},
            )

        def seen(c):
            for _ in range(3):  # planning, a `when` filter, the call
                kwargs, sync, asynchronous = c.kwargs, c.sync_kwargs, c.async_kwargs
            assert kwargs == sync == asynchronous
            return {k: (dict(v) if k in ("meta", "spec", "labels") else v)
                    for k, v in kwargs.items() if k not in ("body", "patch", "status",
                                                           "annotations", "logger", "event")}

        before = seen(cause())
        assert len(built) == 9, built
        kopf_tuning.causes_build_their_arguments_once()
        built.clear()
        after = seen(cause())
        assert len(built) == 1, built
        assert after == before, (after, before)
        assert after["name"] == "pi" and after["jobs"] == {"k": 1} and after["type"] == "MODIFIED"
        assert after["labels"] == {"a": "b"} and after["spec"] == {"slotsPerWorker": 8}
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_kopfs_index_stores_replace_and_discard_as_before_without_comparing() -> None:
    # In a fresh interpreter: the change is to Kopf's classes, for the whole process.
    script = textwrap.dedent(
        """
        from kopf._core.engines import indexing
        from mpijob.platform import kopf_tuning

        def filled():
            index = indexing.Index()
            index._replace(("ns", "a", "u1"), {"k1": {"v": 1}, "k2": {"v": 1}})
            index._replace(("ns", "b", "u2"), {"k1": {"v": 2}})
            index._replace(("ns", "a", "u1"), {"k1": {"v": 3}})  # no longer under k2
            index._discard(("ns", "b", "u2"))
            return {key: list(index[key]) for key in index}

        compared = []
        before = filled()
        kopf_tuning.index_stores_replace_without_comparing()
        watched = type("Watched", (dict,), {"__ne__": lambda s, o: compared.append(1) or True})
        after = filled()
        index = indexing.Index()
        index._replace(("ns", "a", "u1"), {"k1": watched(v=1)})
        index._replace(("ns", "a", "u1"), {"k1": watched(v=1)})
        assert before == after == {"k1": [{"v": 3}]}, (before, after)
        assert compared == [], compared  # the value held was never compared with the new one
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("gang", ["", keys.VOLCANO_SCHEDULER_NAME])
def test_no_kopf_handler_of_the_operator_takes_the_bodys_status(gang: str) -> None:
    """Kopf offers every handler ``status``; a job's is tenant-writable (the MPIJob role grants
    ``mpijobs/status``), so no handler takes it: what reaches the reconcile goes through the
    cache, whose readers the trust tests cover."""
    ours = OperatorSettings(gang_scheduling=gang, fractional_gpus=True)
    registry = startup.registry_for(ours, GpuBinding.ANNOTATIONS, ShareService())
    kinds = (registry._activities, registry._indexing, registry._watching, registry._webhooks)
    handlers = [handler for kind in kinds for handler in kind.get_all_handlers()]
    assert len(handlers) > 10
    taking = [str(h.id) for h in handlers if "status" in inspect.signature(h.fn).parameters]
    assert taking == []

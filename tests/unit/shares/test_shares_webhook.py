"""The share webhooks as Kopf calls them: on the event loop, never in Kopf's threads, so the
ledger they read is never read while the loop changes it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf
import pytest
from kopf._core.actions import invocation

from mpijob import keys
from mpijob.shares import webhook
from mpijob.shares.pod_edits import MUTATE_ID, VALIDATE_ID
from mpijob.shares.request import Share
from mpijob.shares.service import ShareService
from support.virtual_time import FakeClock

pytestmark = pytest.mark.unit


def node(name: str, *, memory: int) -> dict[str, Any]:
    """An opted-in node of 4 GPUs with ``memory`` GiB of GPU memory between them."""
    return {
        "metadata": {
            "name": name,
            "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM},
        },
        "status": {
            "allocatable": {
                "cpu": "64",
                "memory": "512Gi",
                "pods": "110",
                keys.GPU_COUNT_RESOURCE: "4",
                keys.GPU_MEM_RESOURCE: str(memory),
                keys.GPU_CORE_PERCENTAGE_RESOURCE: "400",
            }
        },
    }


def share_pod(memory: str) -> dict[str, Any]:
    limits = {keys.GPU_MEM_RESOURCE: memory, keys.GPU_CORE_PERCENTAGE_RESOURCE: "30"}
    return {
        "metadata": {"generateName": "cuda-", "namespace": "default"},
        "spec": {"containers": [{"name": "cuda", "resources": {"limits": limits}}]},
    }


def webhook_handler(registry: kopf.OperatorRegistry, id: str) -> Any:
    (handler,) = [h for h in registry._webhooks.get_all_handlers() if h.id == id]
    return handler


async def test_the_validating_webhook_reads_the_ledger_on_the_loop_while_nodes_come_and_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The only GPUs that could hold the share (80 GiB each) come and go while 100 admissions
    are validated, through Kopf's own invocation with its default (threaded) executor: every
    read of the ledger runs on the loop's thread and sees one ledger from start to end, and
    each answer is the one that ledger gives. A handler that Kopf ran in a thread would read
    the nodes while the loop adds and removes them (a dict that changes size while it is
    iterated, or an answer from half of a change)."""
    service = ShareService(clock=FakeClock())
    await service.on_node(node("small", memory=16), None)  # 4 GiB GPUs: never enough
    registry = kopf.OperatorRegistry()
    webhook.register(registry, service)
    validate = webhook_handler(registry, VALIDATE_ID)
    settings = kopf.OperatorSettings()  # Kopf's default executor: a handler could use it
    loop_thread = threading.get_ident()
    reads: list[tuple[int, frozenset[str], bool, frozenset[str]]] = []
    could_ever_fit = service.ledger.could_ever_fit

    def watched(share: Share) -> bool:
        before = frozenset(service.ledger.nodes)
        answer = could_ever_fit(share)
        reads.append((threading.get_ident(), before, answer, frozenset(service.ledger.nodes)))
        return answer

    monkeypatch.setattr(service.ledger, "could_ever_fit", watched)

    async def nodes_come_and_go() -> None:
        for turn in range(200):
            await service.on_node(node("big", memory=320), "DELETED" if turn % 2 else None)
            await asyncio.sleep(0)

    async def admission(turn: int) -> str:
        """The webhook's answer: admitted, or why it refused."""
        for _ in range(turn):  # spread the admissions over the changes
            await asyncio.sleep(0)
        try:
            await invocation.invoke(
                validate.fn, settings=settings, kwargs={"body": share_pod("40")}
            )
        except kopf.AdmissionError as refused:
            return str(refused)
        return "admitted"

    *answers, _ = await asyncio.gather(*(admission(i) for i in range(100)), nodes_come_and_go())
    assert len(reads) == 100
    assert {thread for thread, *_ in reads} == {loop_thread}
    assert all(before == after for _, before, _, after in reads)  # no change during a read
    assert [answer for *_, answer, _ in reads] == ["big" in before for _, before, _, _ in reads]
    admitted = [answer == "admitted" for answer in answers]
    assert set(admitted) == {True, False}  # the ledger did change under the webhook
    assert sorted(admitted) == sorted(answer for *_, answer, _ in reads)
    assert all("no opted-in GPU" in answer for answer in answers if answer != "admitted")


async def test_both_webhooks_are_coroutines_so_kopf_never_runs_them_in_a_thread() -> None:
    registry = kopf.OperatorRegistry()
    webhook.register(registry, ShareService(clock=FakeClock()))
    for id in (MUTATE_ID, VALIDATE_ID):
        assert invocation.is_async_fn(webhook_handler(registry, id).fn), id

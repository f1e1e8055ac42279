"""GPU-share webhooks and watches over one ledger: decisions, refusals, holds that lapse, no
overcommit under concurrent admissions, the serving certificate, the configurations."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
from cryptography import x509

from mpijob import keys, metrics
from mpijob.platform import tls
from mpijob.platform.kube import ApiError
from mpijob.platform.leader import LeaderElector
from mpijob.platform.manager import Manager, Runnable
from mpijob.shares import service as fractional
from mpijob.shares import webhook
from mpijob.shares.pod_edits import (
    ADMITTED,
    MATCH_SHARE_PODS,
    MUTATE_ID,
    VALIDATE_ID,
    WEBHOOK_TIMEOUT_SECONDS,
    resolve_env,
    webhook_configurations,
)
from mpijob.shares.request import Placed, Share
from mpijob.shares.service import ShareService
from support.fake_kube import FakeKube
from support.virtual_time import FakeClock, virtual_time

MEM = keys.GPU_MEM_RESOURCE
CORE = keys.GPU_CORE_PERCENTAGE_RESOURCE


def node(name: str, *, gpus: int = 4, memory: int = 60, binpack: bool = True) -> dict[str, Any]:
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM}
    if binpack:
        labels[keys.NODE_GPU_PLACEMENT_LABEL] = keys.NODE_GPU_PLACEMENT_BINPACK
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {
                "cpu": "64",
                "memory": "512Gi",
                "pods": "110",
                keys.GPU_COUNT_RESOURCE: str(gpus),
                keys.GPU_MEM_RESOURCE: str(memory),
                keys.GPU_CORE_PERCENTAGE_RESOURCE: str(100 * gpus),
            }
        },
    }


def pod(memory: Any = "2", core: Any = "30", name: str = "cuda-sample") -> dict[str, Any]:
    limits = {MEM: memory}
    if core is not None:
        limits[CORE] = core
    return {
        "metadata": {"generateName": f"{name}-", "namespace": "default"},
        "spec": {"containers": [{"name": "cuda", "resources": {"limits": limits}}]},
    }


async def admission_with(*nodes: dict[str, Any], clock: FakeClock | None = None) -> ShareService:
    admission = ShareService(clock=clock or FakeClock())
    for body in nodes:
        await admission.on_node(body, None)
    return admission


def placed_of(body: dict[str, Any], ops: list[dict[str, Any]]) -> tuple[dict[str, Any], Placed]:
    patched = jsonpatch.apply_patch(body, ops)
    record = Placed.loads(patched["metadata"]["annotations"][keys.GPU_SHARE])
    assert record is not None
    assert not patched["spec"].get("schedulingGates")
    return patched, record


def waiting_of(body: dict[str, Any], ops: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """The pod admitted to wait, and why it waits."""
    patched = jsonpatch.apply_patch(body, ops)
    annotations = patched["metadata"]["annotations"]
    assert keys.GPU_SHARE not in annotations
    assert patched["spec"]["schedulingGates"] == [{"name": keys.GPU_SHARE_GATE}]
    assert patched["spec"].get("affinity") == body["spec"].get("affinity")
    return patched, annotations[keys.GPU_SHARE_WAITING]


async def waits(admission: ShareService, body: dict[str, Any]) -> str:
    """Why ``body`` waits after the placement pass (the pod is then deleted)."""
    final, reason = waiting_of(body, await decided(admission, body))
    await admission.on_pod(final, "DELETED")
    return reason


_serial = itertools.count()


async def decided(
    admission: ShareService, body: dict[str, Any], *, seen: bool = True
) -> list[dict[str, Any]]:
    """What becomes of ``body`` as JSON patch: admitted by the webhook (gated), created, seen by
    the watch and through the leader's placement pass (and its record seen, unless not
    ``seen``). Only this pod is placed; other waiting pods stay as they were."""
    gated = jsonpatch.apply_patch(body, await admission.mutate(body, dryrun=False))
    if gated == body:
        return []
    meta = gated["metadata"]
    meta.setdefault("name", f"{meta.get('generateName', 'pod-')}{next(_serial)}")
    meta.setdefault("uid", f"uid-{meta['name']}")
    meta.setdefault("creationTimestamp", "2026-11-24T19:00:00Z")
    key = f"{meta['namespace']}/{meta['name']}"
    patches = Patches()
    patches.pods[key] = gated
    others = {k: v for k, v in admission.waiting.items() if k != key}
    await admission.on_pod(gated, "ADDED")
    admission.waiting = {key: admission.waiting[key]}
    await admission.place_waiting(patches)
    admission.waiting.update(others)
    final = patches.pods[key]
    if seen:
        await admission.on_pod(final, "MODIFIED")
    return jsonpatch.make_patch(body, final).patch


async def test_the_cuda_sample_gets_its_gpu_env_and_annotation() -> None:
    admission = await admission_with(node("gpu-a"))
    body = pod()
    patched, record = placed_of(body, await decided(admission, body))
    env = resolve_env(patched["spec"]["containers"][0]["env"], patched["metadata"]["annotations"])
    assert env[keys.ENV_NVIDIA_VISIBLE_DEVICES] == record.uuid
    assert env[keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "30"
    assert env[keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=2G"
    assert record.node == "gpu-a"
    assert record.share.memory_gib == 2
    assert record.claim == "pod-uid-cuda-sample-0"  # the pod's uid: it exists


async def test_binpack_three_then_a_fourth_on_another_gpu() -> None:
    admission = await admission_with(node("gpu-a"))
    gpus = []
    for _ in range(4):
        body = pod()
        gpus.append(placed_of(body, await decided(admission, body))[1].gpu)
    assert gpus[0] == gpus[1] == gpus[2] != gpus[3]


@pytest.mark.parametrize("core", ["33", "105"])
async def test_a_bad_percentage_is_refused_naming_the_field(core: str) -> None:
    admission = await admission_with(node("gpu-a"))
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.validate(pod(core=core))
    assert refused.value.code == 422
    assert f"spec.containers[0].resources.limits[{CORE}]" in str(refused.value)
    assert "multiple of 5" in str(refused.value)


async def test_a_share_no_gpu_could_ever_hold_is_refused() -> None:
    admission = await admission_with(node("gpu-a", gpus=4, memory=60))
    with pytest.raises(kopf.AdmissionError, match="has 16 GiB of memory"):
        admission.validate(pod(memory="16"))


async def test_a_share_that_fits_nowhere_now_waits_behind_the_gate_holding_nothing() -> None:
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    await decided(admission, pod(memory="10", core="50"))
    reason = await waits(admission, pod(memory="10", core="50"))
    assert reason == "no GPU of 1 eligible node(s) has 10 GiB and 50% free"
    assert len(admission.ledger) == 1


async def test_pods_without_a_share_are_left_alone() -> None:
    admission = await admission_with(node("gpu-a"))
    body = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c"}]}}
    assert await decided(admission, body) == []


async def test_the_webhook_gates_every_share_pod_and_holds_nothing() -> None:
    """Admissions that never become pods (refused later by the API server, or AdmissionReviews
    sent by hand), dry runs or not: the ledger holds nothing, the next pod is placed."""
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    for dryrun in (False, True, False):
        body = pod(memory="10", core="50")
        patched, reason = waiting_of(body, await admission.mutate(body, dryrun=dryrun))
        assert reason == ADMITTED
        assert patched["spec"]["containers"][0]["env"]  # its environment, whatever its GPU
    assert len(admission.ledger) == 0
    assert admission.waiting == {}
    placed_of(pod(memory="10", core="50"), await decided(admission, pod(memory="10", core="50")))


async def test_a_placement_whose_record_the_watch_never_sees_lapses() -> None:
    """Held for ``PENDING_SECONDS`` from the placement, not a moment less."""
    clock = FakeClock()
    admission = await admission_with(node("gpu-a", gpus=1, memory=15), clock=clock)
    await decided(admission, pod(memory="10", core="50"), seen=False)
    assert len(admission.ledger) == 1
    clock.advance(fractional.PENDING_SECONDS - 0.5)
    await waits(admission, pod(memory="10", core="50"))  # still held
    clock.advance(0.5)
    await decided(admission, pod(memory="10", core="50"))  # the first one lapsed
    assert len(admission.ledger) == 1


async def test_a_seen_pod_keeps_its_share_and_frees_it_when_finished() -> None:
    clock = FakeClock()
    admission = await admission_with(node("gpu-a", gpus=1, memory=15), clock=clock)
    body = pod(memory="10", core="50")
    patched, record = placed_of(body, await decided(admission, body))
    patched["metadata"]["name"] = "cuda-sample-x1"
    await admission.on_pod(patched, "ADDED")
    clock.advance(fractional.PENDING_SECONDS + 1)
    await waits(admission, pod(memory="10", core="50"))
    patched["status"] = {"phase": "Succeeded"}
    await admission.on_pod(patched, "MODIFIED")
    assert admission.ledger.held(record.claim) is None
    assert await decided(admission, pod(memory="10", core="50"))


async def test_after_a_restart_the_listing_rebuilds_the_ledger() -> None:
    first = await admission_with(node("gpu-a", gpus=1, memory=15))
    body = pod(memory="10", core="50")
    patched, _ = placed_of(body, await decided(first, body))
    restarted = await admission_with()
    await restarted.on_pod(patched, None)  # pods may be listed before their node
    await restarted.on_node(node("gpu-a", gpus=1, memory=15), None)
    await waits(restarted, pod(memory="10", core="50"))


async def test_a_node_that_opts_out_takes_no_more_shares() -> None:
    admission = await admission_with(node("gpu-a"))
    await admission.on_node(node("gpu-a"), "DELETED")
    with pytest.raises(kopf.AdmissionError, match="no opted-in GPU"):
        admission.validate(pod())


async def test_concurrent_admissions_never_overcommit() -> None:
    admission = await admission_with(*(node(f"gpu-{i}", gpus=2, memory=30) for i in range(3)))

    patches = Patches()

    async def one(i: int) -> None:
        body = pod(memory=str(1 + i % 4), core=str(5 * (1 + i % 6)))
        gated, _ = waiting_of(body, await admission.mutate(body, dryrun=False))
        gated["metadata"].update(name=f"p-{i}", uid=f"uid-{i}", creationTimestamp=f"{i:04d}")
        patches.pods[f"default/p-{i}"] = gated
        await admission.on_pod(gated, "ADDED")

    await asyncio.gather(*(one(i) for i in range(100)))
    assert len(admission.ledger) == 0
    await admission.place_waiting(patches)  # one pass at a time, as run_placement runs them
    records = [p["metadata"]["annotations"].get(keys.GPU_SHARE) for p in patches.pods.values()]
    held = [r for r in (Placed.loads(x) for x in records if x) if r is not None]
    assert 0 < len(held) < 100
    for name, state in admission.ledger.nodes.items():
        for gpu in state.gpus.values():
            mine = [r for r in held if r.node == name and r.gpu == gpu.index]
            assert sum(r.share.memory_gib for r in mine) <= gpu.memory_gib
            assert sum(r.share.percentage or 0 for r in mine) <= 100
    assert admission.ledger.overcommitted() == []


def test_register_adds_both_webhooks_and_both_watches() -> None:
    registry = kopf.OperatorRegistry()
    webhook.register(registry, ShareService(clock=FakeClock()))
    ids = {h.id for h in registry._webhooks.get_all_handlers()}
    assert ids == {MUTATE_ID, VALIDATE_ID}
    assert len(registry._watching.get_all_handlers()) == 2


def test_the_serving_certificate_names_the_service(tmp_path: Any) -> None:
    cert = tls.serving_certificate("mpi-operator", "mpijob-operator-webhook", tmp_path)
    loaded = x509.load_pem_x509_certificate(cert.certfile.read_bytes())
    names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "mpijob-operator-webhook.mpi-operator.svc" in names.get_values_for_type(x509.DNSName)
    assert base64.b64decode(cert.ca_bundle) == cert.certfile.read_bytes()
    assert oct(cert.keyfile.stat().st_mode)[-3:] == "600"


def test_a_certificate_made_without_a_directory_is_gone_when_the_process_exits() -> None:
    """A start without ``--webhook-cert-dir`` writes its key to a directory of its own; the
    process leaves none behind."""
    code = (
        "from mpijob.platform import tls\n"
        "cert = tls.serving_certificate('ns', 'svc')\n"
        "assert cert.keyfile.exists()\n"
        "print(cert.keyfile.parent)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    made = Path(done.stdout.strip())
    assert made.name.startswith("mpijob-webhook-")
    assert not made.exists()


def test_the_configurations_fail_closed_for_share_pods_only_and_spare_the_operator() -> None:
    mutating, validating = webhook_configurations(
        service_namespace="mpi-operator",
        service_name="mpijob-operator-webhook",
        port=443,
        ca_bundle="Q0E=",
        exempt_namespaces=("mpi-operator", "kube-system"),
    )
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    for config, path in ((mutating, MUTATE_ID), (validating, VALIDATE_ID)):
        [hook] = config["webhooks"]
        assert hook["failurePolicy"] == "Fail"
        assert hook["timeoutSeconds"] == WEBHOOK_TIMEOUT_SECONDS <= 10
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["clientConfig"]["service"]["path"] == f"/{path}"
        assert hook["rules"][0]["operations"] == ["CREATE"]
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
            "kube-system",
            "mpi-operator",
        ]
        assert hook["matchConditions"][0]["expression"] == MATCH_SHARE_PODS
    assert MEM in MATCH_SHARE_PODS
    assert CORE in MATCH_SHARE_PODS
    assert "initContainers" in MATCH_SHARE_PODS


async def test_rebuild_from_listings_counts_running_pods_and_skips_finished_ones() -> None:
    first = await admission_with(node("gpu-a", gpus=1, memory=15))
    running = pod(memory="10", core="50")
    running, _ = placed_of(running, await decided(first, running))
    done = pod(memory="4", core="40")
    done, _ = placed_of(done, await decided(first, done))
    done["status"] = {"phase": "Succeeded"}
    plain = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    restarted = ShareService(clock=FakeClock())
    await restarted.rebuild(
        [node("gpu-a", gpus=1, memory=15), {"metadata": {"name": "x"}}], [running, done, plain]
    )
    assert len(restarted.ledger) == 1
    body = pod(memory="4", core="50")
    placed_of(body, await decided(restarted, body))
    await waits(restarted, pod(memory="1", core="5"))


def test_a_url_replaces_the_service_and_enters_the_certificate(tmp_path: Any) -> None:
    configs = webhook_configurations(
        service_namespace="ns",
        service_name="svc",
        port=443,
        ca_bundle="Q0E=",
        exempt_namespaces=("ns",),
        url="https://127.0.0.1:19443/",
    )
    assert configs[0]["webhooks"][0]["clientConfig"] == {
        "url": f"https://127.0.0.1:19443/{MUTATE_ID}",
        "caBundle": "Q0E=",
    }
    cert = tls.serving_certificate("ns", "svc", tmp_path, url="https://127.0.0.1:19443")
    loaded = x509.load_pem_x509_certificate(cert.certfile.read_bytes())
    names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def worker_pod(job: str, index: int, memory: str = "2", core: str = "25") -> dict[str, Any]:
    body = pod(memory, core)
    body["metadata"] = {
        "name": f"{job}-worker-{index}",
        "namespace": "team",
        "labels": {
            keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
            keys.LABEL_JOB_ROLE: keys.ROLE_WORKER,
            keys.LABEL_JOB_NAME: job,
        },
        "ownerReferences": [
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND,
                "name": job,
                "uid": f"uid-{job}",
                "controller": True,
            }
        ],
    }
    return body


def workers(count: int) -> fractional.WorkersOf:
    """Every job of the namespace ``team`` has ``count`` workers and the uid ``uid-<name>``."""

    async def workers_of(namespace: str, name: str, uid: str) -> int | None:
        return count if (namespace, uid) == ("team", f"uid-{name}") else None

    return workers_of


def test_a_worker_is_read_strictly_and_its_job_by_its_controller() -> None:
    assert fractional.worker_of(worker_pod("train", 2)) == fractional.Worker(
        "team", "train", "uid-train", 2
    )
    padded = worker_pod("train", 0)
    padded["metadata"]["name"] = "train-worker-00"
    unlabelled = worker_pod("train", 0)
    del unlabelled["metadata"]["labels"][keys.LABEL_OPERATOR_NAME]
    other_job = worker_pod("train", 0)
    other_job["metadata"]["labels"][keys.LABEL_JOB_NAME] = "other"
    for body in (padded, unlabelled, other_job):
        assert fractional.worker_of(body) is None, body["metadata"]


async def test_a_pod_that_only_looks_like_a_worker_reserves_nothing_for_a_job() -> None:
    """The first worker of a job reserves shares for all its workers; a tenant's pod that reads
    as a worker only leniently, or names the job under another uid, is placed on its own."""
    admission = await admission_with(node("gpu-a"))
    admission.workers_of = workers(4)
    padded = worker_pod("train", 0)
    padded["metadata"]["name"] = "train-worker-00"
    forged = worker_pod("train", 1)
    forged["metadata"]["ownerReferences"][0]["uid"] = "uid-forged"
    for body in (padded, forged):
        _, record = placed_of(body, await decided(admission, body))
        assert record.claim == f"pod-uid-{body['metadata']['name']}"
    assert len(admission.ledger) == 2


async def test_the_job_reader_answers_only_for_the_uid_the_job_has() -> None:
    job = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {"name": "train", "namespace": "team", "uid": "uid-train"},
        "spec": {"mpiReplicaSpecs": {keys.REPLICA_WORKER: {"replicas": 3}}},
    }
    read = fractional.workers_reader(FakeKube(job))
    assert await read("team", "train", "uid-train") == 3
    assert await read("team", "train", "uid-forged") is None
    assert await read("team", "gone", "uid-train") is None


async def test_the_first_worker_reserves_every_worker_of_its_job() -> None:
    admission = await admission_with(node("gpu-a"))
    admission.workers_of = workers(4)
    _, first = placed_of(worker_pod("train", 0), await decided(admission, worker_pod("train", 0)))
    assert first.claim == "mpijob/team/train/uid-train/worker-0"
    assert len(admission.ledger) == 4  # the other three are held for their pods
    records = [first]
    for i in (1, 2, 3):
        body = worker_pod("train", i)
        records.append(placed_of(body, await decided(admission, body))[1])
    assert len(admission.ledger) == 4
    assert [r.claim for r in records] == [
        f"mpijob/team/train/uid-train/worker-{i}" for i in range(4)
    ]
    assert {r.gpu for r in records} == {first.gpu}  # 4 x 25% binpacked on one GPU


async def test_workers_that_do_not_all_fit_hold_nothing() -> None:
    admission = await admission_with(node("gpu-a", gpus=3, memory=45))
    await decided(admission, pod(memory="10", core="100"))  # one GPU taken
    admission.workers_of = workers(3)
    reason = await waits(admission, worker_pod("big", 0, memory="10", core="100"))
    assert "the 3 workers of MPIJob big are placed all or nothing" in reason
    assert len(admission.ledger) == 1
    # A job of two such workers fits the two GPUs left.
    admission.workers_of = workers(2)
    await decided(admission, worker_pod("pair", 0, memory="10", core="100"))
    assert len(admission.ledger) == 3


async def test_a_hostile_worker_count_is_refused_naming_the_field_without_a_list() -> None:
    admission = await admission_with(node("gpu-a"), node("gpu-b"))
    admission.workers_of = workers(2**31 - 1)
    for dryrun in (False, True):  # the webhook reads one integer and builds no list
        with pytest.raises(kopf.AdmissionError) as refused:
            await admission.mutate(worker_pod("hog", 0), dryrun=dryrun)
        message = str(refused.value)
        assert "spec.mpiReplicaSpecs.Worker.replicas is 2147483647" in message
        # 2 nodes x 4 GPUs of 15 GiB: 7 shares of 2 GiB each, but 4 of 25% each: 32.
        assert "at most 32 shares" in message
    assert len(admission.ledger) == 0
    # The largest job that could ever fit is still placed or waits, never refused.
    admission.workers_of = workers(32)
    await decided(admission, worker_pod("most", 0))
    assert len(admission.ledger) == 32


async def test_a_record_written_by_hand_on_a_pod_without_a_share_holds_nothing() -> None:
    """A plain Pending pod annotated with a record of every GPU: the ledger counts none of it,
    on a watch event or in the listing after a restart."""
    admission = await admission_with(node("gpu-a", gpus=2, memory=30))
    forged = [
        Placed("gpu-a", gpu, "", Share(15, 100), claim=f"forged-{gpu}").dumps() for gpu in (0, 1)
    ]
    squatters = []
    for i, record in enumerate(forged):
        body = {
            "metadata": {
                "name": f"squat-{i}",
                "namespace": "hostile",
                "annotations": {keys.GPU_SHARE: record},
            },
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending"},
        }
        squatters.append(body)
        await admission.on_pod(body, "ADDED")
    # A share pod whose record names another size than it requests is not believed either.
    other = pod(memory="1", core="5")
    other["metadata"] = {
        "name": "liar",
        "namespace": "hostile",
        "annotations": {keys.GPU_SHARE: forged[0]},
    }
    await admission.on_pod(other, "ADDED")
    assert len(admission.ledger) == 0
    victim = pod(memory="1", core="5")
    placed_of(victim, await decided(admission, victim))

    restarted = await admission_with()
    await restarted.rebuild([node("gpu-a", gpus=2, memory=30)], [*squatters, other])
    assert len(restarted.ledger) == 0


async def test_a_record_on_a_gpu_the_node_lacks_blocks_nothing() -> None:
    """A memory-only record on GPU 7 of a 1-GPU node: compute shares still go there."""
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    body = pod(memory="1", core=None)
    body["metadata"] = {
        "name": "ghost",
        "namespace": "hostile",
        "annotations": {keys.GPU_SHARE: Placed("gpu-a", 7, "", Share(1, None)).dumps()},
    }
    await admission.on_pod(body, "ADDED")
    await admission.on_node(node("gpu-a", gpus=1, memory=15), "MODIFIED")  # recounted
    victim = pod(memory="1", core="5")
    placed_of(victim, await decided(admission, victim))
    body["status"] = {"phase": "Succeeded"}
    await admission.on_pod(body, "MODIFIED")  # its release leaves the counts right
    assert admission.ledger.nodes["gpu-a"].compute_pods == 1
    assert admission.ledger.nodes["gpu-a"].memory_only_pods == 0


async def test_a_waiting_pod_keeps_no_record_it_was_sent_with() -> None:
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    body = pod(memory="14", core="50")
    body["metadata"]["annotations"] = {
        keys.GPU_SHARE: Placed("gpu-a", 0, "", Share(14, 50)).dumps(),
        keys.GPU_SHARE_UUID: "all",
    }
    await decided(admission, pod(memory="14", core="50"))
    patched, _ = waiting_of(body, await decided(admission, body))
    assert keys.GPU_SHARE_UUID not in patched["metadata"]["annotations"]


async def test_unadmitted_worker_reservations_lapse() -> None:
    clock = FakeClock()
    admission = await admission_with(node("gpu-a"), clock=clock)
    admission.workers_of = workers(4)
    await decided(admission, worker_pod("train", 0))
    clock.advance(fractional.PENDING_SECONDS + 1)
    await decided(admission, pod())  # any placement expires what lapsed first
    assert len(admission.ledger) == 2  # worker 0 and that pod; the 3 reservations lapsed


async def test_only_nodes_the_pod_may_run_on_are_considered() -> None:
    tainted = node("gpu-b")
    tainted["spec"] = {"taints": [{"key": "team", "value": "x", "effect": "NoSchedule"}]}
    spread = node("gpu-c", binpack=False)
    spread["metadata"]["labels"]["kubernetes.io/hostname"] = "gpu-c"
    admission = await admission_with(node("gpu-a"), tainted, spread)
    body = pod()
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-c"}
    assert placed_of(body, await decided(admission, body))[1].node == "gpu-c"
    affinity = pod()
    affinity["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}
                        ]
                    }
                ]
            }
        }
    }
    # gpu-b's taint is not tolerated
    assert (await waits(admission, affinity)).startswith("no opted-in node")
    affinity["spec"]["tolerations"] = [{"key": "team", "operator": "Exists"}]
    assert placed_of(affinity, await decided(admission, affinity))[1].node == "gpu-b"


async def test_share_gauges_follow_the_ledger() -> None:
    admission = await admission_with(node("gauge-node"))
    body = pod()
    _, record = placed_of(body, await decided(admission, body))
    labels = ("gauge-node", str(record.gpu))
    assert metrics.GPU_SHARE_PERCENTAGE.labels(*labels)._value.get() == 30
    assert metrics.GPU_SHARE_MEMORY.labels(*labels)._value.get() == 2
    assert metrics.GPU_SHARES._value.get() == 1
    seen = {
        **body,
        "metadata": {
            "name": "x",
            "namespace": "default",
            "annotations": {keys.GPU_SHARE: record.dumps()},
        },
    }
    await admission.on_pod(seen, "DELETED")
    assert metrics.GPU_SHARE_PERCENTAGE.labels(*labels)._value.get() == 0
    await admission.on_node(node("gauge-node"), "DELETED")
    samples = [s for m in metrics.GPU_SHARE_PERCENTAGE.collect() for s in m.samples]
    assert not [s for s in samples if s.labels.get("node") == "gauge-node"]


class Patches:
    """The placement patches sent, applied to the pods they name; or a refusal to raise."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.refuse: ApiError | None = None

    async def __call__(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        if self.refuse is not None:
            raise self.refuse
        key = f"{namespace}/{name}"
        self.pods[key] = jsonpatch.apply_patch(self.pods[key], ops)


async def admitted_waiting(
    admission: ShareService, patches: Patches, body: dict[str, Any], name: str
) -> dict[str, Any]:
    """``body`` admitted behind the gate, created as ``name`` and seen by the watch."""
    patched, _ = waiting_of(body, await admission.mutate(body, dryrun=False))
    patched["metadata"].update(
        name=name, uid=f"uid-{name}", creationTimestamp="2026-11-24T19:00:00Z"
    )
    patches.pods[f"{patched['metadata']['namespace']}/{name}"] = patched
    await admission.on_pod(patched, "ADDED")
    return patched


async def test_a_waiting_pod_is_placed_once_a_share_is_freed() -> None:
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    events: list[tuple[str, str, str]] = []
    admission.events = lambda obj, event: events.append(
        (obj["metadata"]["name"], event.reason, event.message)
    )
    patches = Patches()
    first = pod(memory="10", core="50")
    first, _ = placed_of(first, await decided(admission, first))
    first["metadata"]["name"] = "first"
    await admission.on_pod(first, "ADDED")
    await admitted_waiting(admission, patches, pod(memory="10", core="50"), "second")
    assert metrics.GPU_SHARE_WAITING._value.get() == 1
    assert admission.wake.is_set()
    admission.wake.clear()
    assert await admission.place_waiting(patches) == 0
    assert list(admission.waiting) == ["default/second"]
    first["status"] = {"phase": "Succeeded"}
    await admission.on_pod(first, "MODIFIED")
    assert admission.wake.is_set()
    assert await admission.place_waiting(patches) == 1
    second = patches.pods["default/second"]
    record = Placed.loads(second["metadata"]["annotations"][keys.GPU_SHARE])
    assert record is not None
    assert (record.node, record.claim) == ("gpu-a", "pod-uid-second")
    assert keys.GPU_SHARE_WAITING not in second["metadata"]["annotations"]
    assert "schedulingGates" not in second["spec"] or not second["spec"]["schedulingGates"]
    assert second["spec"]["affinity"]["nodeAffinity"]
    assert admission.waiting == {}
    assert metrics.GPU_SHARE_WAITING._value.get() == 0
    assert [e for e in events if e[0] == "second"] == [
        ("second", "GPUShareWaiting", "no GPU of 1 eligible node(s) has 10 GiB and 50% free"),
        ("second", "GPUSharePlaced", "Placed on gpu-a GPU 0; the scheduler may bind it now"),
    ]
    await admission.on_pod(second, "MODIFIED")
    assert admission.ledger.held("pod-uid-second") == record
    # A stale event of the gated pod, then the next pass: the refused patch keeps the hold.
    stale = {
        **second,
        "spec": {**second["spec"], "schedulingGates": [{"name": keys.GPU_SHARE_GATE}]},
    }
    stale["metadata"] = {**second["metadata"], "annotations": {keys.GPU_SHARE_WAITING: "full"}}
    await admission.on_pod(stale, "MODIFIED")
    patches.refuse = ApiError(422, "Invalid", "the test operation failed")
    assert await admission.place_waiting(patches) == 0
    assert admission.ledger.held("pod-uid-second") == record


async def test_a_waiting_pod_that_went_gives_its_hold_back() -> None:
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    patches = Patches()
    nowhere = pod(memory="10", core="50")
    nowhere["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "elsewhere"}
    await admitted_waiting(admission, patches, nowhere, "never")
    blocker = pod(memory="10", core="50")
    blocker, _ = placed_of(blocker, await decided(admission, blocker))
    body = await admitted_waiting(admission, patches, pod(memory="10", core="50"), "gone")
    await admission.on_pod(blocker, "DELETED")
    patches.refuse = ApiError(404, "NotFound", "pods gone not found")
    assert await admission.place_waiting(patches) == 0
    assert len(admission.ledger) == 0
    await admission.on_pod(body, "DELETED")
    assert list(admission.waiting) == ["default/never"]


async def test_waiting_workers_are_placed_together() -> None:
    admission = await admission_with(node("gpu-a", gpus=2, memory=30))
    admission.workers_of = workers(2)
    patches = Patches()
    blocker = pod(memory="15", core="100")
    blocker, _ = placed_of(blocker, await decided(admission, blocker))
    blocker["metadata"]["name"] = "blocker"
    await admission.on_pod(blocker, "ADDED")
    for i in (0, 1):
        body = worker_pod("pair", i, memory="10", core="100")
        patched, reason = waiting_of(body, await decided(admission, body))
        assert "all or nothing" in reason
        patched["metadata"].update(uid=f"uid-{i}", creationTimestamp="2026-11-24T19:00:0{i}Z")
        patches.pods[f"team/pair-worker-{i}"] = patched
        await admission.on_pod(patched, "ADDED")
    assert len(admission.ledger) == 1
    assert await admission.place_waiting(patches) == 0
    await admission.on_pod(blocker, "DELETED")
    assert await admission.place_waiting(patches) == 2
    records = [
        Placed.loads(
            patches.pods[f"team/pair-worker-{i}"]["metadata"]["annotations"][keys.GPU_SHARE]
        )
        for i in (0, 1)
    ]
    assert [r.claim for r in records if r] == [
        f"mpijob/team/pair/uid-pair/worker-{i}" for i in (0, 1)
    ]
    assert {r.gpu for r in records if r} == {0, 1}


def bound(name: str, node_name: str, cpu: str) -> dict[str, Any]:
    """A pod without a share, bound to ``node_name``."""
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


async def test_a_share_goes_only_where_the_node_has_room_for_the_pod_s_other_requests() -> None:
    admission = await admission_with(node("gpu-a"), node("gpu-b"))
    await admission.on_pod(bound("busy", "gpu-a", "63"), "ADDED")
    body = pod()
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    assert placed_of(body, await decided(admission, body))[1].node == "gpu-b"
    # gpu-b now has 62 cpus left, held for the pinned pod before it is even bound.
    await admission.on_pod(bound("busier", "gpu-b", "62"), "ADDED")
    reason = await waits(admission, copy_of(body))
    assert "room for the pod's other requests (cpu, memory, pods)" in reason
    # The busy pod ends: its node has room again, and a waiting pod would be tried.
    patches = Patches()
    await admitted_waiting(admission, patches, copy_of(body), "later")
    admission.wake.clear()
    await admission.on_pod({**bound("busy", "gpu-a", "63"), "status": {"phase": "Succeeded"}}, None)
    assert admission.wake.is_set()
    assert await admission.place_waiting(patches) == 1
    record = Placed.loads(patches.pods["default/later"]["metadata"]["annotations"][keys.GPU_SHARE])
    assert record is not None
    assert record.node == "gpu-a"


async def test_the_listing_after_a_restart_counts_bound_pods_too() -> None:
    restarted = ShareService(clock=FakeClock())
    await restarted.rebuild([node("gpu-a")], [bound("busy", "gpu-a", "64")])
    body = pod()
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m"}
    reason = await waits(restarted, body)
    assert "room for the pod's other requests" in reason


async def test_workers_are_placed_only_where_all_of_them_have_room() -> None:
    admission = await admission_with(node("gpu-a"), node("gpu-b"))
    admission.workers_of = workers(4)
    await admission.on_pod(bound("busy-a", "gpu-a", "60"), "ADDED")
    await admission.on_pod(bound("busy-b", "gpu-b", "60"), "ADDED")
    first = worker_pod("train", 0)
    first["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    _, record = placed_of(first, await decided(admission, first))
    held = [admission.ledger.held(f"mpijob/team/train/uid-train/worker-{i}") for i in range(4)]
    # Four 25% shares would binpack on one GPU, but each node has room for two such pods.
    assert sorted(h.node for h in held if h) == ["gpu-a", "gpu-a", "gpu-b", "gpu-b"]
    assert record == held[0]


def copy_of(body: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(body))


async def test_a_pass_decides_once_for_waiting_pods_of_one_shape() -> None:
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    patches = Patches()
    blocker = pod(memory="15", core="100")
    placed_of(blocker, await decided(admission, blocker))
    for i in range(20):
        await admitted_waiting(admission, patches, pod(memory="10", core="50"), f"same-{i}")
    await admitted_waiting(admission, patches, pod(memory="1", core="5"), "other")
    decisions = []
    place = admission._place

    def counting(*args: Any, **kwargs: Any) -> Placed | str:
        decisions.append(args[0]["metadata"]["name"])
        return place(*args, **kwargs)

    admission._place = counting  # type: ignore[method-assign]
    assert await admission.place_waiting(patches) == 0
    assert decisions == ["same-0", "other"]


async def test_a_gate_removed_by_hand_is_reported_once() -> None:
    admission = await admission_with(node("gpu-a", gpus=1, memory=15))
    posted: list[tuple[str, str]] = []
    admission.events = lambda obj, event: posted.append((event.type, event.reason))
    patches = Patches()
    blocker = pod(memory="15", core="100")
    placed_of(blocker, await decided(admission, blocker))
    body = await admitted_waiting(admission, patches, pod(memory="10", core="50"), "escaped")
    body["spec"]["schedulingGates"] = []
    body["spec"]["nodeName"] = "gpu-a"
    await admission.on_pod(body, "MODIFIED")
    await admission.on_pod(body, "MODIFIED")
    assert posted == [("Normal", "GPUSharePlaced"), ("Warning", "GPUShareGateRemoved")]
    assert admission.waiting == {}
    assert admission.room.holds("default/escaped")  # it takes room on its node like any pod


async def test_the_webhook_gives_the_configured_runtime_class_to_a_share_pod_naming_none() -> None:
    admission = ShareService(clock=FakeClock(), runtime_class="nvidia")
    await admission.on_node(node("gpu-a"), None)
    body = pod()
    patched, _ = waiting_of(body, await admission.mutate(body, dryrun=False))
    assert patched["spec"]["runtimeClassName"] == "nvidia"
    plain = await admission_with(node("gpu-b"))
    patched, _ = waiting_of(body, await plain.mutate(body, dryrun=False))
    assert "runtimeClassName" not in patched["spec"]


@virtual_time
async def test_only_the_leader_places() -> None:
    """The standby's webhook gates; its placement pass is work that needs the Lease, which the
    manager starts only once this replica leads (another replica holds it for 15 s here)."""
    admission = await admission_with(node("gpu-a"))
    patches = Patches()
    await admitted_waiting(admission, patches, pod(), "gated")
    lease_kube = FakeKube(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ops"}},
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "lock", "namespace": "ops"},
            "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15},
        },
    )
    elector = LeaderElector(namespace="ops", name="lock", kube=lease_kube, identity="me")
    manager = Manager(
        [Runnable("gpu-share-placement", lambda: admission.run_placement(patches), True)],
        elector=elector,
        exit=lambda status: None,
    )
    manager.start()
    await asyncio.sleep(10)
    assert keys.GPU_SHARE not in patches.pods["default/gated"]["metadata"]["annotations"]
    assert len(admission.ledger) == 0
    await asyncio.sleep(10)  # the other's Lease unchanged for 15 s: this replica takes it
    assert elector.holds()
    admission.wake.set()
    await asyncio.sleep(1)
    await manager.stop()
    assert keys.GPU_SHARE in patches.pods["default/gated"]["metadata"]["annotations"]


def test_the_webhooks_require_the_api_server_s_client_certificate(tmp_path: Any) -> None:
    import ssl

    cert = tls.serving_certificate("ns", "svc", tmp_path)
    settings = kopf.OperatorSettings()
    webhook.configure_server(settings, cert, 9443, client_ca=str(cert.certfile))
    server = settings.admission.server
    assert isinstance(server, kopf.WebhookServer)
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert server.verify_cafile == str(cert.certfile)
    webhook.configure_server(settings, cert, 9443)
    assert settings.admission.server.verify_mode is None  # type: ignore[union-attr]


def test_a_mounted_certificate_s_ca_is_the_bundle(tmp_path: Any) -> None:
    made = tls.serving_certificate("ns", "svc", tmp_path)
    assert tls.mounted_certificate(tmp_path).ca_bundle == made.ca_bundle
    (tmp_path / "ca.crt").write_bytes(b"CA PEM")
    mounted = tls.mounted_certificate(tmp_path)
    assert base64.b64decode(mounted.ca_bundle) == b"CA PEM"
    assert mounted.certfile == tmp_path / "tls.crt"

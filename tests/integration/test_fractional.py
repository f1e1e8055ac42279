"""GPU shares on the local cluster: the agent's node status, webhooks, ledger and scheduler.

The module adds three simulated nodes of its own (``share-node-0..2``, kwok, 4 GPUs of 15 GiB
each, so 60 GiB and 400% per node, as the agent reports them for the seed's 4 x 15 GiB cards),
all ``ack.node.gpu.schedule=core_mem``, nodes 0 and 2 ``ack.node.gpu.placement=binpack``, node 1
spread. Their status is patched by ``mpijob-agent --once --share-gpus --no-mps --simulate``, as
the agent does. Each test starts its own operator with ``--fractional-gpus``, its webhooks
reached on loopback (the local API server cannot reach Service IPs). At the end the nodes, the
webhook configurations and the ``nvidia`` RuntimeClass (when this module made it) are removed,
so later modules see the cluster as it was.
"""

from __future__ import annotations

import base64
import collections
import copy
import json
import os
import random
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mpijob import keys
from mpijob.shares.pod_edits import ADMITTED, MUTATE_ID, WEBHOOK_CONFIGURATION, client_env
from mpijob.shares.request import Placed, Share
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess, free_port
from support.realnode import ROLE, exit_codes, in_node, node_mount_points, ready_real_node
from support.tenants import bind_tenant
from support.wait import wait_until

pytestmark = pytest.mark.integration

NODES = ("share-node-0", "share-node-1", "share-node-2")
BINPACK = {"share-node-0", "share-node-2"}
TOPOLOGY = "rtx8000-4x"
GPUS = 4
GPU_GIB = 15
#: MPIJob examples that need the share webhooks: run here, not by test_examples.py.
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").glob("*.yaml")
    if keys.GPU_MEM_RESOURCE in p.read_text() and f"kind: {keys.KIND}" in p.read_text()
)


def node_body(name: str) -> dict[str, Any]:
    """The local cluster's simulated node manifest, as a core_mem node without whole GPUs."""
    from hack import cluster as local

    body: dict[str, Any] = local.node_manifest(0, TOPOLOGY, GPUS)
    body["metadata"]["name"] = name
    labels = body["metadata"]["labels"]
    labels["kubernetes.io/hostname"] = name
    labels[keys.NODE_GPU_SCHEDULE_LABEL] = keys.NODE_GPU_SCHEDULE_CORE_MEM
    if name in BINPACK:
        labels[keys.NODE_GPU_PLACEMENT_LABEL] = keys.NODE_GPU_PLACEMENT_BINPACK
    del body["metadata"]["annotations"][keys.GPU_TOPOLOGY]  # the agent publishes it
    resources = {k: v for k, v in body["status"]["capacity"].items() if k != keys.GPU_RESOURCE}
    body["status"] = {"capacity": resources, "allocatable": dict(resources)}
    return body


def run_agent(cluster: Cluster, node: str) -> None:
    """What the agent's DaemonSet pod on ``node`` does, once, without MPS daemons."""
    subprocess.run(
        [
            str(ROOT / ".venv/bin/mpijob-agent"),
            "--once",
            "--share-gpus",
            "--no-mps",
            "--no-check-pods",
            "--simulate",
            TOPOLOGY,
            "--simulate-memory",
            str(GPU_GIB * 1024),
        ],
        env={**os.environ, "NODE_NAME": node, "KUBECONFIG": str(cluster.kubeconfig)},
        check=True,
        capture_output=True,
    )


def delete_webhook_configurations(cluster: Cluster) -> None:
    cluster.kubectl(
        "delete",
        "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        WEBHOOK_CONFIGURATION,
        "--ignore-not-found",
    )


@pytest.fixture(scope="module")
def share_nodes(crds: Cluster) -> Iterator[Cluster]:
    cluster = crds
    delete_webhook_configurations(cluster)
    made_runtime_class = False
    try:
        node_api = client.NodeV1Api(cluster.api)
        try:
            node_api.read_runtime_class("nvidia")
        except ApiException as e:
            if e.status != 404:
                raise
            node_api.create_runtime_class(
                client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="nvidia"), handler="nvidia")
            )
            made_runtime_class = True
        for name in NODES:
            cluster.kubectl("delete", "node", name, "--ignore-not-found")
            cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(node_body(name)))

        def ready() -> bool:
            nodes = [cluster.core.read_node(n) for n in NODES]
            return all(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in nodes
            )

        wait_until(ready, timeout=60, what="the share nodes Ready")
        for name in NODES:
            run_agent(cluster, name)
        yield cluster
    finally:
        delete_webhook_configurations(cluster)
        for name in NODES:
            cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")
        if made_runtime_class:
            client.NodeV1Api(cluster.api).delete_runtime_class("nvidia")


def share_pods(cluster: Cluster, namespace: str | None = None) -> list[client.V1Pod]:
    pods = (
        cluster.core.list_namespaced_pod(namespace).items
        if namespace
        else cluster.core.list_pod_for_all_namespaces().items
    )
    return [p for p in pods if keys.GPU_SHARE in (p.metadata.annotations or {})]


def placed(pod: client.V1Pod) -> Placed:
    record = Placed.loads(pod.metadata.annotations[keys.GPU_SHARE])
    assert record is not None, pod.metadata.annotations[keys.GPU_SHARE]
    return record


@pytest.fixture
def shares(
    share_nodes: Cluster, namespace: str, start_operator: Callable[..., OperatorProcess]
) -> Callable[..., OperatorProcess]:
    """Start (or restart) the operator with --fractional-gpus once no share pod of an earlier
    test is left (its ledger is rebuilt from every pod; it watches only this namespace)."""
    wait_until(
        lambda: not [p for p in share_pods(share_nodes) if p.metadata.namespace != namespace],
        timeout=120,
        what="no share pods left from earlier tests",
    )

    def start(*extra: str) -> OperatorProcess:
        port = free_port()
        op = start_operator(
            "--fractional-gpus",
            "--webhook-port",
            str(port),
            "--webhook-url",
            f"https://127.0.0.1:{port}",
            "--webhook-client-ca",
            str(pki(share_nodes) / "webhook-client-ca.crt"),
            *extra,
        )
        wait_until(lambda: webhook_answers(share_nodes, namespace), timeout=60, what="the webhooks")
        return op

    return start


def pki(cluster: Cluster) -> Path:
    """The local cluster's keys (hack/cluster.py): the API server's webhook client certificate
    and the CA the operator is given to verify it."""
    return cluster.kubeconfig.parent / "pki"


def webhook_answers(cluster: Cluster, namespace: str) -> bool:
    try:
        cluster.core.create_namespaced_pod(namespace, pod_body("probe", 1, 5), dry_run="All")
    except ApiException:
        return False
    return True


def pod_body(
    name: str,
    memory: int,
    percentage: int | None,
    node: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {keys.GPU_MEM_RESOURCE: str(memory)}
    if percentage is not None:
        limits[keys.GPU_CORE_PERCENTAGE_RESOURCE] = str(percentage)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda-sample", "resources": {"limits": limits}}]
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> client.V1Pod:
    return cluster.core.create_namespaced_pod(namespace, body)


def refusal(cluster: Cluster, namespace: str, body: dict[str, Any]) -> ApiException:
    with pytest.raises(ApiException) as caught:
        create(cluster, namespace, body)
    return caught.value


def wait_running(cluster: Cluster, namespace: str, names: list[str]) -> list[client.V1Pod]:
    def probe() -> list[client.V1Pod] | None:
        pods = [cluster.core.read_namespaced_pod(n, namespace) for n in names]
        return pods if all(p.status.phase == "Running" for p in pods) else None

    return wait_until(probe, timeout=120, what=f"{len(names)} pods Running")


def gated(pod: client.V1Pod) -> bool:
    """The pod waits behind our gate, holding no share, and the scheduler says so."""
    gates = [g.name for g in pod.spec.scheduling_gates or []]
    scheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
    return (
        gates == [keys.GPU_SHARE_GATE]
        and keys.GPU_SHARE not in (pod.metadata.annotations or {})
        and bool(scheduled)
        and scheduled[0].reason == "SchedulingGated"
        and not pod.spec.node_name
    )


def decided(pod: client.V1Pod) -> bool:
    """The operator's placement pass has looked at the pod: placed, or told why it waits."""
    annotations = pod.metadata.annotations or {}
    return keys.GPU_SHARE in annotations or annotations.get(keys.GPU_SHARE_WAITING) not in (
        None,
        ADMITTED,
    )


def wait_gated(cluster: Cluster, namespace: str, name: str) -> client.V1Pod:
    """The pod waits behind the gate, with the reason the placement pass wrote."""
    return wait_until(
        lambda: (
            (p := cluster.core.read_namespaced_pod(name, namespace))
            and gated(p)
            and decided(p)
            and p
        ),
        timeout=60,
        what=f"{name} SchedulingGated",
    )


def gpu_sums(pods: list[client.V1Pod]) -> dict[tuple[str, int], list[int]]:
    """(node, GPU) -> [GiB, percent, clients] summed over the pods' share annotations."""
    sums: dict[tuple[str, int], list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for pod in pods:
        record = placed(pod)
        total = sums[(record.node, record.gpu)]
        total[0] += record.share.memory_gib
        total[1] += record.share.percentage or 0
        total[2] += record.share.clients
    return dict(sums)


def assert_not_overcommitted(pods: list[client.V1Pod]) -> None:
    for (node, gpu), (memory, percentage, clients) in gpu_sums(pods).items():
        assert memory <= GPU_GIB, f"{node}/{gpu} holds {memory} GiB of {GPU_GIB}"
        assert percentage <= 100, f"{node}/{gpu} holds {percentage}%"
        assert clients <= keys.MPS_MAX_CLIENTS


def test_simulated_node_reports_the_seeds_fields(share_nodes: Cluster) -> None:
    """4 GPUs of 15 GiB: gpu-count 4, gpu-mem 60, gpu-core.percentage 400, in both."""
    wanted = {
        keys.GPU_COUNT_RESOURCE: "4",
        keys.GPU_MEM_RESOURCE: "60",
        keys.GPU_CORE_PERCENTAGE_RESOURCE: "400",
    }
    for name in NODES:
        status = share_nodes.core.read_node(name).status
        for section in (status.allocatable, status.capacity):
            assert {k: v for k, v in section.items() if k.startswith("aliyun.com/")} == wanted


def test_cuda_sample_job_runs_with_its_gpu_env_and_annotation(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    shares()
    body = yaml.safe_load((ROOT / "examples/cuda-sample.yaml").read_text())
    template = body["spec"]["template"]
    template["metadata"].setdefault("annotations", {})[keys.SIM_SUCCEED_AFTER] = "3s"
    share_nodes.apply(body, namespace=namespace)

    def pod() -> client.V1Pod | None:
        pods = share_nodes.core.list_namespaced_pod(namespace, label_selector="app=cuda-sample")
        found = pods.items[0] if pods.items else None
        return found if found is not None and found.spec.node_name else None

    running = wait_until(pod, timeout=60, what="the cuda-sample pod bound")
    record = placed(running)
    assert running.spec.node_name == record.node
    assert record.share.memory_gib == 2
    assert record.share.percentage == 30
    topology = json.loads(
        share_nodes.core.read_node(record.node).metadata.annotations[keys.GPU_TOPOLOGY]
    )
    assert record.uuid == topology["gpus"][record.gpu]["uuid"]
    container = running.spec.containers[0]
    assert running.metadata.annotations[keys.GPU_SHARE_UUID] == record.uuid
    # The env names no GPU: the kubelet reads the UUID from the annotation at container start.
    written = {
        e.name: e.value_from.field_ref.field_path if e.value_from else e.value
        for e in container.env
    }
    assert written == {
        keys.ENV_NVIDIA_VISIBLE_DEVICES: f"metadata.annotations['{keys.GPU_SHARE_UUID}']",
        keys.ENV_MPS_PIPE_DIRECTORY: f"{keys.MPS_ROOT}/$({keys.ENV_NVIDIA_VISIBLE_DEVICES})/pipe",
        keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT: "0=2G",
        keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE: "30",
    }
    assert [(m.mount_path, m.read_only) for m in container.volume_mounts or []][:1] == [
        (keys.MPS_ROOT, True)
    ]
    assert not [v for v in running.spec.volumes if v.host_path]
    assert [v.csi.driver for v in running.spec.volumes if v.csi] == [keys.MPS_CSI_DRIVER]

    def succeeded() -> bool:
        job = share_nodes.batch.read_namespaced_job("cuda-sample", namespace)
        return bool(job.status.succeeded)

    wait_until(succeeded, timeout=60, what="the cuda-sample Job succeeded")


#: Seed 001's Job as its user wrote it: no runtimeClassName (examples/cuda-sample.yaml is this
#: with the class added by hand, and a comment).
SEED_001 = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: cuda-sample
spec:
  backoffLimit: 0
  template:
    metadata:
      labels:
        app: cuda-sample
    spec:
      restartPolicy: Never
      containers:
      - name: cuda-sample
        image: nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.7.1
        args: ["-benchmark", "-numbodies=512000"]
        resources:
          limits:
            aliyun.com/gpu-mem: 2
            aliyun.com/gpu-core.percentage: 30
"""


def test_seed_001_cuda_sample_unchanged_gets_its_share_and_the_runtime_class(
    share_nodes: Cluster, namespace: str, shares: Callable[..., OperatorProcess]
) -> None:
    """Seed 001 as typed: `kubectl label node <node> ack.node.gpu.schedule=core_mem
    ack.node.gpu.placement=binpack`, then `kubectl apply -f cuda-sample.yaml`. The Job is
    admitted unchanged, placed on the labelled node with the seed's 2 GiB and 30%, and, with
    `--gpu-share-runtime-class nvidia` (as the fractional-gpus overlay runs), its pod gets the
    RuntimeClass under which the nvidia runtime reads the share's NVIDIA_VISIBLE_DEVICES."""
    shares("--gpu-share-runtime-class", "nvidia")
    labels = {
        keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM,
        keys.NODE_GPU_PLACEMENT_LABEL: keys.NODE_GPU_PLACEMENT_BINPACK,
    }
    node = "share-node-0"
    out = share_nodes.kubectl(
        "label", "node", node, *(f"{k}={v}" for k, v in labels.items()), "--overwrite"
    )
    assert out.strip() in (f"node/{node} labeled", f"node/{node} not labeled"), out
    assert labels.items() <= share_nodes.core.read_node(node).metadata.labels.items()
    seed = yaml.safe_load(SEED_001)
    out = share_nodes.kubectl("apply", "-n", namespace, "-f", "-", input=SEED_001)
    assert out.strip() == "job.batch/cuda-sample created"
    job = share_nodes.batch.read_namespaced_job("cuda-sample", namespace)
    assert job.spec.template.spec.runtime_class_name is None  # the Job itself is not changed

    def bound() -> client.V1Pod | None:
        found = share_nodes.core.list_namespaced_pod(namespace, label_selector="app=cuda-sample")
        pod = found.items[0] if found.items else None
        return pod if pod is not None and pod.spec.node_name else None

    pod = wait_until(bound, timeout=60, what="the seed's cuda-sample pod bound")
    record = placed(pod)
    assert pod.spec.node_name == record.node
    assert record.node in NODES
    assert (record.share.memory_gib, record.share.percentage) == (2, 30)
    assert pod.spec.runtime_class_name == "nvidia"
    container = pod.spec.containers[0]
    wanted = seed["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert container.resources.limits == {k: str(v) for k, v in wanted.items()}
    env = {e.name: e.value for e in container.env if e.value}
    assert env[keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=2G"
    assert env[keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "30"


def test_binpack_fills_one_gpu_first_and_spread_uses_different_gpus(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    shares()
    packed = [f"packed-{i}" for i in range(4)]
    for name in packed:
        create(share_nodes, namespace, pod_body(name, 2, 30, node="share-node-0"))
    spread = [f"spread-{i}" for i in range(3)]
    for name in spread:
        create(share_nodes, namespace, pod_body(name, 2, 30, node="share-node-1"))
    pods = {p.metadata.name: p for p in wait_running(share_nodes, namespace, packed + spread)}
    for name in packed:
        assert pods[name].spec.node_name == "share-node-0" == placed(pods[name]).node
    # Three 30 % shares fill one GPU, the fourth takes another. Which three is not fixed: the
    # pods are placed in the order their watch events are handled, which may differ from the
    # order they were created in within one second.
    on_gpu = collections.defaultdict(list)
    for name in packed:
        on_gpu[placed(pods[name]).gpu].append(name)
    assert sorted(len(names) for names in on_gpu.values()) == [1, 3], dict(on_gpu)
    full_gpu, filled = next((gpu, names) for gpu, names in on_gpu.items() if len(names) == 3)
    gpus = [placed(pods[n]).gpu for n in spread]
    assert sorted(set(gpus)) == sorted(gpus), gpus
    assert {pods[n].spec.node_name for n in spread} == {"share-node-1"}
    # The console shows each GPU's shares and their holders.
    shown = subprocess.run(
        [str(ROOT / ".venv/bin/mpijob"), "topology", "share-node-0", "-n", namespace],
        env={**os.environ, "KUBECONFIG": str(share_nodes.kubeconfig)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {line.split()[0]: line for line in shown.splitlines() if line.startswith("GPU")}
    full = rows[f"GPU{full_gpu}"].split()
    assert full[1:3] == ["6/15", "90/100"], shown
    assert all(f"{namespace}/{name}" in rows[f"GPU{full_gpu}"] for name in filled), shown


@pytest.mark.parametrize("percentage", [33, 105])
def test_a_bad_percentage_is_refused_naming_the_field(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess], percentage: int
) -> None:
    shares()
    error = refusal(share_nodes, namespace, pod_body("bad", 2, percentage))
    message = json.loads(error.body)["message"]
    assert f"spec.containers[0].resources.limits[{keys.GPU_CORE_PERCENTAGE_RESOURCE}]" in message
    assert "multiple of 5" in message
    assert share_pods(share_nodes, namespace) == []


def test_memory_only_and_compute_shares_never_share_a_node(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    shares()
    create(share_nodes, namespace, pod_body("compute", 2, 30, node="share-node-2"))
    create(share_nodes, namespace, pod_body("memory-there", 2, None, node="share-node-2"))
    waiting = wait_gated(share_nodes, namespace, "memory-there")
    assert "never mix" in waiting.metadata.annotations[keys.GPU_SHARE_WAITING]
    create(share_nodes, namespace, pod_body("memory", 2, None))
    create(share_nodes, namespace, pod_body("compute-2", 2, 30))
    pods = wait_running(share_nodes, namespace, ["compute", "memory", "compute-2"])
    kinds: dict[str, set[bool]] = collections.defaultdict(set)
    for pod in pods:
        assert pod.spec.node_name == placed(pod).node
        kinds[pod.spec.node_name].add(placed(pod).share.with_compute)
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert kinds["share-node-2"] == {True}
    assert gated(share_nodes.core.read_namespaced_pod("memory-there", namespace))
    # Once no compute share is left there, the memory-only pod is placed there.
    for pod in pods:
        if pod.spec.node_name == "share-node-2":
            share_nodes.core.delete_namespaced_pod(
                pod.metadata.name, namespace, grace_period_seconds=0
            )
    (there,) = wait_running(share_nodes, namespace, ["memory-there"])
    assert there.spec.node_name == placed(there).node == "share-node-2"
    assert keys.GPU_SHARE_WAITING not in there.metadata.annotations


def test_concurrent_pods_never_overcommit_a_gpu(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    """100 pods of mixed sizes created 20 at a time: more than the 12 GPUs hold."""
    shares()
    rng = random.Random(11)
    sizes = [(rng.choice([1, 2, 3, 4, 6]), rng.choice([10, 20, 25, 30, 50])) for _ in range(100)]

    def make(i: int) -> tuple[str, int]:
        memory, percentage = sizes[i]
        try:
            create(share_nodes, namespace, pod_body(f"p-{i}", memory, percentage))
        except ApiException as e:
            return e.body, e.status
        return f"p-{i}", 201

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(make, range(100)))
    # Every pod is admitted, behind the gate until the operator places it or tells it why not.
    assert {status for _, status in results} == {201}, results
    names = [name for name, _ in results]

    def settled() -> tuple[list[client.V1Pod], list[client.V1Pod]] | None:
        pods = [share_nodes.core.read_namespaced_pod(n, namespace) for n in names]
        running = [p for p in pods if p.status.phase == "Running"]
        waiting = [p for p in pods if gated(p) and decided(p)]
        return (running, waiting) if len(running) + len(waiting) == len(pods) else None

    running, waiting = wait_until(settled, timeout=120, what="every pod Running or gated")
    assert 20 < len(running) < 100
    for pod in running:
        assert pod.spec.node_name == placed(pod).node
    assert_not_overcommitted(running)
    assert sum(p[1] for p in gpu_sums(running).values()) > 800  # the GPUs really filled up
    # The running pods finish: the waiting ones take their place, still within every GPU.
    for pod in running:
        share_nodes.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    names = [p.metadata.name for p in waiting]

    def refilled() -> tuple[list[client.V1Pod], list[client.V1Pod]] | None:
        found = settled()
        if found is None:
            return None
        full = sum(p[1] for p in gpu_sums(found[0]).values()) > 800
        return found if full or not found[1] else None

    second, still = wait_until(refilled, timeout=120, what="the waiting pods placed in turn")
    assert_not_overcommitted(second)
    assert len(second) + len(still) == len(waiting)


def test_ledger_comes_back_after_sigkill(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    first = shares()
    before = [f"before-{i}" for i in range(3)]
    for name in before:
        create(share_nodes, namespace, pod_body(name, 2, 30, node="share-node-0"))
    held = {placed(p).gpu for p in wait_running(share_nodes, namespace, before)}
    assert len(held) == 1
    wait_until(lambda: first.metric("mpi_operator_gpu_share_percentage") == 90, what="metric 90%")
    first.kill()
    second = shares()
    assert second.metric("mpi_operator_gpu_share_percentage") == 90
    after = [f"after-{i}" for i in range(4)]
    for name in after:
        create(share_nodes, namespace, pod_body(name, 2, 30, node="share-node-0"))
    pods = wait_running(share_nodes, namespace, before + after)
    assert_not_overcommitted(pods)
    assert not {placed(p).gpu for p in pods[3:]} & held


def fractional_job(name: str, memory: int, percentage: int, node: str | None) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples/pytorch-fractional.yaml").read_text())
    body["metadata"]["name"] = name
    worker = body["spec"]["mpiReplicaSpecs"][keys.REPLICA_WORKER]["template"]
    limits = worker["spec"]["containers"][0]["resources"]["limits"]
    limits[keys.GPU_MEM_RESOURCE] = memory
    limits[keys.GPU_CORE_PERCENTAGE_RESOURCE] = percentage
    del worker["spec"]["affinity"]
    if node:
        worker["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def test_mpijob_workers_are_placed_all_or_nothing(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    op = shares()
    mpijobs = MPIJobs(share_nodes, namespace)
    # All four fit: each holds its reserved share, under the job's claims.
    mpijobs.create(fractional_job("fits", 2, 25, "share-node-0"))
    names = [f"fits-worker-{i}" for i in range(4)]
    workers = wait_running(share_nodes, namespace, names)
    uid = mpijobs.get("fits")["metadata"]["uid"]
    assert [placed(w).claim for w in workers] == [
        f"mpijob/{namespace}/fits/{uid}/worker-{i}" for i in range(4)
    ]
    assert all(placed(w).share.percentage == 25 for w in workers)
    assert_not_overcommitted(workers)
    # Four whole-GPU workers where three GPUs are free: all wait, none holds a share.
    create(share_nodes, namespace, pod_body("blocker", 2, 10, node="share-node-1"))
    wait_running(share_nodes, namespace, ["blocker"])
    mpijobs.create(fractional_job("too-big", 14, 100, "share-node-1"))
    big = [f"too-big-worker-{i}" for i in range(4)]
    for name in big:
        reason = wait_gated(share_nodes, namespace, name).metadata.annotations
        assert "placed all or nothing" in reason[keys.GPU_SHARE_WAITING], reason
    assert "all or nothing" in op.logs()
    # Nothing is held for it: the three free GPUs take three such pods.
    whole = [f"whole-{i}" for i in range(3)]
    for name in whole:
        create(share_nodes, namespace, pod_body(name, 14, 100, node="share-node-1"))
    wait_running(share_nodes, namespace, whole)
    assert all(gated(share_nodes.core.read_namespaced_pod(n, namespace)) for n in big)
    # Once the node's four GPUs are free, the four workers are placed together.
    for name in ["blocker", *whole]:
        share_nodes.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    placed_workers = wait_running(share_nodes, namespace, big)
    assert sorted(placed(w).gpu for w in placed_workers) == [0, 1, 2, 3]
    assert {w.spec.node_name for w in placed_workers} == {"share-node-1"}


def test_a_pod_that_fits_nowhere_waits_and_is_placed_after_a_restart(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    first = shares()
    full = [f"full-{i}" for i in range(GPUS)]
    for name in full:
        create(share_nodes, namespace, pod_body(name, GPU_GIB, 100, node="share-node-1"))
    held = {p.metadata.name: placed(p).gpu for p in wait_running(share_nodes, namespace, full)}
    create(share_nodes, namespace, pod_body("waiter", 2, 30, node="share-node-1"))
    waiting = wait_gated(share_nodes, namespace, "waiter")
    assert waiting.metadata.annotations[keys.GPU_SHARE_WAITING] == (
        "no GPU of 1 eligible node(s) has 2 GiB and 30% free"
    )
    assert waiting.status.phase == "Pending"

    def events(count: int) -> dict[str, str] | None:
        found = share_nodes.core.list_namespaced_event(
            namespace, field_selector="involvedObject.kind=Pod,involvedObject.name=waiter"
        ).items
        ours = {e.reason: e.message for e in found if e.reason.startswith("GPUShare")}
        return ours if len(ours) == count else None

    # The wait is told once, annotation first, then its Event: the kill comes after both, or a
    # kill between them would leave the Event to no one (the restarted operator finds the
    # annotation already saying it).
    wait_until(lambda: events(1), timeout=30, what="the waiter's GPUShareWaiting Event")
    # A waiting pod holds nothing: the restarted operator finds it by its watch.
    first.kill()
    shares()
    share_nodes.core.delete_namespaced_pod("full-2", namespace, grace_period_seconds=0)
    (waiter,) = wait_running(share_nodes, namespace, ["waiter"])
    assert placed(waiter).node == waiter.spec.node_name == "share-node-1"
    assert placed(waiter).gpu == held["full-2"]
    assert keys.GPU_SHARE_WAITING not in waiter.metadata.annotations
    assert not waiter.spec.scheduling_gates

    posted = wait_until(lambda: events(2), timeout=30, what="the waiter's two Events")
    assert (
        posted[keys.REASON_GPU_SHARE_WAITING]
        == (waiting.metadata.annotations[keys.GPU_SHARE_WAITING])
    )
    placed_on = f"Placed on share-node-1 GPU {held['full-2']} (GPU-"
    assert posted[keys.REASON_GPU_SHARE_PLACED].startswith(placed_on)
    assert_not_overcommitted(
        [
            waiter,
            *(share_nodes.core.read_namespaced_pod(n, namespace) for n in full if n != "full-2"),
        ]
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_mpijob_with_fractional_workers_succeeds(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess], path: Any
) -> None:
    """As test_examples.py runs the others: applied as written, the launcher told to end."""
    shares()
    body = yaml.safe_load(path.read_text())
    name = body["metadata"]["name"]
    job = copy.deepcopy(body)
    launcher = job["spec"]["mpiReplicaSpecs"][keys.REPLICA_LAUNCHER]["template"]
    launcher.setdefault("metadata", {}).setdefault("annotations", {})[keys.SIM_SUCCEED_AFTER] = "5s"
    mpijobs = MPIJobs(share_nodes, namespace)
    mpijobs.create(job)
    replicas = body["spec"]["mpiReplicaSpecs"][keys.REPLICA_WORKER]["replicas"]
    workers = wait_running(share_nodes, namespace, [f"{name}-worker-{i}" for i in range(replicas)])
    # The example keeps off binpack nodes: the one spread node, one GPU per worker.
    assert {placed(w).node for w in workers} == {"share-node-1"}
    assert len({placed(w).gpu for w in workers}) == replicas
    mpijobs.wait_condition(name, "Succeeded", timeout=180)


def test_a_share_goes_only_to_a_node_with_room_for_the_pods_cpu(
    share_nodes: Cluster, namespace: str, shares: Callable[[], OperatorProcess]
) -> None:
    """A plain pod bound to the spread node takes 95 of its 96 cpus: a share pod asking 2 cpus
    there waits (pinned, it would stay Pending on the node holding its share), and is placed
    once the plain pod is gone."""
    shares()
    plain = pod_body("cpu-hog", 1, None, node="share-node-1")
    plain["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "95"}}
    create(share_nodes, namespace, plain)
    wait_running(share_nodes, namespace, ["cpu-hog"])
    body = pod_body("needs-cpu", 2, 30, node="share-node-1")
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    create(share_nodes, namespace, body)
    reason = wait_gated(share_nodes, namespace, "needs-cpu").metadata.annotations
    assert "room for the pod's other requests (cpu, memory, pods)" in reason[keys.GPU_SHARE_WAITING]
    share_nodes.core.delete_namespaced_pod("cpu-hog", namespace, grace_period_seconds=0)
    (pod,) = wait_running(share_nodes, namespace, ["needs-cpu"])
    assert pod.spec.node_name == placed(pod).node == "share-node-1"


#: Prints what the container was started with, once its GPU's pipe directory is there.
SHOW_ENV = """
n=0; until [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] || [ $n -ge 300 ]; do sleep 0.1; n=$((n+1)); done
env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_MPS_)' | sort
[ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && echo pipe-found
touch "$CUDA_MPS_PIPE_DIRECTORY/probe" 2>/dev/null && echo writable || echo read-only
echo "in-root: $(cd /run/mpijob/mps && find . | sort | tr '\\n' ' ')"
"""

CSI_DRIVER = ROOT / "manifests" / "base" / "csi-driver.yaml"


@pytest.fixture
def real_csi(share_nodes: Cluster) -> Iterator[str]:
    """A Ready real node whose kubelet has the agent's CSI driver registered; its name."""
    real = ready_real_node(share_nodes)
    csi = serve_csi(share_nodes, real)
    try:
        yield real
    finally:
        csi.terminate()
        csi.wait(timeout=30)


def serve_csi(cluster: Cluster, node: str) -> subprocess.Popen[bytes]:
    """What the MPS agent's csi container does on ``node``: the CSI driver, registered with the
    real node's kubelet through its plugin watcher (the CSIDriver object applied first)."""
    cluster.kubectl("apply", "--server-side", "-f", str(CSI_DRIVER))
    argv, kubelet = in_node(node, [str(ROOT / ".venv/bin/mpijob-agent-csi"), "--node-name", node])
    log = ROOT / ".cluster" / "logs" / "mpijob-agent-csi.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [*argv, "--kubelet-dir", kubelet],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )

    def registered() -> bool:
        assert process.poll() is None, log.read_text()[-2000:]
        try:
            csinode = client.StorageV1Api(cluster.api).read_csi_node(node)
        except ApiException:
            return False
        return keys.MPS_CSI_DRIVER in [d.name for d in csinode.spec.drivers or []]

    wait_until(registered, timeout=60, what=f"the kubelet of {node} registering the CSI driver")
    return process


@pytest.mark.realnode
def test_a_real_container_placed_after_waiting_starts_with_its_gpu_env(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    real_csi: str,
) -> None:
    """On the real node (kubelet, containerd): a pod admitted while no node could take it is
    placed once the node opts in, and its container starts with the GPU's UUID read from the
    annotation, the pipe directory of that GPU's daemon and its limits. The MPS root it sees is
    the agent's CSI volume: that one pipe directory, read-only, and no other GPU's."""
    real = real_csi
    shares()
    root = Path(keys.MPS_ROOT)
    made_root = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    body = pod_body("sees-its-gpu", 2, 30)
    spec = body["spec"]
    spec.update(
        restartPolicy="Never",
        nodeSelector={ROLE: "true"},
        tolerations=[{"key": ROLE, "operator": "Exists", "effect": "NoSchedule"}],
    )
    container = spec["containers"][0]
    container.update(
        image="mpioperator/mpi-pi:openmpi",
        imagePullPolicy="IfNotPresent",
        command=["sh", "-c", SHOW_ENV],
    )
    container["resources"]["limits"].update(cpu="100m", memory="64Mi")
    made: list[Path] = []
    try:
        create(share_nodes, namespace, body)
        waiting = wait_gated(share_nodes, namespace, "sees-its-gpu")
        assert waiting.metadata.annotations[keys.GPU_SHARE_WAITING].startswith("no opted-in node")
        share_nodes.kubectl(
            "label",
            "node",
            real,
            f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_CORE_MEM}",
        )
        run_agent(share_nodes, real)
        topology = json.loads(
            share_nodes.core.read_node(real).metadata.annotations[keys.GPU_TOPOLOGY]
        )
        for gpu in topology["gpus"]:
            pipe = root / gpu["uuid"] / "pipe"
            if not pipe.exists():
                pipe.mkdir(parents=True)
                made.append(pipe.parent)
        pod = wait_until(
            lambda: (
                (p := share_nodes.core.read_namespaced_pod("sees-its-gpu", namespace)).status.phase
                in ("Succeeded", "Failed")
                and p
            ),
            timeout=120,
            what="the share pod placed on the real node and finished",
        )
        assert pod.status.phase == "Succeeded", pod.status
        assert exit_codes(pod) == [0]
        record = placed(pod)
        assert pod.spec.node_name == record.node == real
        log = share_nodes.kubectl("logs", "sees-its-gpu", "-n", namespace)
        seen = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
        assert seen == client_env((2, 30), record.uuid), log
        assert "pipe-found" in log, log
        assert "read-only" in log, log
        # Every GPU of the node has a pipe directory on the host; the pod sees its own alone.
        assert len(topology["gpus"]) > 1
        assert f"in-root: . ./{record.uuid} ./{record.uuid}/pipe \n" in log, log
        share_nodes.kubectl("delete", "pod", "sees-its-gpu", "-n", namespace)
        wait_until(
            lambda: not [p for p in node_mount_points(real) if pod.metadata.uid in p],
            timeout=60,
            what="the pod's CSI volume unmounted",
        )
    finally:
        share_nodes.kubectl("delete", "pod", "sees-its-gpu", "-n", namespace, "--ignore-not-found")
        share_nodes.kubectl("label", "node", real, f"{keys.NODE_GPU_SCHEDULE_LABEL}-", check=False)
        share_nodes.kubectl("annotate", "node", real, f"{keys.GPU_TOPOLOGY}-", check=False)
        status = share_nodes.core.read_node(real).status
        removals = [
            {"op": "remove", "path": f"/status/{section}/{name.replace('/', '~1')}"}
            for section, values in (
                ("capacity", status.capacity),
                ("allocatable", status.allocatable),
            )
            for name in values or {}
            if name.startswith("aliyun.com/")
        ]
        if removals:
            share_nodes.kubectl(
                "patch",
                "node",
                real,
                "--subresource=status",
                "--type=json",
                "-p",
                json.dumps(removals),
            )
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)
        if made_root:
            shutil.rmtree(root, ignore_errors=True)


# --- tenants: what a namespace user may write does not move GPU shares -------------------------

TENANT = "share-tenant@example.com"
POLICY = ROOT / "manifests" / "overlays" / "fractional-gpus" / "share-records-policy.yaml"


@pytest.fixture
def tenant(share_nodes: Cluster, namespace: str) -> client.CoreV1Api:
    """The core API as a tenant of ``namespace`` (impersonated)."""
    return share_nodes.as_user(bind_tenant(share_nodes, namespace, TENANT))


@pytest.fixture
def records_policy(share_nodes: Cluster, namespace: str) -> Iterator[None]:
    """The fractional-gpus overlay's policy, in force (checked by a refusal it alone gives)."""
    share_nodes.kubectl("apply", "--server-side", "-f", str(POLICY))
    probe = share_nodes.as_user(bind_tenant(share_nodes, namespace, "policy-probe@example.com"))
    forged = plain_pod("probe", {keys.GPU_SHARE_UUID: "all"})

    def refused() -> bool:
        try:
            probe.create_namespaced_pod(namespace, forged, dry_run="All")
        except ApiException as e:
            return "mpijob-gpu-share-records" in str(e.body)
        return False

    try:
        wait_until(refused, timeout=30, what="the share-records policy in force")
        yield
    finally:
        share_nodes.kubectl("delete", "-f", str(POLICY), "--ignore-not-found")


def plain_pod(name: str, annotations: dict[str, str], node: str | None = None) -> dict[str, Any]:
    """A pod that requests no GPU share at all."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


def test_records_written_by_a_tenant_on_plain_pods_hold_no_share(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    tenant: client.CoreV1Api,
) -> None:
    """Without the policy (the ledger alone): plain pods claiming every GPU of a node hold
    nothing; the victim's small share is placed there at once."""
    shares()
    for gpu in range(GPUS):
        record = Placed("share-node-1", gpu, "", Share(GPU_GIB, 100), claim=f"squat-{gpu}").dumps()
        tenant.create_namespaced_pod(
            namespace, plain_pod(f"squat-{gpu}", {keys.GPU_SHARE: record}, node="gpu-node-0")
        )
    ghost = Placed("share-node-1", 9, "", Share(1, None), claim="ghost").dumps()
    tenant.create_namespaced_pod(
        namespace, plain_pod("ghost", {keys.GPU_SHARE: ghost}, node="gpu-node-0")
    )
    create(share_nodes, namespace, pod_body("victim", 1, 5, node="share-node-1"))
    (victim,) = wait_running(share_nodes, namespace, ["victim"])
    assert placed(victim).node == "share-node-1"


def test_a_tenant_may_not_forge_share_records_or_lift_the_share_gate(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    tenant: client.CoreV1Api,
    records_policy: None,
) -> None:
    shares()
    # Created with a record, asking for no share: refused.
    for key in (keys.GPU_SHARE, keys.GPU_SHARE_UUID):
        with pytest.raises(ApiException) as caught:
            tenant.create_namespaced_pod(namespace, plain_pod("forger", {key: "all"}))
        assert caught.value.status == 403, caught.value.body
        assert "written by the MPIJob operator alone" in str(caught.value.body)

    # A share pod the tenant creates is placed (the webhook's record passes the policy) ...
    tenant.create_namespaced_pod(namespace, pod_body("mine", 1, 5, node="share-node-1"))
    (mine,) = wait_running(share_nodes, namespace, ["mine"])
    record = placed(mine)
    # ... and one that cannot be placed now waits behind the gate.
    tenant.create_namespaced_pod(namespace, pod_body("later", 1, 5, node="gpu-node-0"))
    wait_gated(share_nodes, namespace, "later")

    edits: dict[str, list[Any]] = {
        "mine": [
            {"metadata": {"annotations": {keys.GPU_SHARE_UUID: "all"}}},
            {"metadata": {"annotations": {keys.GPU_SHARE: None}}},
        ],
        "later": [
            {"metadata": {"annotations": {keys.GPU_SHARE_UUID: "all"}}},
            {"metadata": {"annotations": {keys.GPU_SHARE: record.dumps()}}},
            {"metadata": {"annotations": {keys.GPU_SHARE_WAITING: None}}},
            [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        ],
    }
    for name, patches in edits.items():
        for body in patches:
            with pytest.raises(ApiException) as caught:
                tenant.patch_namespaced_pod(name, namespace, body)
            assert caught.value.status == 403, (name, body, caught.value.body)
        # What the tenant may still do to its pod: the test would prove nothing otherwise.
        tenant.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {"mine": "yes"}}})

    later = share_nodes.core.read_namespaced_pod("later", namespace)
    assert gated(later)
    assert keys.GPU_SHARE_UUID not in (later.metadata.annotations or {})
    mine = share_nodes.core.read_namespaced_pod("mine", namespace)
    assert mine.metadata.annotations[keys.GPU_SHARE_UUID] == record.uuid


def test_a_tenants_share_pod_is_admitted_and_placed_in_a_baseline_namespace(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    tenant: client.CoreV1Api,
) -> None:
    """Pod Security ``baseline`` refuses hostPath volumes, after the webhooks' changes: the
    share pod's MPS directory comes from the agent's CSI driver, so sharing a GPU needs no
    privileged namespace."""
    shares()  # before the label: its readiness probe is a share pod of this namespace
    share_nodes.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline"
    )
    # The level is in force: the tenant's own hostPath pod is refused (else this proves nothing).
    hostpath = plain_pod("hostpath", {})
    hostpath["spec"]["volumes"] = [{"name": "mps", "hostPath": {"path": keys.MPS_ROOT}}]
    with pytest.raises(ApiException) as caught:
        tenant.create_namespaced_pod(namespace, hostpath, dry_run="All")
    assert caught.value.status == 403, caught.value.body
    assert 'violates PodSecurity "baseline:latest"' in json.loads(caught.value.body)["message"]

    tenant.create_namespaced_pod(namespace, pod_body("in-baseline", 2, 30, node="share-node-1"))
    (pod,) = wait_running(share_nodes, namespace, ["in-baseline"])
    record = placed(pod)
    assert pod.spec.node_name == record.node == "share-node-1"
    assert pod.metadata.annotations[keys.GPU_SHARE_UUID] == record.uuid
    assert not pod.spec.scheduling_gates
    assert not [v for v in pod.spec.volumes if v.host_path]
    (mps,) = [v for v in pod.spec.volumes if v.csi]
    assert (mps.csi.driver, mps.csi.read_only, mps.csi.volume_attributes) == (
        keys.MPS_CSI_DRIVER,
        True,
        None,
    )
    mount = pod.spec.containers[0].volume_mounts[0]
    assert (mount.name, mount.mount_path, mount.read_only) == (mps.name, keys.MPS_ROOT, True)


def review(name: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
    """An AdmissionReview of a pod's creation, as the API server would send it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"forged-{name}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": TENANT},
            "object": {**body, "metadata": {**body["metadata"], "namespace": namespace}},
            "dryRun": False,
        },
    }


def test_the_webhook_answers_the_api_server_alone(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    tenant: client.CoreV1Api,
) -> None:
    """AdmissionReviews POSTed straight to the webhook (as a pod that reaches its port would)
    are refused at TLS: the webhook asks for a client certificate that only the API server has
    (its admission configuration, hack/cluster.py). The tenant's pods still pass through the API
    server, and nothing any of it did holds a share: the victim is placed."""
    shares()
    hooks = client.AdmissionregistrationV1Api(share_nodes.api)
    url = hooks.read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION).webhooks[0]
    assert url.client_config.url.endswith(f"/{MUTATE_ID}")
    ca = base64.b64decode(url.client_config.ca_bundle).decode()
    forged = [
        review(f"squat-{i}", pod_body(f"squat-{i}", GPU_GIB, 100, "share-node-1"), namespace)
        for i in range(GPUS)
    ]

    def post(context: ssl.SSLContext, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            url.client_config.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    anyone = ssl.create_default_context(cadata=ca)
    for body in forged:
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)) as refused:
            post(anyone, body)
        # TLS 1.3 reports the refusal on the first read: an alert or the connection closed;
        # never an HTTP answer.
        assert not isinstance(refused.value, urllib.error.HTTPError), refused.value
    # The API server's own certificate is answered: the refusal above is the missing one.
    apiserver = ssl.create_default_context(cadata=ca)
    apiserver.load_cert_chain(
        pki(share_nodes) / "webhook-client.crt", pki(share_nodes) / "webhook-client.key"
    )
    answered = post(apiserver, forged[0])["response"]
    assert answered["allowed"] is True
    assert answered["uid"] == "forged-squat-0"
    # A tenant's share pod goes through the API server as ever, and is placed.
    tenant.create_namespaced_pod(namespace, pod_body("victim", 1, 5, node="share-node-1"))
    (victim,) = wait_running(share_nodes, namespace, ["victim"])
    assert placed(victim).node == "share-node-1"


def test_a_share_pod_the_api_server_refuses_after_the_webhook_holds_nothing(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    tenant: client.CoreV1Api,
) -> None:
    """A ResourceQuota refuses the tenant's whole-GPU pods after the webhook admitted them
    (quota is checked last): they never exist, so they hold nothing, and the victim's share is
    placed on that node at its first decision."""
    shares()
    share_nodes.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-pods"},
            "spec": {"hard": {"pods": "0"}},
        },
        namespace,
    )
    refusals = []
    for i in range(GPUS):
        with pytest.raises(ApiException) as caught:
            tenant.create_namespaced_pod(
                namespace, pod_body(f"refused-{i}", GPU_GIB, 100, node="share-node-1")
            )
        refusals.append(caught.value)
    assert all(r.status == 403 and "quota" in str(r.body) for r in refusals), refusals
    share_nodes.kubectl("delete", "resourcequota", "no-pods", "-n", namespace)
    wait_until(
        lambda: not share_nodes.core.list_namespaced_resource_quota(namespace).items,
        what="the quota gone",
    )

    def admitted() -> client.V1Pod | None:
        try:
            return create(share_nodes, namespace, pod_body("victim", 1, 5, node="share-node-1"))
        except ApiException as e:
            if "quota" in str(e.body):  # the quota admission's cache still has it
                return None
            raise

    wait_until(admitted, what="the victim admitted")
    victim = wait_until(
        lambda: (
            (p := share_nodes.core.read_namespaced_pod("victim", namespace)) and decided(p) and p
        ),
        what="the victim's placement decided",
    )
    assert keys.GPU_SHARE in (victim.metadata.annotations or {}), victim.metadata.annotations
    assert placed(victim).node == "share-node-1"


def test_two_replicas_serve_one_certificate_and_only_the_leader_places(
    share_nodes: Cluster,
    namespace: str,
    shares: Callable[[], OperatorProcess],
    start_operator: Callable[..., OperatorProcess],
    tenant: client.CoreV1Api,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Two replicas, as a Deployment of two behind one Service: both serve the one mounted
    certificate, so the CA bundle in the configurations (applied by whichever started last)
    verifies either; the standby's webhook gates the tenant's pods and the leader alone places
    them (every GPUSharePlaced Event is the Lease holder's), never overcommitting a GPU."""
    from mpijob.platform.tls import serving_certificate

    serving_certificate(namespace, "replicas", tmp_path, url="https://127.0.0.1")
    ports = [free_port(), free_port()]
    # The Lease's namespace is the operator's own, which the webhooks exempt: not the tenant's.
    lock = f"lock-{namespace[-5:]}"  # short: a certificate's name has 64 characters at most
    share_nodes.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=lock)))
    request.addfinalizer(lambda: share_nodes.core.delete_namespace(lock))

    def replica(port: int) -> OperatorProcess:
        return start_operator(
            "--leader-elect",
            "--lock-namespace",
            lock,
            "--fractional-gpus",
            "--webhook-port",
            str(port),
            "--webhook-url",
            f"https://127.0.0.1:{port}",
            "--webhook-client-ca",
            str(pki(share_nodes) / "webhook-client-ca.crt"),
            "--webhook-cert-dir",
            str(tmp_path),
        )

    leader = replica(ports[0])
    wait_until(lambda: leader.metric("mpi_operator_is_leader") == 1, timeout=30, what="a leader")
    standby = replica(ports[1])
    hooks = client.AdmissionregistrationV1Api(share_nodes.api)

    def configured() -> Any:
        return hooks.read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION).webhooks[0]

    wait_until(
        lambda: configured().client_config.url.startswith(f"https://127.0.0.1:{ports[1]}/"),
        what="the standby's configuration applied",
    )
    wait_until(lambda: webhook_answers(share_nodes, namespace), timeout=60, what="the webhooks")
    assert standby.metric("mpi_operator_is_leader") == 0

    # Either replica's certificate is verified by the one bundle the configurations carry.
    context = ssl.create_default_context(
        cadata=base64.b64decode(configured().client_config.ca_bundle).decode()
    )
    context.load_cert_chain(
        pki(share_nodes) / "webhook-client.crt", pki(share_nodes) / "webhook-client.key"
    )
    for port in ports:
        probe = urllib.request.Request(
            f"https://127.0.0.1:{port}/{MUTATE_ID}",
            data=json.dumps(review("probe", pod_body("probe", 1, 5), namespace)).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(probe, context=context, timeout=10) as answer:
            assert json.loads(answer.read())["response"]["allowed"] is True

    names = [f"pair-{i}" for i in range(6)]
    for name in names:
        tenant.create_namespaced_pod(namespace, pod_body(name, 7, 50, node="share-node-1"))
    pods = wait_running(share_nodes, namespace, names[:4])
    assert_not_overcommitted(pods)
    lease = (
        share_nodes.resource("coordination.k8s.io/v1", "Lease")
        .get(name="mpijob-operator", namespace=lock)
        .to_dict()
    )

    def placed_events() -> list[Any] | None:
        found = [
            e
            for e in share_nodes.core.list_namespaced_event(namespace).items
            if e.reason == keys.REASON_GPU_SHARE_PLACED
        ]
        return found if len(found) >= 4 else None

    events = wait_until(placed_events, what="four GPUSharePlaced Events")
    assert {e.reporting_instance for e in events} == {lease["spec"]["holderIdentity"]}
    # 4 GPUs x 2 shares of 50% fit 8; the node takes all six.
    assert_not_overcommitted(wait_running(share_nodes, namespace, names))

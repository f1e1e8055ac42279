"""The local control plane behaves like a real cluster with GPU nodes.

Each test is one behaviour the rest of the suite relies on: simulated GPU nodes, the default
scheduler's resource fitting, scheduler-plugins Coscheduling (all-or-nothing binding), the Job
controller, and the kwok lifecycle annotations that drive pods to Ready, Succeeded or Failed.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from mpijob import keys
from support.kube import Cluster, wait_all_refused
from support.wait import stays, wait_until

pytestmark = pytest.mark.integration


def pod(name: str, gpus: int, **extra: Any) -> client.V1Pod:
    annotations = extra.pop("annotations", None)
    labels = extra.pop("labels", None)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations, labels=labels),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="busybox",
                    resources=client.V1ResourceRequirements(limits={keys.GPU_RESOURCE: str(gpus)}),
                )
            ],
            **extra,
        ),
    )


def phase(cluster: Cluster, ns: str, name: str) -> str:
    return str(cluster.core.read_namespaced_pod(name, ns).status.phase)


def test_nodes_have_eight_allocatable_gpus(cluster: Cluster) -> None:
    nodes = [n for n in cluster.core.list_node().items if n.metadata.name.startswith("gpu-node-")]
    assert len(nodes) >= 4
    for node in nodes:
        assert node.status.allocatable[keys.GPU_RESOURCE] == "8"
        assert keys.GPU_TOPOLOGY in node.metadata.annotations
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True", node.metadata.name
    listed = cluster.kubectl(
        "get",
        "nodes",
        "-o",
        "custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu",
    )
    assert "gpu-node-0" in listed
    assert " 8" in listed


def test_pod_requesting_one_gpu_runs(cluster: Cluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(namespace, pod("one-gpu", 1))
    wait_until(
        lambda: phase(cluster, namespace, "one-gpu") == "Running",
        timeout=30,
        what="the 1-GPU pod to run",
    )
    assert cluster.core.read_namespaced_pod("one-gpu", namespace).spec.node_name


def test_pod_requesting_nine_gpus_is_unschedulable(cluster: Cluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(namespace, pod("nine-gpus", 9))

    def unschedulable() -> bool:
        p = cluster.core.read_namespaced_pod("nine-gpus", namespace)
        conds = {c.type: c for c in p.status.conditions or []}
        c = conds.get("PodScheduled")
        return bool(c and c.status == "False" and c.reason == "Unschedulable")

    wait_until(unschedulable, timeout=30, what="PodScheduled=False/Unschedulable")
    p = cluster.core.read_namespaced_pod("nine-gpus", namespace)
    assert p.status.phase == "Pending"
    assert not p.spec.node_name
    assert "nvidia.com/gpu" in p.status.conditions[0].message


def podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member},
    }


def gang_pod(name: str, group: str, gpus: int, node: str) -> client.V1Pod:
    return pod(
        name,
        gpus,
        labels={keys.SCHED_PLUGINS_POD_GROUP_LABEL: group},
        node_selector={"kubernetes.io/hostname": node},
    )


def test_coscheduling_binds_none_when_the_gang_cannot_fit(cluster: Cluster, namespace: str) -> None:
    """Three pods of a minMember-3 PodGroup, of which only two fit: all stay Pending, none bound."""
    cluster.resource("scheduling.x-k8s.io/v1alpha1", "PodGroup").create(
        body=podgroup("gang", 3), namespace=namespace
    )
    for i in range(3):  # 3 x 4 GPUs pinned to one 8-GPU node: only two could fit
        cluster.core.create_namespaced_pod(namespace, gang_pod(f"g-{i}", "gang", 4, "gpu-node-3"))

    # Coscheduling lets two wait at Permit; the third fails the filter and its PostFilter
    # rejects the waiting two: every pod refused, none bound.
    wait_all_refused(
        lambda: cluster.core.list_namespaced_pod(namespace).items, 3, "the gang that cannot fit"
    )


def test_coscheduling_binds_a_gang_that_fits(cluster: Cluster, namespace: str) -> None:
    """The positive control: the same scheduler binds a minMember-2 gang that fits."""
    cluster.resource("scheduling.x-k8s.io/v1alpha1", "PodGroup").create(
        body=podgroup("pair", 2), namespace=namespace
    )
    for i in range(2):
        cluster.core.create_namespaced_pod(namespace, gang_pod(f"p-{i}", "pair", 4, "gpu-node-2"))

    def all_running() -> bool:
        pods = cluster.core.list_namespaced_pod(namespace).items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    wait_until(all_running, timeout=60, what="both gang pods Running")


def batch_job(name: str, annotations: dict[str, str], backoff: int = 0) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            backoff_limit=backoff,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations=annotations),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[client.V1Container(name="main", image="busybox")],
                ),
            ),
        ),
    )


def job_condition(cluster: Cluster, ns: str, name: str, type_: str) -> bool:
    job = cluster.batch.read_namespaced_job(name, ns)
    return any(c.type == type_ and c.status == "True" for c in job.status.conditions or [])


def test_job_pod_succeeds_when_told_and_the_job_completes(cluster: Cluster, namespace: str) -> None:
    cluster.batch.create_namespaced_job(namespace, batch_job("ok", {keys.SIM_SUCCEED_AFTER: "2s"}))

    def job_pod() -> client.V1Pod | None:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector="job-name=ok").items
        return pods[0] if pods else None

    created = wait_until(job_pod, timeout=30, what="the Job controller to create the pod")
    assert created.metadata.owner_references[0].kind == "Job"
    wait_until(
        lambda: job_condition(cluster, namespace, "ok", "Complete"), timeout=60, what="Job Complete"
    )
    assert job_pod().status.phase == "Succeeded"


def test_job_pod_fails_when_told_and_the_job_fails(cluster: Cluster, namespace: str) -> None:
    cluster.batch.create_namespaced_job(
        namespace, batch_job("bad", {keys.SIM_FAIL_AFTER: "1s", keys.SIM_FAIL_REASON: "OOMKilled"})
    )
    wait_until(
        lambda: job_condition(cluster, namespace, "bad", "Failed"), timeout=60, what="Job Failed"
    )
    job = cluster.batch.read_namespaced_job("bad", namespace)
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    pods = cluster.core.list_namespaced_pod(namespace, label_selector="job-name=bad").items
    assert pods[0].status.phase == "Failed"
    assert pods[0].status.reason == "OOMKilled"


def test_pod_without_job_stays_running(cluster: Cluster, namespace: str) -> None:
    """Pods never end by themselves: only the lifecycle annotations end them."""
    cluster.core.create_namespaced_pod(namespace, pod("steady", 0))
    wait_until(lambda: phase(cluster, namespace, "steady") == "Running", timeout=30, what="Running")
    stays(
        lambda: phase(cluster, namespace, "steady") == "Running",
        duration=3,
        what="the pod keeps Running",
    )


def test_ready_after_annotation_delays_readiness(cluster: Cluster, namespace: str) -> None:
    cluster.core.create_namespaced_pod(
        namespace, pod("slow", 0, annotations={keys.SIM_READY_AFTER: "3s"})
    )

    def ready() -> str | None:
        p = cluster.core.read_namespaced_pod("slow", namespace)
        if p.status.phase != "Running":
            return None
        return {c.type: c.status for c in p.status.conditions}.get("Ready")

    assert wait_until(ready, timeout=30, what="Running") == "False"
    wait_until(lambda: ready() == "True", timeout=30, what="Ready after the delay")

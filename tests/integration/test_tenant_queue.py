"""No tenant can squat, stall or read through the topology queue: each case tried by an
impersonated tenant (Kubernetes' ``edit`` role and Kubeflow's MPIJob edit role in their own
namespace only), and the safe outcome asserted on the victim, a job of another namespace.

Each hostile job and the victim's want the same 8 GPUs of one node unless the case says
otherwise, so the victim runs only if the hostile job's hold is released or never made.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.tenants import TenantJobs, bind_tenant
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

HOSTILE = "hostile-a@example.com"
VICTIM = "victim@example.com"
#: The operator's --placement-release-seconds here: short, so a test waits seconds, not minutes.
RELEASE = 4


@pytest.fixture
def hostile_ns(crds: Cluster) -> Iterator[str]:
    """The hostile tenant's own namespace (the test's ``namespace`` is the victim's)."""
    name = f"t-hostile-{uuid.uuid4().hex[:6]}"
    crds.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    bind_tenant(crds, name, HOSTILE)
    yield name
    crds.core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def hostile(crds: Cluster, hostile_ns: str) -> TenantJobs:
    return TenantJobs(crds, hostile_ns, HOSTILE)


@pytest.fixture
def victim(crds: Cluster, namespace: str) -> TenantJobs:
    bind_tenant(crds, namespace, VICTIM)
    return TenantJobs(crds, namespace, VICTIM)


@pytest.fixture
def both(
    start_operator: Callable[..., OperatorProcess], hostile_ns: str
) -> Callable[..., OperatorProcess]:
    """Start the operator over the victim's and the hostile tenant's namespaces."""

    def start(*args: str) -> OperatorProcess:
        return start_operator(
            "--namespace", hostile_ns, "--placement-release-seconds", str(RELEASE), *args
        )

    return start


def on_node(name: str, node: str, *, gpus: int = 8, succeed_after: str = "") -> dict[str, Any]:
    """A topology job of one worker x ``gpus`` GPUs that may only go to ``node``; its launcher
    succeeds ``succeed_after`` its worker is ready (never, when empty)."""
    body = mpijob(
        name,
        workers=1,
        gpus=gpus,
        annotations={keys.GPU_TOPOLOGY: "true"},
        launcher_annotations={keys.SIM_SUCCEED_AFTER: succeed_after} if succeed_after else None,
        spec={"launcherCreationPolicy": keys.LAUNCHER_WAIT_FOR_WORKERS_READY},
        run_policy={"cleanPodPolicy": "All"},
    )
    worker_spec(body)["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def worker_spec(body: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    return spec


def worker_container(body: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = worker_spec(body)["containers"][0]
    return container


def bound_workers(cluster: Cluster, ns: str, job: str) -> list[Any]:
    selector = f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}={keys.ROLE_WORKER}"
    pods = cluster.core.list_namespaced_pod(ns, label_selector=selector).items
    return [p for p in pods if p.spec.node_name]


def victim_runs(cluster: Cluster, victims: MPIJobs, name: str = "victim") -> None:
    """The victim's job is admitted and its worker bound to gpu-node-0."""
    wait_until(lambda: victims.decision(name), timeout=60, what="the victim's job admitted")
    [pod] = wait_until(
        lambda: bound_workers(cluster, victims.namespace, name), timeout=60, what="its worker"
    )
    assert pod.spec.node_name == "gpu-node-0"


def released(jobs: MPIJobs, name: str, reason: str) -> dict[str, Any]:
    """The hostile job's ``GangAdmitted`` condition once its placement was released, checked
    with the Warning Event saying the same."""

    def probe() -> dict[str, Any] | None:
        c = jobs.condition(name, keys.COND_GANG_ADMITTED)
        return c if c and c["reason"] == reason else None

    condition = wait_until(probe, timeout=60, what=f"{name} released ({reason})")
    assert condition["status"] == "False"
    event = jobs.wait_event(name, reason)
    assert event["type"] == "Warning"
    return condition


def test_8_a_tenant_with_no_gpu_quota_gets_no_placement_and_holds_nothing(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    """Held already by the quota check: the hostile job never gets a decision."""
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="gpus"),
        spec=client.V1ResourceQuotaSpec(hard={keys.QUOTA_GPU_REQUESTS: "0"}),
    )
    crds.core.create_namespaced_resource_quota(hostile_ns, quota)
    both()
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    body = on_node("hog", "gpu-node-0")
    body["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 2
    del worker_spec(body)["nodeSelector"]
    hostile.create(body)
    condition = wait_until(
        lambda: (
            (c := hostiles.condition("hog", keys.COND_GANG_ADMITTED))
            and c["reason"] == keys.REASON_GPU_QUOTA_EXCEEDED
            and c
        ),
        timeout=60,
        what="the hostile job held by its quota",
    )
    assert condition["status"] == "False"
    victim.create(on_node("victim", "gpu-node-0"))
    victim_runs(crds, victims)
    assert hostiles.decision("hog") is None


def test_9_a_worker_template_the_pod_api_refuses_releases_the_placement(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    both()
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    body = on_node("hog", "gpu-node-0")
    # Stored in the MPIJob (its template is opaque to the CRD); every pod of it is a 422.
    worker_container(body)["resources"]["requests"] = {"cpu": "2"}
    worker_container(body)["resources"]["limits"]["cpu"] = "1"
    hostile.create(body)
    # The decision lives from the admission pass to the first refused create, often less than
    # one poll: the released condition is what shows it was placed (and given back).
    condition = released(hostiles, "hog", keys.REASON_WORKERS_REFUSED)
    assert "the API server refused worker pod hog-worker-0" in condition["message"]
    assert "must be less than or equal to cpu limit" in condition["message"]
    assert "its placement is released" in condition["message"]
    victim.create(on_node("victim", "gpu-node-0"))
    victim_runs(crds, victims)
    assert hostiles.decision("hog") is None, "held off: not placed again while the victim runs"


def test_10_workers_unschedulable_past_the_bound_release_the_placement(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    both()
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    body = on_node("hog", "gpu-node-0")
    worker_container(body)["resources"]["requests"] = {"cpu": "100000"}
    hostile.create(body)
    wait_until(lambda: hostiles.decision("hog"), timeout=60, what="the hostile job placed")
    victim.create(on_node("victim", "gpu-node-0"))
    condition = released(hostiles, "hog", keys.REASON_WORKERS_UNSCHEDULABLE)
    assert "worker hog-worker-0 has been unschedulable for" in condition["message"]
    victim_runs(crds, victims)


def test_11_a_pod_naming_the_job_as_controller_keeps_no_placement_alive(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    both()
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    job = hostile.create(on_node("hog", "gpu-node-0", succeed_after="3s"))
    wait_until(lambda: hostiles.decision("hog"), timeout=60, what="the hostile job placed")
    extra = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "hog-extra",
            # The job's labels, so the operator counts it among the job's pods.
            "labels": {keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME, keys.LABEL_JOB_NAME: "hog"},
            "ownerReferences": [
                {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND,
                    "name": "hog",
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeSelector": {"no-such-label": "x"},  # Pending for good
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }
    hostile.create_pod(extra)
    victim.create(on_node("victim", "gpu-node-0"))
    hostiles.wait_condition("hog", keys.COND_SUCCEEDED, timeout=90)
    victim_runs(crds, victims)
    assert hostiles.decision("hog") is None
    pod = crds.core.read_namespaced_pod("hog-extra", hostile_ns)
    assert pod.status.phase == "Pending", "it is still there: it just holds nothing"


def test_12_a_job_pinned_to_a_busy_node_blocks_no_job_that_needs_another(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    """The hog names a high PriorityClass its pods never carry, and waits for a busy node; the
    victim's job wants an idle one."""
    high = f"t-high-{uuid.uuid4().hex[:5]}"
    scheduling = client.SchedulingV1Api(crds.api)
    scheduling.create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name=high), value=1000000)
    )
    try:
        crds.core.create_namespaced_pod(hostile_ns, gpu_pod("busy", "gpu-node-0", 8))
        both()
        hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
        hog = on_node("hog", "gpu-node-0")
        hog["spec"]["runPolicy"]["schedulingPolicy"] = {"priorityClass": high}
        hostile.create(hog)
        wait_until(
            lambda: "needs 8 GPUs" in message(hostiles, "hog"),
            timeout=60,
            what="the hog waiting for gpu-node-0",
        )
        victim.create(on_node("victim", "gpu-node-1"))
        wait_until(lambda: victims.decision("victim"), timeout=60, what="the victim admitted")
        assert "queued behind" not in message(victims, "victim")
        assert hostiles.decision("hog") is None
    finally:
        scheduling.delete_priority_class(high)


def test_13_a_waiting_message_names_no_pod_of_another_namespace(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    crds.core.create_namespaced_pod(hostile_ns, gpu_pod("secret-project-x", "gpu-node-0", 8))
    op = both()
    victims = MPIJobs(crds, namespace)
    victim.create(on_node("victim", "gpu-node-0"))
    wait_until(
        lambda: "held by pods this operator did not place" in message(victims, "victim"),
        timeout=60,
        what="the victim told who holds the GPUs",
    )
    text = message(victims, "victim")
    assert "gpu-node-0: 8 GPU(s) by pods of other namespaces" in text
    assert "secret-project-x" not in text
    assert hostile_ns not in text
    with urllib.request.urlopen(op.url + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert "secret-project-x" not in metrics
    assert hostile_ns not in metrics


def message(jobs: MPIJobs, name: str) -> str:
    return str((jobs.condition(name, keys.COND_GANG_ADMITTED) or {}).get("message", ""))


def gpu_pod(name: str, node: str, gpus: int) -> client.V1Pod:
    """A pod bound to ``node`` by name, asking for ``gpus`` GPUs: GPUs held outside our
    placement."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[
                client.V1Container(
                    name="c",
                    image="busybox",
                    resources=client.V1ResourceRequirements(limits={keys.GPU_RESOURCE: str(gpus)}),
                )
            ],
        ),
    )

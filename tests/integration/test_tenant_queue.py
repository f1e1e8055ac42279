"""No tenant can squat, stall or read through the topology queue: each case tried by an
impersonated tenant (Kubernetes' ``edit`` role and Kubeflow's MPIJob edit role in their own
namespace only), and the safe outcome asserted on the victim, a job of another namespace.

Each hostile job and the victim's want the same 8 GPUs of one node unless the case says
otherwise, so the victim runs only if the hostile job's hold is released or never made.
"""

from __future__ import annotations

import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client, watch

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import SYNCS, OperatorProcess
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
    crds.delete_namespace(name)


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

    condition = waiting_because(jobs, name, reason, f"{name} released ({reason})")
    assert condition["status"] == "False"
    event = jobs.wait_event(name, reason)
    assert event["type"] == "Warning"
    return condition


def waiting_because(jobs: MPIJobs, name: str, reason: str, what: str) -> dict[str, Any]:
    """The job's ``GangAdmitted`` condition once its reason is ``reason``."""
    return wait_until(
        lambda: (
            (c := jobs.condition(name, keys.COND_GANG_ADMITTED)) and c["reason"] == reason and c
        ),
        timeout=60,
        what=what,
    )


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
    condition = waiting_because(
        hostiles, "hog", keys.REASON_GPU_QUOTA_EXCEEDED, "the hostile job held by its quota"
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
    assert not placed(hostiles, "hog"), "held off: not placed again while the victim runs"


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
    # Pending for good, for a reason placement cannot know: a required pod affinity to pods
    # that do not exist (a request no node can meet never gets a placement: case 16).
    worker_spec(body)["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"no-such-pod": "x"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    hostile.create(body)
    wait_until(lambda: placed(hostiles, "hog"), timeout=60, what="the hostile job placed")
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


def test_14_a_worker_is_placed_on_all_the_gpus_the_scheduler_charges_its_pod(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    """The hostile worker's app container asks for 1 GPU and its init container for 8: the
    scheduler charges the pod 8. Placement reserves the 8, so the victim's job, wanting 4 GPUs
    of the same node, is placed only once the hostile job is done, on GPUs no one else holds."""
    both()
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    body = on_node("hog", "gpu-node-0", gpus=1, succeed_after="15s")
    worker_spec(body)["initContainers"] = [
        {
            "name": "warm-up",
            "image": "mpioperator/mpi-pi:openmpi",
            "resources": {"limits": {keys.GPU_RESOURCE: "8"}},
        }
    ]
    hostile.create(body)
    wait_until(lambda: bound_workers(crds, hostile_ns, "hog"), timeout=60, what="its worker")
    assert [len(w["gpus"]) for w in placed(hostiles, "hog")] == [8], "what its pod is charged"
    victim.create(on_node("victim", "gpu-node-0", gpus=4))
    victim_runs(crds, victims)
    assert not [
        p for p in bound_workers(crds, hostile_ns, "hog") if p.status.phase not in TERMINAL
    ], "the victim was placed only once the hostile worker's GPUs were free"
    refused = [
        e.message
        for e in crds.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=victim-worker-0"
        ).items
        if e.reason == "FailedScheduling"
    ]
    assert not refused, f"the victim's worker waited for GPUs another pod held: {refused}"


def test_15_a_tenants_status_writes_neither_end_a_hold_off_nor_reach_another_namespace(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    """The hostile tenant rewrites its released job's status, as ``kubeflow-mpijobs-edit``
    lets it, over and over: the condition that says why it waits removed, Succeeded forged and
    taken back, its start time moved. The hold-off is the operator's own record, so through
    every admission pass made meanwhile the job is placed (and released) no more, and the
    victim's job, wanting the same node, runs."""
    op = both("--placement-release-seconds", "300")
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    decisions = DecisionWatch(crds, hostile_ns)
    try:
        body = on_node("hog", "gpu-node-0")
        worker_container(body)["resources"]["requests"] = {"cpu": "2"}  # each worker a 422
        worker_container(body)["resources"]["limits"]["cpu"] = "1"
        hostile.create(body)
        released(hostiles, "hog", keys.REASON_WORKERS_REFUSED)
        wait_until(lambda: decisions.releases("hog") == 1, timeout=30, what="its release seen")
        assert decisions.placements("hog") == 1
        # Forged until the victim's worker is bound, and for at least 60 writes that the
        # operator synced (each sync a chance to end the hold-off): counted, never timed.
        syncs = op.metric(SYNCS) + 60
        writes = 0
        deadline = time.monotonic() + 120
        while not (
            writes > 60 and op.metric(SYNCS) >= syncs and bound_workers(crds, namespace, "victim")
        ):
            bound = bool(bound_workers(crds, namespace, "victim"))
            assert time.monotonic() < deadline, (
                f"after {writes} writes and {op.metric(SYNCS) - syncs + 60:.0f} syncs: "
                f"{decisions.seen!r}, victim bound: {bound}"
            )
            hostile.patch_status("hog", forged_status(hostiles, writes))
            writes += 1
            if writes == 5:
                victim.create(on_node("victim", "gpu-node-0"))
            time.sleep(0.1)
        victim_runs(crds, victims)
        assert (decisions.placements("hog"), decisions.releases("hog")) == (1, 1), (
            "placed and released once, before the writes: " + repr(decisions.seen)
        )
        assert not placed(hostiles, "hog")
    finally:
        decisions.stop()


def test_16_a_job_no_node_can_fit_holds_nothing_and_says_which_resource_is_missing(
    crds: Cluster,
    namespace: str,
    hostile_ns: str,
    hostile: TenantJobs,
    victim: TenantJobs,
    both: Callable[..., OperatorProcess],
) -> None:
    """8 GPUs and 100,000 CPUs a worker: no node has the CPUs, so the job is never placed (no
    decision, no GPUs, nothing to release), its condition and a Warning say why, and the
    victim's job, wanting the same node, runs at once."""
    both()
    hostiles, victims = MPIJobs(crds, hostile_ns), MPIJobs(crds, namespace)
    decisions = DecisionWatch(crds, hostile_ns)
    try:
        body = on_node("hog", "gpu-node-0")
        worker_container(body)["resources"]["requests"] = {"cpu": "100000"}
        hostile.create(body)
        condition = waiting_because(
            hostiles, "hog", keys.REASON_NO_NODE_FITS, "the job waiting for a node that can hold it"
        )
        assert condition["status"] == "False"
        assert "insufficient cpu (a worker requests 100000" in condition["message"]
        assert "the most a node has allocatable is 96" in condition["message"]
        event = hostiles.wait_event("hog", keys.REASON_NO_NODE_FITS)
        assert event["type"] == "Warning"
        victim.create(on_node("victim", "gpu-node-0"))
        victim_runs(crds, victims)
        assert decisions.placements("hog") == 0, repr(decisions.seen)
        assert hostiles.decision("hog") is None
        assert not bound_workers(crds, hostile_ns, "hog")
    finally:
        decisions.stop()


TERMINAL = ("Succeeded", "Failed")


def forged_status(jobs: MPIJobs, step: int) -> dict[str, Any]:
    """The status the hostile tenant writes at ``step``, in turn: without its ``GangAdmitted``
    condition, with a forged ``Succeeded`` (no completion time), with a new start time."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = (jobs.get("hog").get("status") or {}).get("conditions") or []
    kept = [
        c for c in conditions if c["type"] not in (keys.COND_GANG_ADMITTED, keys.COND_SUCCEEDED)
    ]
    if step % 3 == 1:
        succeeded = {
            "type": keys.COND_SUCCEEDED,
            "status": "True",
            "reason": "MPIJobSucceeded",
            "message": "forged",
            "lastTransitionTime": now,
            "lastUpdateTime": now,
        }
        return {"status": {"conditions": [*kept, succeeded]}}
    if step % 3 == 2:
        return {"status": {"conditions": kept, "startTime": now}}
    return {"status": {"conditions": kept}}


class DecisionWatch:
    """Every change to a namespace's PlacementDecisions, from a watch: a decision may live
    less than one poll."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.seen: list[tuple[str, str, int]] = []
        """(event type, decision name, workers it places), in order."""
        self.cut = ""
        """Why the watch ended before :meth:`stop`; empty while it runs."""
        self._stopped = False
        self._watch = watch.Watch()
        api = client.CustomObjectsApi(cluster.api)
        group, version = keys.DECISION_API_VERSION.split("/")
        # From a version listed now: nothing that happens after this constructor is missed.
        listed = api.list_namespaced_custom_object(group, version, namespace, keys.DECISION_PLURAL)
        for obj in listed.get("items") or []:
            workers = len((obj.get("spec") or {}).get("workers") or [])
            self.seen.append(("LISTED", obj["metadata"]["name"], workers))
        version_listed = listed["metadata"]["resourceVersion"]

        def run() -> None:
            try:
                for event in self._watch.stream(
                    api.list_namespaced_custom_object,
                    group,
                    version,
                    namespace,
                    keys.DECISION_PLURAL,
                    resource_version=version_listed,
                    timeout_seconds=900,
                ):
                    obj = event["object"]
                    workers = len((obj.get("spec") or {}).get("workers") or [])
                    if event["type"] == "DELETED":
                        workers = 0
                    self.seen.append((event["type"], obj["metadata"]["name"], workers))
            except Exception as e:  # the stream cut: the counts say so
                if not self._stopped:
                    self.cut = repr(e)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def _transitions(self, name: str) -> list[tuple[int, int]]:
        assert not self.cut, f"the watch of decisions ended early: {self.cut}"
        out, before = [], 0
        for _, seen, workers in list(self.seen):
            if seen == name:
                out.append((before, workers))
                before = workers
        return out

    def placements(self, name: str) -> int:
        """How often the job came to hold GPUs (its decision placing workers)."""
        return sum(1 for a, b in self._transitions(name) if a == 0 and b > 0)

    def releases(self, name: str) -> int:
        """How often it gave them back (its decision deleted, or kept placing none)."""
        return sum(1 for a, b in self._transitions(name) if a > 0 and b == 0)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def placed(jobs: MPIJobs, name: str) -> list[dict[str, Any]]:
    """The workers the job's PlacementDecision places; [] while it holds no GPUs (none, or
    the record a release keeps of the job's hold-off)."""
    return list(((jobs.decision(name) or {}).get("spec") or {}).get("workers") or [])


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

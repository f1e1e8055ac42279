"""What a tenant can write does not move GPUs: the trust model of placement, on the cluster.

A tenant here may create MPIJobs and Pods in their namespace (Kubeflow's edit roles, as users
get them). Placement believes only PlacementDecisions, which no user role may write; a pod's
own ``mpijob.io/gpu-ids`` counts for nothing, its GPU requests do.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.tenants import TenantJobs, bind_tenant, can_i
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

ROOT = Path(__file__).resolve().parents[2]
TENANT = "tenant@example.com"
EIGHT = "0,1,2,3,4,5,6,7"


def on_node(name: str, node: str, *, gpus: int = 8, **kw: Any) -> dict[str, Any]:
    """A topology job whose workers may only go to ``node``."""
    body = mpijob(name, workers=1, gpus=gpus, annotations={keys.GPU_TOPOLOGY: "true"}, **kw)
    worker = body["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    worker["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def worker_pods(cluster: Cluster, ns: str, job: str) -> list[Any]:
    return cluster.core.list_namespaced_pod(
        ns, label_selector=f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}=worker"
    ).items


def message(mpijobs: MPIJobs, name: str) -> str:
    return str((mpijobs.condition(name, keys.COND_GANG_ADMITTED) or {}).get("message", ""))


def test_a_forged_decision_on_an_mpijob_takes_no_gpus_from_a_running_job(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    mpijobs.create(on_node("holder", "gpu-node-0"))
    mpijobs.wait_condition("holder", keys.COND_GANG_ADMITTED, timeout=30)
    wait_until(lambda: len(worker_pods(crds, namespace, "holder")) == 1, what="holder's worker")

    forged = {"v": 1, "ring": 50, "workers": [["gpu-node-0", list(range(8))]]}
    annotations = {
        keys.GPU_TOPOLOGY: "true",
        "mpijob.io/placement-decision": json.dumps(forged),
        "mpijob.io/placement": "1x8 GPU on gpu-node-0 [0,1,2,3,4,5,6,7] ring 50.0 GB/s",
    }
    body = on_node("forger", "gpu-node-0")
    body["metadata"]["annotations"] = annotations
    mpijobs.create(body)
    wait_until(lambda: "needs 8 GPUs" in message(mpijobs, "forger"), what="the forger to wait")
    assert not worker_pods(crds, namespace, "forger")
    assert mpijobs.decision("forger") is None
    holder = mpijobs.decision("holder")
    assert holder is not None
    assert holder["spec"]["workers"] == [{"node": "gpu-node-0", "gpus": list(range(8))}]


def test_a_pod_claiming_gpus_it_does_not_request_blocks_no_one(
    crds: Cluster, namespace: str, operator: Any, mpijobs: MPIJobs
) -> None:
    crds.core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="squatter", annotations={keys.GPU_IDS: EIGHT}),
            spec=client.V1PodSpec(
                node_name="gpu-node-0",
                containers=[client.V1Container(name="main", image="busybox")],
            ),
        ),
    )
    mpijobs.create(on_node("after", "gpu-node-0"))
    mpijobs.wait_condition("after", keys.COND_GANG_ADMITTED, timeout=30)
    [pod] = wait_until(
        lambda: (p := worker_pods(crds, namespace, "after")) and p[0].spec.node_name and p,
        what="the worker bound",
    )
    assert pod.spec.node_name == "gpu-node-0"
    assert pod.metadata.annotations[keys.GPU_IDS] == EIGHT


# --- RBAC: what a namespace user may write ----------------------------------------------------


@pytest.fixture
def tenant(crds: Cluster, namespace: str) -> str:
    """A user bound, in ``namespace``, to Kubernetes' ``edit`` role and Kubeflow's MPIJob edit
    role (the kubeflow overlay's aggregated roles, applied)."""
    roles = ROOT / "manifests" / "overlays" / "kubeflow" / "user-roles.yaml"
    crds.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(roles))
    for role in ("edit", "kubeflow-mpijobs-edit"):
        crds.kubectl(
            "create",
            "rolebinding",
            f"tenant-{role}",
            f"--clusterrole={role}",
            f"--user={TENANT}",
            "-n",
            namespace,
        )
    return TENANT


def test_a_namespace_user_may_run_jobs_but_not_write_placement_decisions(
    crds: Cluster, namespace: str, tenant: str
) -> None:
    # What the user must be able to do, or the test proves nothing.
    for verb in ("create", "patch", "delete"):
        assert can_i(crds, tenant, namespace, verb, "mpijobs.kubeflow.org"), verb
    assert can_i(crds, tenant, namespace, "create", "pods")
    # What the trust model relies on.
    for verb in ("create", "update", "patch", "delete", "deletecollection"):
        assert not can_i(crds, tenant, namespace, verb, "placementdecisions.mpijob.io"), verb
    # DRA allocations are believed too: only the scheduler writes a claim's status.
    assert can_i(crds, tenant, namespace, "create", "resourceclaims.resource.k8s.io")
    for verb in ("update", "patch"):
        assert not can_i(
            crds, tenant, namespace, verb, "resourceclaims.resource.k8s.io", subresource="status"
        ), verb

    forged = {
        "apiVersion": keys.DECISION_API_VERSION,
        "kind": keys.DECISION_KIND,
        "metadata": {"name": "mine", "namespace": namespace},
        "spec": {"job": {"name": "mine", "uid": "x"}, "workers": []},
    }
    out = crds.kubectl("create", f"--as={tenant}", "-f", "-", input=json.dumps(forged), check=False)
    assert "forbidden" in out.lower(), out
    assert mpijobs_decision_absent(crds, namespace, "mine")


def test_a_tenant_may_not_opt_a_node_in_or_out_nor_publish_gpus_for_one(
    crds: Cluster, namespace: str, tenant: str
) -> None:
    """The node informer believes a node's opt-in label, its topology annotation and its
    status; the slice informer believes ResourceSlices' GPU UUIDs and device taints. All are
    cluster-scoped: a tenant with ``edit`` and the MPIJob role in their namespace may write none
    of them."""
    for verb in ("update", "patch"):
        assert not can_i(crds, tenant, namespace, verb, "nodes"), verb
        assert not can_i(crds, tenant, namespace, verb, "nodes", subresource="status"), verb
    for verb in ("create", "update", "patch", "delete"):
        assert not can_i(crds, tenant, namespace, verb, "resourceslices.resource.k8s.io"), verb

    before = crds.core.read_node("gpu-node-0").metadata
    for change in (
        {"metadata": {"labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_DEFAULT}}},
        {"metadata": {"annotations": {keys.GPU_TOPOLOGY: "{}"}}},
    ):
        out = crds.kubectl(
            "patch", "node", "gpu-node-0", f"--as={tenant}", "-p", json.dumps(change), check=False
        )
        assert "forbidden" in out.lower(), out
    after = crds.core.read_node("gpu-node-0").metadata
    assert (after.labels, after.annotations) == (before.labels, before.annotations)

    forged = {
        "apiVersion": keys.DRA_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{namespace}-forged"},
        "spec": {
            "driver": keys.NVIDIA_GPU_DRIVER,
            "nodeName": "gpu-node-0",
            "pool": {"name": "gpu-node-0", "resourceSliceCount": 1, "generation": 1},
            "devices": [{"name": "gpu-9", "attributes": {"uuid": {"string": "GPU-forged"}}}],
        },
    }
    out = crds.kubectl("create", f"--as={tenant}", "-f", "-", input=json.dumps(forged), check=False)
    assert "forbidden" in out.lower(), out

    # Nor taint a GPU of a real slice, which placement would then leave out (or untaint one).
    name = f"gpu-node-0-{keys.NVIDIA_GPU_DRIVER}"
    slices = crds.resource(keys.DRA_API_VERSION, "ResourceSlice")
    devices = slices.get(name=name).to_dict()["spec"]["devices"]
    tainted = [{**d, "taints": [{"key": "k", "effect": "NoSchedule"}]} for d in devices]
    out = crds.kubectl(
        "patch",
        "resourceslice",
        name,
        f"--as={tenant}",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"devices": tainted}}),
        check=False,
    )
    assert "forbidden" in out.lower(), out
    assert slices.get(name=name).to_dict()["spec"]["devices"] == devices


def test_a_tenant_may_not_write_the_allocation_of_a_claim(
    crds: Cluster, namespace: str, tenant: str
) -> None:
    """The claim informer believes a claim's ``status.allocation`` (whose GPUs it holds, on
    which node) and, for quotas, the NVIDIA devices a claim controlled by a job asks for. A
    tenant may create a claim in their namespace, which the API server charges to their quota
    as any claim; writing an allocation on a node's GPUs, which placement would then avoid, is
    refused."""
    claim = {
        "apiVersion": keys.DRA_API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": "squat", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {"deviceClassName": keys.NVIDIA_GPU_DRIVER, "count": 8},
                    }
                ]
            }
        },
    }
    out = crds.kubectl("create", f"--as={tenant}", "-f", "-", input=json.dumps(claim))
    assert "created" in out, out
    results = [
        {"driver": keys.NVIDIA_GPU_DRIVER, "pool": "gpu-node-0", "device": f"gpu-{i}",
         "request": "gpus"}
        for i in range(8)
    ]  # fmt: skip
    allocation = {"status": {"allocation": {"devices": {"results": results}}}}
    out = crds.kubectl(
        "patch", "resourceclaim", "squat", "-n", namespace, "--subresource=status",
        f"--as={tenant}", "--type=merge", "-p", json.dumps(allocation), check=False,
    )  # fmt: skip
    assert "forbidden" in out.lower(), out
    stored = crds.resource(keys.DRA_API_VERSION, "ResourceClaim").get(
        name="squat", namespace=namespace
    )
    assert not (stored.to_dict().get("status") or {}).get("allocation")


def mpijobs_decision_absent(cluster: Cluster, namespace: str, name: str) -> bool:
    return MPIJobs(cluster, namespace).decision(name) is None


# --- the node agent: its own node and the pods on it ------------------------------------------

AGENT_POLICY = ROOT / "manifests" / "base" / "rbac" / "agent-policy.yaml"
AGENT = "system:serviceaccount:mpi-operator:mpijob-agent"


def agent_on(cluster: Cluster, node: str | None) -> client.CoreV1Api:
    """The core API as the agent's pod-bound token on ``node`` (None: a token naming none)."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", AGENT)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    if node:
        api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", node)
    return client.CoreV1Api(api)


@pytest.fixture
def agent_policy(crds: Cluster) -> Iterator[None]:
    roles = list(yaml.safe_load_all((ROOT / "manifests/base/rbac/agent.yaml").read_text()))
    role = next(d for d in roles if d["kind"] == "ClusterRole")
    # Made here, removed here: left behind without an install's labels, Helm would refuse to
    # adopt it into a release (test_helm.py).
    made_role = not crds.kubectl(
        "get", "clusterrole", role["metadata"]["name"], "--ignore-not-found", "-o", "name"
    )
    crds.apply(role)
    crds.kubectl(
        "create",
        "clusterrolebinding",
        "test-mpijob-agent",
        "--clusterrole=mpijob-agent",
        "--serviceaccount=mpi-operator:mpijob-agent",
    )
    crds.kubectl("apply", "--server-side", "-f", str(AGENT_POLICY))
    try:
        stranger = {"metadata": {"annotations": {"mpijob.io/probe": "x"}}}

        def refused() -> bool:
            try:
                agent_on(crds, "gpu-node-0").patch_node("gpu-node-1", stranger, dry_run="All")
            except ApiException as e:
                return "mpijob-agent-own-node" in str(e.body)
            return False

        wait_until(refused, timeout=30, what="the agent policy in force")
        yield
    finally:
        crds.kubectl("delete", "-f", str(AGENT_POLICY), "--ignore-not-found")
        crds.kubectl("delete", "clusterrolebinding", "test-mpijob-agent", "--ignore-not-found")
        if made_role:
            crds.kubectl("delete", "clusterrole", role["metadata"]["name"], "--ignore-not-found")


def test_the_node_agent_may_change_only_its_own_node_and_its_pods(
    crds: Cluster, namespace: str, agent_policy: None
) -> None:
    for node in ("gpu-node-0", "gpu-node-1"):
        crds.core.create_namespaced_pod(
            namespace,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=f"on-{node}"),
                spec=client.V1PodSpec(
                    node_name=node, containers=[client.V1Container(name="c", image="busybox")]
                ),
            ),
        )
    mine, other = agent_on(crds, "gpu-node-0"), agent_on(crds, None)
    note = {"metadata": {"annotations": {keys.GPU_ACTUAL: "GPU-x"}}}
    label = {"metadata": {"labels": {keys.NODE_GPU_SCHEDULE_LABEL: "core_mem"}}}
    # What it must still do, or the test proves nothing.
    mine.patch_node("gpu-node-0", {"metadata": {"annotations": {"mpijob.io/probe": "x"}}})
    mine.patch_namespaced_pod("on-gpu-node-0", namespace, note)
    refusals = [
        lambda: mine.patch_node("gpu-node-1", label),
        lambda: mine.patch_node_status("gpu-node-1", {"status": {"capacity": {}}}),
        lambda: mine.patch_namespaced_pod("on-gpu-node-1", namespace, note),
        lambda: other.patch_node("gpu-node-0", label),
    ]
    for attempt in refusals:
        with pytest.raises(ApiException) as caught:
            attempt()
        assert caught.value.status == 403, caught.value.body
    labels = crds.core.read_node("gpu-node-1").metadata.labels or {}
    assert labels.get(keys.NODE_GPU_SCHEDULE_LABEL) != "core_mem"
    crds.core.patch_node("gpu-node-0", {"metadata": {"annotations": {"mpijob.io/probe": None}}})


def test_a_tenant_may_not_write_the_agents_gpu_actual_report(
    crds: Cluster, namespace: str, tenant: str, agent_policy: None
) -> None:
    """The operator counts mpijob.io/gpu-actual as a placement not honoured: a tenant writing it
    on their own pod would move mpi_operator_placements_not_honoured_total."""
    as_tenant = crds.as_user(tenant)
    spec = client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")])
    liar = client.V1Pod(
        metadata=client.V1ObjectMeta(name="liar", annotations={keys.GPU_ACTUAL: "GPU-x"}),
        spec=spec,
    )

    def refused() -> bool:  # the policy came with the agent's; it may be synced a moment later
        try:
            as_tenant.create_namespaced_pod(namespace, liar, dry_run="All")
        except ApiException as e:
            return e.status == 403 and "mpijob-gpu-actual" in str(e.body)
        return False

    wait_until(refused, timeout=30, what="a pod created with mpijob.io/gpu-actual refused")
    as_tenant.create_namespaced_pod(
        namespace, client.V1Pod(metadata=client.V1ObjectMeta(name="mine"), spec=spec)
    )
    with pytest.raises(ApiException) as caught:
        as_tenant.patch_namespaced_pod(
            "mine", namespace, {"metadata": {"annotations": {keys.GPU_ACTUAL: "GPU-x"}}}
        )
    assert caught.value.status == 403, caught.value.body
    as_tenant.patch_namespaced_pod("mine", namespace, {"metadata": {"labels": {"mine": "yes"}}})
    assert keys.GPU_ACTUAL not in (
        crds.core.read_namespaced_pod("mine", namespace).metadata.annotations or {}
    )


# --- a placed worker aliased --------------------------------------------------------------------

ALIASER = "aliaser@example.com"
VICTIM = "victim@example.com"


@pytest.fixture
def aliaser_ns(crds: Cluster) -> Iterator[str]:
    """The aliasing tenant's own namespace (the test's ``namespace`` is the victim's)."""
    name = f"t-aliaser-{uuid.uuid4().hex[:6]}"
    crds.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    bind_tenant(crds, name, ALIASER)
    yield name
    crds.delete_namespace(name)


def bound_pods(cluster: Cluster, ns: str, job: str) -> list[Any]:
    """The job's worker pods bound to a node."""
    return [p for p in worker_pods(cluster, ns, job) if p.spec.node_name]


def placed_ids(pod: Any) -> list[int]:
    return [int(i) for i in pod.metadata.annotations[keys.GPU_IDS].split(",")]


def test_a_pod_aliasing_a_placed_worker_holds_its_gpus_as_a_foreign_pod(
    crds: Cluster,
    namespace: str,
    aliaser_ns: str,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """A tenant copies worker 0 of its own placed job into a second pod: the job's labels, a
    controller reference to the job (its uid), the worker's ``mpijob.io/gpu-ids``, its node, as
    many GPUs, and the name ``<job>-worker-00``, which a lenient reading takes for worker 0. The
    role label is left off, as the operator deletes a pod of its job's worker role under a name
    it does not give. gpu-node-0 then holds the decision's 4 GPUs and the alias's 4: the
    victim's job, of another namespace and wanting 4 GPUs of that node, must wait, told that
    pods the operator did not place hold them, rather than be admitted onto GPUs its worker
    cannot get (Pending, "Insufficient nvidia.com/gpu"); once the alias is gone it runs."""
    op = start_operator("--namespace", aliaser_ns, "--gpu-binding", "annotations")
    aliaser = TenantJobs(crds, aliaser_ns, ALIASER)
    victim = TenantJobs(crds, namespace, bind_tenant(crds, namespace, VICTIM))
    victims = MPIJobs(crds, namespace)
    job = aliaser.create(on_node("own", "gpu-node-0", gpus=4))
    [worker] = wait_until(
        lambda: bound_pods(crds, aliaser_ns, "own"), timeout=60, what="the tenant's worker bound"
    )
    labels = {k: v for k, v in worker.metadata.labels.items() if k != keys.LABEL_JOB_ROLE}
    assert labels[keys.LABEL_OPERATOR_NAME] == keys.OPERATOR_NAME
    alias = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "own-worker-00",
            "labels": labels,
            "annotations": {keys.GPU_IDS: worker.metadata.annotations[keys.GPU_IDS]},
            "ownerReferences": [
                {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND,
                    "name": "own",
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-node-0"},
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {keys.GPU_RESOURCE: "4"}}}
            ],
        },
    }
    aliaser.create_pod(alias)
    wait_until(
        lambda: (
            crds.core.read_namespaced_pod("own-worker-00", aliaser_ns).status.phase == "Running"
        ),
        timeout=60,
        what="the alias running on gpu-node-0",
    )

    victim.create(on_node("victim", "gpu-node-0", gpus=4))
    wait_until(
        lambda: "held by pods this operator did not place" in message(victims, "victim"),
        timeout=60,
        what="the victim told the GPUs are held",
    )
    text = message(victims, "victim")
    assert "needs 4 GPUs" in text, text
    assert "gpu-node-0: 4 GPU(s) by pods of other namespaces" in text, text
    op.wait_admission_passes()
    assert victims.decision("victim") is None
    assert not worker_pods(crds, namespace, "victim"), "no worker is made to wait for GPUs"
    own = MPIJobs(crds, aliaser_ns).decision("own")
    assert own is not None, "the tenant's own job keeps its placement"
    assert own["spec"]["workers"] == [{"node": "gpu-node-0", "gpus": placed_ids(worker)}]

    aliaser.core.delete_namespaced_pod("own-worker-00", aliaser_ns, grace_period_seconds=0)
    [pod] = wait_until(
        lambda: bound_pods(crds, namespace, "victim"), timeout=60, what="the victim's worker bound"
    )
    assert pod.spec.node_name == "gpu-node-0"
    refused = [
        e.message
        for e in crds.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=victim-worker-0"
        ).items
        if e.reason == "FailedScheduling"
    ]
    assert not refused, f"the victim's worker waited for GPUs another pod held: {refused}"

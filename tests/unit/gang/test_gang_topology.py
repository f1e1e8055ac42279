"""Which GPUs placement must not hand out: decisions believed, pods counted by their requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpijob import keys
from mpijob.gang import topology
from mpijob.placement import codec, topologies
from mpijob.placement.job import Placement, WorkerAssignment
from support import jobs

pytestmark = pytest.mark.unit


JOB_UID = "uid-j"


def pod(
    node: str,
    ids: str = "",
    *,
    gpus: int = 0,
    name: str = "squatter",
    job: str = "",
    owner: str = "",
    phase: str = "Running",
    terminating: bool = False,
) -> Any:
    """A pod as the GPU index keeps it: GPU requests, labels, owner, annotations."""
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "annotations": {}}
    if ids:
        meta["annotations"][keys.GPU_IDS] = ids
    if job:
        meta["labels"] = {
            keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
            keys.LABEL_JOB_NAME: job,
            keys.LABEL_JOB_ROLE: keys.ROLE_WORKER,
        }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND,
                "name": job,
                "uid": owner,
                "controller": True,
            }
        ]
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    limits = {keys.GPU_RESOURCE: str(gpus)} if gpus else {}
    spec = {"nodeName": node, "containers": [{"resources": {"limits": limits}}]}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def worker(index: int, node: str, ids: str, **kw: Any) -> Any:
    return pod(
        node, ids, gpus=len(ids.split(",")), name=f"j-worker-{index}", job="j", owner=JOB_UID, **kw
    )


def decision(*workers: tuple[str, tuple[int, ...]], uid: str = JOB_UID) -> topology.Decision:
    assignments = tuple(WorkerAssignment(node, gpus) for node, gpus in workers)
    return topology.Decision(uid, assignments, 25.0, "summary")


KEY = ("ns", "j")
DECISIONS = {KEY: decision(("n0", (0, 1)), ("n0", (2, 3)))}


def test_decisions_hold_their_gpus_and_their_own_workers_add_nothing() -> None:
    held = topology.holdings(DECISIONS, [worker(0, "n0", "0,1"), worker(1, "n0", "2,3")])
    assert held.known == {"n0": {0, 1, 2, 3}}
    assert held.unplaced == {}


def test_a_forged_gpu_ids_annotation_holds_nothing_without_a_gpu_request() -> None:
    held = topology.holdings(DECISIONS, [pod("n0", "4,5,6,7")])
    assert held.known == {"n0": {0, 1, 2, 3}}
    assert held.unplaced == {}


def test_a_pod_no_decision_placed_is_counted_by_its_requests_not_its_annotation() -> None:
    held = topology.holdings({}, [pod("n0", "0", gpus=3), pod("n1", gpus=1, name="other")])
    assert held.known == {}
    assert held.unplaced == {"n0": 3, "n1": 1}
    assert held.note(["n0"], "ns") == "held by pods this operator did not place: n0: squatter (3)"


def test_a_waiting_message_names_no_pod_of_another_namespace() -> None:
    other = pod("n0", gpus=8, name="secret-project-x")
    other["metadata"]["namespace"] = "hostile-b"
    held = topology.holdings({}, [pod("n0", gpus=1), other])
    note = held.note(["n0"], "ns")
    assert note == (
        "held by pods this operator did not place: n0: squatter (1), "
        "8 GPU(s) by pods of other namespaces"
    )
    assert "hostile-b" not in note
    assert "secret-project-x" not in note
    assert held.note(["n0"], "hostile-b") == (
        "held by pods this operator did not place: n0: secret-project-x (8), "
        "1 GPU(s) by pods of other namespaces"
    )


@pytest.mark.parametrize(
    "forged",
    [
        worker(0, "n0", "4,5"),  # not the GPUs its decision gave worker 0
        worker(0, "n1", "0,1"),  # not the node
        worker(5, "n0", "0,1"),  # no such worker in the decision
        pod("n0", "0,1", gpus=2, name="j-worker-0", job="j", owner="another-uid"),
        pod("n0", "0,1", gpus=2, name="j-worker-0", job="j"),  # no owner at all
    ],
)
def test_a_pod_that_only_looks_like_a_placed_worker_is_counted_by_its_requests(
    forged: Any,
) -> None:
    held = topology.holdings(DECISIONS, [forged])
    assert held.known == {"n0": {0, 1, 2, 3}}
    assert sum(held.unplaced.values()) == 2


def aliased(name: str = "j-worker-00", node: str = "n0", ids: str = "0,1", **kw: Any) -> Any:
    """A tenant's pod that copies worker 0 of ``j`` (labels, owner, node, GPU ids) under
    another name."""
    return pod(node, ids, gpus=len(ids.split(",")), name=name, job="j", owner=JOB_UID, **kw)


def relabelled(label: str, value: str | None) -> Any:
    p = worker(0, "n0", "0,1")
    if value is None:
        del p["metadata"]["labels"][label]
    else:
        p["metadata"]["labels"][label] = value
    return p


def elsewhere_ns() -> Any:
    p = worker(0, "n0", "0,1")
    p["metadata"]["namespace"] = "other"
    return p


@pytest.mark.parametrize(
    "alias",
    [
        aliased("j-worker-00"),
        aliased("j-worker-000"),
        aliased("j-worker-\u0660"),  # ARABIC-INDIC DIGIT ZERO: isdigit(), and int() reads 0
        aliased("j-worker-0\u0660"),
        relabelled(keys.LABEL_JOB_ROLE, None),
        relabelled(keys.LABEL_JOB_ROLE, keys.ROLE_LAUNCHER),
        relabelled(keys.LABEL_OPERATOR_NAME, None),
        elsewhere_ns(),
    ],
)
def test_an_aliased_worker_is_a_foreign_pod_beside_the_placed_one(alias: Any) -> None:
    """The real worker 0 runs; a pod that reads as worker 0 only leniently holds GPUs of its
    own on the node, and they are counted, as any foreign pod's."""
    held = topology.holdings(DECISIONS, [worker(0, "n0", "0,1"), worker(1, "n0", "2,3"), alias])
    assert held.known == {"n0": {0, 1, 2, 3}}
    assert held.unplaced == {"n0": 2}
    name = alias["metadata"]["name"]
    assert held.holders == {"n0": [(alias["metadata"]["namespace"], name, 2)]}


def test_an_aliased_worker_leaves_a_full_node_no_gpu_to_offer() -> None:
    """Eight GPUs: the decision's four, and four the alias holds; nothing is left to admit onto
    (the lenient reading left four free, and a victim's worker Pending on them)."""
    decisions = {KEY: decision(("n0", (0, 1, 2, 3)))}
    real = worker(0, "n0", "0,1,2,3")
    alias = aliased(ids="0,1,2,3")
    [state] = topology.node_states([dgx_node()], topology.holdings(decisions, [real, alias]))
    assert state.used == {0, 1, 2, 3}
    assert state.unplaced == 4
    assert state.free_count == 0


def test_a_placed_worker_requesting_more_than_its_assignment_holds_the_rest() -> None:
    """The tenant writes the worker's template: GPUs it asks for beyond its assignment are held
    all the same, and counted as a pod no decision placed, under its name."""
    greedy = worker(0, "n0", "0,1")
    greedy["spec"]["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] = "5"
    held = topology.holdings(DECISIONS, [greedy, worker(1, "n0", "2,3")])
    assert held.known == {"n0": {0, 1, 2, 3}}
    assert held.unplaced == {"n0": 3}
    assert held.holders == {"n0": [("ns", "j-worker-0", 3)]}
    greedy["spec"]["initContainers"] = [{"resources": {"requests": {keys.GPU_RESOURCE: "8"}}}]
    assert topology.holdings(DECISIONS, [greedy]).unplaced == {"n0": 6}


def test_a_placed_worker_requesting_less_than_its_assignment_adds_nothing() -> None:
    modest = worker(0, "n0", "0,1")
    modest["spec"]["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] = "1"
    held = topology.holdings(DECISIONS, [modest])
    assert held.known == {"n0": {0, 1, 2, 3}}
    assert held.unplaced == {}


def test_a_terminating_pod_keeps_its_gpus_until_it_is_gone() -> None:
    held = topology.holdings({}, [pod("n0", gpus=2, terminating=True)])
    assert held.unplaced == {"n0": 2}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_frees_its_gpus(phase: str) -> None:
    assert topology.holdings({}, [pod("n0", gpus=2, phase=phase, terminating=True)]).unplaced == {}


def test_an_unbound_pod_holds_nothing_yet() -> None:
    unbound = pod("n0", gpus=2)
    unbound["spec"]["nodeName"] = ""
    assert topology.holdings({}, [unbound]).unplaced == {}


def test_an_init_container_counts_when_it_asks_for_more_than_the_containers() -> None:
    p = pod("n0", gpus=1)
    p["spec"]["initContainers"] = [{"resources": {"requests": {keys.GPU_RESOURCE: "4"}}}]
    assert topology.holdings({}, [p]).unplaced == {"n0": 4}


def test_unplaced_gpus_lower_what_a_node_can_give() -> None:
    node_body = {
        "metadata": {
            "name": "n0",
            "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY},
            "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topologies.load("dgx1-v100"))},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    held = topology.holdings(DECISIONS, [pod("n0", gpus=3)])
    [state] = topology.node_states([node_body], held)
    assert state.used == {0, 1, 2, 3}
    assert state.free_count == 1


# --- decisions ------------------------------------------------------------------------------


def test_a_decision_object_reads_back_and_belongs_to_its_job_only() -> None:
    job = topology_job()
    job.metadata.uid = JOB_UID
    placement = Placement(
        (WorkerAssignment("n0", (0, 1)), WorkerAssignment("n0", (2, 3))), 25.0, "2x2 on n0"
    )
    body = topology.decision_object(job, placement)
    assert body["metadata"] == {
        "name": "j",
        "namespace": "ns",
        "labels": {keys.LABEL_JOB_NAME: "j"},
    }
    assert "ownerReferences" not in body["metadata"]
    loaded = topology.load_decision(job, body)
    assert loaded == topology.Decision(JOB_UID, placement.assignments, 25.0, "2x2 on n0")
    successor = job.model_copy(deep=True)
    successor.metadata.uid = "uid-successor"
    assert topology.load_decision(successor, body) is None
    scaled = job.model_copy(deep=True)
    assert scaled.spec.worker is not None
    scaled.spec.worker.replicas = 3
    assert topology.load_decision(scaled, body) is None
    assert topology.parse_decision({"spec": {"workers": "junk"}}) is None


def test_a_decision_is_released_only_once_its_job_stopped_and_its_pods_are_gone() -> None:
    job = topology_job()
    job.metadata.uid = JOB_UID
    held = decision(("n0", (0, 1)))
    live = [worker(0, "n0", "0,1")]
    gone = [worker(0, "n0", "0,1", phase="Succeeded")]
    assert not topology.releasable(held, KEY, job, [])  # running: it holds its GPUs
    suspended = job.model_copy(deep=True)
    suspended.spec.run_policy.suspend = True
    terminating = [worker(0, "n0", "0,1", terminating=True)]
    assert not topology.releasable(held, KEY, suspended, terminating)
    assert topology.releasable(held, KEY, suspended, gone)
    assert not topology.releasable(held, KEY, None, live)  # deleted, a pod still terminating
    assert topology.releasable(held, KEY, None, [])
    successor = job.model_copy(deep=True)
    successor.metadata.uid = "uid-successor"
    assert topology.releasable(held, KEY, successor, [])


def test_only_the_placed_workers_keep_a_decision() -> None:
    """A pod naming the job as its controller holds nothing of the decision unless it is a
    placed worker, bound where its assignment says: anyone who may create pods can write such
    a reference."""
    held = decision(("n0", (0, 1)), ("n1", (0, 1)))
    finished = topology_job()
    finished.metadata.uid = JOB_UID
    finished.spec.run_policy.suspend = True
    extra = worker(0, "", "0,1")
    extra["metadata"]["name"] = "j-extra"
    pending = worker(1, "", "0,1")  # never bound
    elsewhere = worker(1, "n0", "0,1")  # bound to another node than its assignment's
    beyond = worker(2, "n1", "0,1")  # an index the decision does not have
    padded = worker(1, "n1", "0,1")
    padded["metadata"]["name"] = "j-worker-01"
    for pods in ([extra], [pending], [elsewhere], [beyond], [padded]):
        assert topology.releasable(held, KEY, None, pods), pods
        assert topology.releasable(held, KEY, finished, pods), pods
    assert not topology.releasable(held, KEY, None, [worker(1, "n1", "0,1")])


def topology_job(node_name: str = "", *, opted: str = "true") -> Any:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "i", "resources": {"limits": {keys.GPU_RESOURCE: 2}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return jobs.parsed(
        jobs.body(
            "j",
            "ns",
            uid="",
            launcher={"spec": {"containers": [{"name": "l"}]}},
            worker={"spec": spec},
            workers=2,
            metadata={"annotations": {keys.GPU_TOPOLOGY: opted}},
        )
    )


def test_a_topology_worker_template_naming_its_node_is_refused_naming_the_field() -> None:
    [error] = topology.template_errors(topology_job("dgx-3"), default=False)
    assert error.path == "spec.mpiReplicaSpecs[Worker].template.spec.nodeName"
    assert error.message.startswith("Forbidden: ")
    assert "remove nodeName" in error.message


def test_node_name_is_the_users_choice_when_the_job_is_not_topology_placed() -> None:
    assert topology.template_errors(topology_job("dgx-3", opted="false"), default=True) == []
    assert topology.template_errors(topology_job(), default=False) == []


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def job_with(worker_spec: dict[str, Any]) -> Any:
    job = topology_job()
    assert job.spec.worker is not None
    job.spec.worker.template["spec"].update(worker_spec)
    return job


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }


def test_without_selector_or_affinity_every_node_is_eligible() -> None:
    assert topology.eligible(topology_job(), node("n0"))


def test_node_selector_labels_must_all_match() -> None:
    job = job_with({"nodeSelector": {"pool": "a", "zone": "z1"}})
    assert topology.eligible(job, node("n0", pool="a", zone="z1", extra="x"))
    assert not topology.eligible(job, node("n1", pool="a"))
    assert not topology.eligible(job, node("n2", pool="b", zone="z1"))


@pytest.mark.parametrize(
    ("expression", "labels", "expected"),
    [
        ({"key": "pool", "operator": "In", "values": ["a", "b"]}, {"pool": "b"}, True),
        ({"key": "pool", "operator": "In", "values": ["a"]}, {}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {"pool": "b"}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, {}, True),
        ({"key": "gpu", "operator": "Exists"}, {"gpu": ""}, True),
        ({"key": "gpu", "operator": "DoesNotExist"}, {"gpu": ""}, False),
        ({"key": "gen", "operator": "Gt", "values": ["7"]}, {"gen": "8"}, True),
        ({"key": "gen", "operator": "Lt", "values": ["7"]}, {"gen": "x"}, False),
    ],
)
def test_required_node_affinity_expressions(
    expression: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    job = job_with(affinity({"matchExpressions": [expression]}))
    assert topology.eligible(job, node("n0", **labels)) is expected


def test_affinity_terms_are_ored_and_match_fields_read_the_node_name() -> None:
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    by_label = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
    job = job_with(affinity(by_name, by_label))
    assert topology.eligible(job, node("n1"))
    assert topology.eligible(job, node("n9", pool="a"))
    assert not topology.eligible(job, node("n2"))
    assert not topology.eligible(job_with(affinity({})), node("n1")), "an empty term matches none"


# --- the dra binding ------------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def dgx_node(name: str = "n0") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY},
            "annotations": {keys.GPU_TOPOLOGY: codec.dumps(topologies.for_node("dgx1-v100", name))},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def slice_of(node: dict[str, Any]) -> dict[str, str]:
    topo = codec.loads(node["metadata"]["annotations"][keys.GPU_TOPOLOGY])
    return {f"gpu-{g.index}": str(g.uuid) for g in topo.gpus}


def test_gpus_allocated_to_anyones_claims_are_taken_by_index_through_the_slice() -> None:
    node = dgx_node()
    held = topology.holdings(
        {}, [], allocated={"n0": ["gpu-1", "gpu-2", "gpu-9"]}, slices={"n0": slice_of(node)}
    )
    [state] = topology.node_states([node], held)
    assert state.used == {1, 2}
    assert state.unplaced == 1, "a device the slice does not name counts, index unknown"
    assert state.free_count == 5


def test_gpus_whose_device_taints_keep_claims_off_are_taken_by_nobody() -> None:
    node = dgx_node()
    uuids = slice_of(node)
    held = topology.holdings(
        {}, [], slices={"n0": uuids}, tainted={"n0": {uuids["gpu-3"], "GPU-elsewhere"}}
    )
    [state] = topology.node_states([node], held)
    assert state.used == {3}
    assert state.unplaced == 0, "a tainted UUID the topology does not name takes nothing"
    assert state.free_count == 7


@pytest.mark.parametrize(
    ("taints", "off"),
    [
        (None, False),
        ([], False),
        ([{"key": "k", "effect": "None"}], False),
        ([{"key": "k", "effect": "NoSchedule"}], True),
        ([{"key": "k", "effect": "NoExecute"}], True),
        ("NoSchedule", False),  # not a list: the API server never serves it, nothing believed
        ([None, {"effect": "NoSchedule"}], True),
    ],
)
def test_which_device_taints_keep_new_claims_off(taints: object, off: bool) -> None:
    assert topology.keeps_claims_off(taints) is off


def test_a_node_whose_slice_disagrees_with_its_topology_is_named() -> None:
    node = dgx_node()
    published = slice_of(node)
    assert topology.slice_conflicts([node], {"n0": published}) == {}
    published["gpu-7"] = "GPU-not-this-one"
    [(name, message)] = topology.slice_conflicts([node], {"n0": published}).items()
    assert name == "n0"
    assert "GPU-not-this-one" in message
    assert "skips the node" in message


def unschedulable_worker(seconds_ago: float, *, bound: bool = False) -> dict[str, Any]:
    since = (T0 - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "cannot allocate all claims",
        "lastTransitionTime": since,
    }
    meta = {
        "name": "j-worker-0",
        "annotations": {keys.GPU_CLAIM: "j-worker-0-gpus", keys.GPU_IDS: "1,2"},
    }
    return {
        "metadata": meta,
        "spec": {"nodeName": "n0"} if bound else {},
        "status": {"phase": "Pending", "conditions": [condition]},
    }


UNALLOCATED = {"j-worker-0-gpus": {"status": {"allocated": []}}}


def test_a_worker_whose_pinned_gpus_stay_unallocatable_past_the_grace_is_placed_anew() -> None:
    taken = topology.gpus_taken([unschedulable_worker(12)], UNALLOCATED, T0, grace=10)
    assert "j-worker-0's GPUs [1,2] could not be allocated for 12s" in taken.message
    assert "placing the job anew" in taken.message


def test_within_the_grace_the_job_is_looked_at_again_when_it_ends() -> None:
    taken = topology.gpus_taken([unschedulable_worker(4)], UNALLOCATED, T0, grace=10)
    assert taken.message == ""
    assert taken.recheck == pytest.approx(6)


def test_an_allocated_claim_or_a_bound_worker_is_no_theft() -> None:
    allocated = {"j-worker-0-gpus": {"status": {"allocated": [["n0", "gpu-1", "gpus"]]}}}
    assert topology.gpus_taken([unschedulable_worker(60)], allocated, T0) == topology.Taken()
    bound = unschedulable_worker(60, bound=True)
    assert topology.gpus_taken([bound], UNALLOCATED, T0) == topology.Taken()


# --- a node lost under a placed job ------------------------------------------------------------


def pool_node(
    name: str, *, ready: bool = True, cordoned: bool = False, since: float | None = None
) -> dict[str, Any]:
    """A node of the topology pool; ``since``: seconds before :data:`T0` its Ready condition
    last changed."""
    condition: dict[str, Any] = {"type": "Ready", "status": str(ready)}
    if since is not None:
        condition["lastTransitionTime"] = stamp(T0 - timedelta(seconds=since))
    return {
        "metadata": {
            "name": name,
            "labels": {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY},
        },
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": [condition]},
    }


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def placed_job() -> Any:
    job = topology_job()
    job.metadata.uid = JOB_UID
    return job


TWO_NODES = decision(("n0", (0, 1)), ("n1", (0, 1)))
BOTH_RUNNING = [worker(0, "n0", "0,1"), worker(1, "n1", "0,1")]
#: Worker 1 gone from n1 (evicted: terminating).
EVICTED = [BOTH_RUNNING[0], worker(1, "n1", "0,1", terminating=True)]
GRACE = topology.NODE_LOST_GRACE_SECONDS


def lost(nodes: Any, pods: Any, health: topology.PoolHealth | None = None) -> topology.Lost:
    health = health or topology.PoolHealth()
    return topology.lost_nodes(TWO_NODES, placed_job(), nodes, pods, T0, health)


def test_healthy_nodes_lose_nothing_and_a_missing_worker_there_is_only_recreated() -> None:
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1")}
    assert lost(nodes, BOTH_RUNNING) == topology.Lost()
    assert lost(nodes, BOTH_RUNNING[:1]) == topology.Lost()


def test_a_deleted_node_loses_its_workers_at_once() -> None:
    nodes = {"n0": pool_node("n0"), "n1": None}
    why = lost(nodes, BOTH_RUNNING).message
    assert why == "node n1 was deleted: its workers are removed and the job placed anew"
    # Even while the pool is disrupted: a deleted node comes back as no other node does.
    assert lost(nodes, BOTH_RUNNING, topology.PoolHealth(disrupted=True)).message == why


def test_a_not_ready_node_keeps_its_worker_while_that_worker_lives() -> None:
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE * 10)}
    assert lost(nodes, BOTH_RUNNING) == topology.Lost()
    why = lost(nodes, EVICTED).message
    assert why == (
        "node n1 is not Ready and its worker is gone (not Ready past the grace of 60s): "
        "its workers are removed and the job placed anew"
    )


def test_a_not_ready_node_loses_a_gone_worker_only_after_the_grace_and_says_when_to_look() -> None:
    """Within the grace a missing worker is only created again: the job is looked at when
    the grace ends, and the node is lost then if it is still not Ready."""
    within = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE - 15)}
    assert lost(within, EVICTED) == topology.Lost(recheck=pytest.approx(15))
    assert lost(within, BOTH_RUNNING[:1]) == topology.Lost(recheck=pytest.approx(15))
    past = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE)}
    assert lost(past, EVICTED).message.startswith("node n1 is not Ready and its worker is gone")


def test_the_grace_counts_from_when_this_process_first_saw_the_node_not_ready_if_later() -> None:
    """A process started long after the node's transition waits a whole grace from its own
    first sight of it; a transition later than that sight counts from the transition."""
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=3600)}
    first_seen = topology.PoolHealth({"n1": T0 - timedelta(seconds=20)})
    assert lost(nodes, EVICTED, first_seen) == topology.Lost(recheck=pytest.approx(GRACE - 20))
    recent = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=5)}
    seen_earlier = topology.PoolHealth({"n1": T0 - timedelta(seconds=3600)})
    assert lost(recent, EVICTED, seen_earlier) == topology.Lost(recheck=pytest.approx(GRACE - 5))
    # Neither known (a condition without a time, never seen): the whole grace from now.
    unknown = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False)}
    assert lost(unknown, EVICTED) == topology.Lost(recheck=pytest.approx(GRACE))


def test_a_node_still_not_ready_when_the_pool_recovers_gets_a_whole_grace_from_then() -> None:
    """Nodes come back one by one: the pool stops being disrupted before the last of them is
    Ready, and those left are not lost for a grace that ran out while nobody could tell."""
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE * 10)}
    recovered = topology.PoolHealth(recovered=T0 - timedelta(seconds=5))
    assert lost(nodes, EVICTED, recovered) == topology.Lost(recheck=pytest.approx(GRACE - 5))
    long_ago = topology.PoolHealth(recovered=T0 - timedelta(seconds=GRACE))
    assert lost(nodes, EVICTED, long_ago).message != ""


def test_while_most_of_the_pool_is_not_ready_no_node_is_lost_for_it() -> None:
    """Past the grace, but most nodes went not Ready together (their heartbeats could not
    reach a restarting API server): nothing is lost; the job is looked at again a while later."""
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE * 10)}
    health = topology.PoolHealth(disrupted=True)
    assert lost(nodes, EVICTED, health) == topology.Lost(recheck=topology.DISRUPTED_RECHECK_SECONDS)


@pytest.mark.parametrize(
    ("not_ready", "pool", "disrupted"),
    [
        (0, 0, False),
        (0, 4, False),
        (1, 4, False),
        (2, 4, False),
        (3, 4, True),
        (4, 4, True),
        (54, 100, False),
        (55, 100, True),
        (1, 2, False),
        (2, 2, True),
        (1, 1, True),
    ],
)
def test_the_pool_is_disrupted_from_55_percent_not_ready(
    not_ready: int, pool: int, disrupted: bool
) -> None:
    assert topology.disrupted(not_ready, pool) is disrupted


def test_a_worker_created_again_on_a_not_ready_node_keeps_nothing_until_it_is_bound() -> None:
    """Within the grace the missing worker was created again, pinned to its node, which takes
    no pod while not Ready: past the grace the node is lost all the same."""
    waiting = worker(1, "n1", "0,1", phase="Pending")
    waiting["spec"]["nodeName"] = ""
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE + 1)}
    assert lost(nodes, [BOTH_RUNNING[0], waiting]).message != ""
    ready = {"n0": pool_node("n0"), "n1": pool_node("n1")}
    assert lost(ready, [BOTH_RUNNING[0], waiting]) == topology.Lost()


def test_a_drained_node_loses_the_worker_it_evicted() -> None:
    nodes = {"n0": pool_node("n0", cordoned=True), "n1": pool_node("n1")}
    assert lost(nodes, BOTH_RUNNING) == topology.Lost()
    why = lost(nodes, BOTH_RUNNING[1:]).message
    assert why.startswith("node n0 was cordoned and its worker is gone")


def test_a_worker_of_an_earlier_job_of_the_name_is_not_this_job_s() -> None:
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE)}
    earlier = [worker(0, "n0", "0,1"), pod("n1", "0,1", name="j-worker-1", job="j", owner="old")]
    assert lost(nodes, earlier).message != ""


def test_only_the_worker_itself_keeps_a_lost_node_s_placement() -> None:
    """A live pod under the name of worker 1 keeps the job on a node that is not Ready only
    if it is the worker the operator created."""
    nodes = {"n0": pool_node("n0"), "n1": pool_node("n1", ready=False, since=GRACE)}
    squatter = worker(1, "n1", "0,1")
    del squatter["metadata"]["labels"][keys.LABEL_JOB_ROLE]
    assert lost(nodes, BOTH_RUNNING) == topology.Lost()
    why = lost(nodes, [BOTH_RUNNING[0], squatter]).message
    assert why.startswith("node n1 is not Ready and its worker is gone")


def stuck(p: Any, seconds_ago: float) -> Any:
    """``p`` unbound and unschedulable for ``seconds_ago``."""
    since = (T0 - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    p["spec"]["nodeName"] = ""
    p["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "Insufficient nvidia.com/gpu",
                "lastTransitionTime": since,
            }
        ],
    }
    return p


def test_only_a_worker_of_the_job_unschedulable_too_long_releases_its_placement() -> None:
    alias = stuck(aliased("j-worker-00"), 600)
    assert topology.unschedulable_workers(TWO_NODES, KEY, [alias], T0, 300) == topology.Taken()
    real = stuck(worker(0, "n0", "0,1"), 600)
    taken = topology.unschedulable_workers(TWO_NODES, KEY, [alias, real], T0, 300)
    assert taken.message.startswith("worker j-worker-0 has been unschedulable for 600s")
    soon = stuck(worker(1, "n1", "0,1"), 100)
    assert topology.unschedulable_workers(TWO_NODES, KEY, [soon], T0, 300).recheck == 200

"""Admission over a fabric: clique-aware placement, levels from annotations, ComputeDomains."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from mpijob import api, keys
from mpijob.desired import compute_domain
from mpijob.desired.sync import _place
from mpijob.gang import queue, topology
from mpijob.gang.service import Admission
from mpijob.placement import codec, fabric, fabric_labels, topologies
from mpijob.platform.kube import ApiError
from support import jobs
from support.fake_kube import FakeKube
from support.virtual_time import virtual_time

pytestmark = pytest.mark.unit

NVL72 = fabric.load("nvl72")


def tray(name: str, clique: str) -> dict[str, Any]:
    """A GB200 tray as the node watch delivers it: opted in, GFD's clique label, GKE's blocks."""
    return {
        "metadata": {
            "name": name,
            "labels": {
                keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_TOPOLOGY,
                fabric.BLOCK_LABEL: "block-a",
                fabric.SUBBLOCK_LABEL: "leaf-a",
                fabric.CLIQUE_LABEL: clique,
            },
            "annotations": {
                keys.GPU_TOPOLOGY: codec.dumps(topologies.for_node("gb200-tray", name))
            },
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


RACKS = [tray(f"c{c}-t{t:02d}", f"uuid.{c}") for c in range(2) for t in range(18)]


TEMPLATE = jobs.gpu_template(4)


def job(name: str, workers: int, **annotations: str) -> api.MPIJob:
    metadata = {
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "annotations": {keys.GPU_TOPOLOGY: "true", **annotations},
    }
    return jobs.parsed(
        jobs.body(
            name, "ns", launcher=TEMPLATE, worker=TEMPLATE, workers=workers, metadata=metadata
        )
    )


class Harness:
    def __init__(self, *jobs: api.MPIJob, served: bool = True) -> None:
        self.jobs = list(jobs)
        self.decisions: list[dict[str, Any]] = []
        self.kube = FakeKube()
        if not served:  # NVIDIA's DRA driver is not installed
            self.kube.fail("create", ApiError(404, "NotFound", "the server could not find it"))
        self.admission = Admission(
            write_decision=self.write,
            enqueue=lambda key: None,
            snapshot=lambda: topology.Snapshot(RACKS, [], {}),
            live=lambda key: next((j for j in self.jobs if (j.namespace, j.name) == key), None),
            decision_of=lambda key: None,
            priority_values=dict,
            inter_node_gbps=12.5,
            fabric=NVL72,
            create_object=self.kube.create,
            get_object=self.kube.get,
        )

    async def write(self, obj: dict[str, Any]) -> None:
        self.decisions.append(obj)

    @property
    def created(self) -> list[dict[str, Any]]:
        """The objects the API made, as sent."""
        return [c.args[0] for c in self.kube.done("create")]

    async def run(self) -> None:
        for j in self.jobs:
            self.admission.want((j.namespace, j.name), j)
        await self.admission.run_pass()

    def last(self, name: str) -> queue.Decision[Any] | None:
        return self.admission.decision(("ns", name))


async def test_sixteen_by_four_lands_in_one_clique_and_gets_its_compute_domain() -> None:
    h = Harness(job("train", 16))
    await h.run()
    assert isinstance(h.last("train"), queue.Admit)
    (decision,) = h.decisions
    nodes = {w["node"] for w in decision["spec"]["workers"]}
    assert len(nodes) == 16
    assert len({n.split("-")[0] for n in nodes}) == 1, "one clique"
    assert decision["spec"]["computeDomain"] == "train-compute-domain"
    assert decision["spec"]["summary"].endswith("in clique uuid.0")
    (domain,) = h.created
    assert domain == compute_domain.compute_domain("train", "ns", "uid-train")
    assert domain["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    assert domain["spec"]["channel"]["resourceClaimTemplate"]["name"] == (
        "train-compute-domain-channel"
    )
    # Every worker claims a channel from the domain's template.
    parsed = topology.parse_decision(decision)
    assert parsed is not None
    placements = topology.pod_placements(parsed, {})
    assert {p.channel_template for p in placements} == {"train-compute-domain-channel"}
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "c", "resources": {}}]}}
    _place(pod, placements[0])
    assert pod["spec"]["resourceClaims"] == [
        {"name": keys.CHANNEL_CLAIM, "resourceClaimTemplateName": "train-compute-domain-channel"}
    ]
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": keys.CHANNEL_CLAIM}]


async def test_a_job_on_one_node_gets_no_compute_domain() -> None:
    h = Harness(job("small", 1))
    await h.run()
    assert isinstance(h.last("small"), queue.Admit)
    assert "computeDomain" not in h.decisions[0]["spec"]
    assert h.created == []


async def test_required_clique_across_two_cliques_waits_and_says_why() -> None:
    h = Harness(job("big", 20, **{keys.FABRIC_REQUIRED_LEVEL: "clique"}))
    await h.run()
    last = h.last("big")
    assert isinstance(last, queue.Wait)
    assert "needs 20x4 GPUs within one clique (nvidia.com/gpu.clique)" in last.message
    assert h.decisions == []
    assert h.created == []


async def test_preferred_clique_spans_two_and_says_which() -> None:
    h = Harness(job("big", 20, **{keys.FABRIC_PREFERRED_LEVEL: "clique"}))
    await h.run()
    assert isinstance(h.last("big"), queue.Admit)
    (decision,) = h.decisions
    assert len({w["node"].split("-")[0] for w in decision["spec"]["workers"]}) == 2
    assert "preferred clique not kept" in decision["spec"]["summary"]
    assert "computeDomain" not in decision["spec"]
    assert h.created == []


async def test_a_level_the_fabric_lacks_is_named_in_the_waiting_message() -> None:
    h = Harness(job("odd", 2, **{keys.FABRIC_REQUIRED_LEVEL: "rack"}))
    await h.run()
    last = h.last("odd")
    assert isinstance(last, queue.Wait)
    assert "metadata.annotations[mpijob.io/fabric-required-level]" in last.message
    assert '"block", "clique", "leaf", "node"' in last.message


async def test_without_the_drivers_crd_the_job_waits_naming_it() -> None:
    h = Harness(job("train", 16), served=False)
    await h.run()
    last = h.last("train")
    assert isinstance(last, queue.Wait)
    assert "ComputeDomain is not served" in last.message
    assert "NVIDIA's DRA driver" in last.message
    assert h.decisions == []


@pytest.mark.parametrize("owner", ["uid-train", "uid-another-job"])
async def test_a_compute_domain_of_the_jobs_name_is_adopted_only_when_it_is_the_jobs(
    owner: str,
) -> None:
    """Made before a restart (its decision never written), the job's own domain is used as it
    is; another's of the same name is left alone, and the job waits, saying so."""
    h = Harness(job("train", 16))
    existing = compute_domain.compute_domain("train", "ns", owner)
    h.kube.add(existing)
    await h.run()
    assert h.kube.stored(keys.COMPUTE_DOMAIN_KIND, "ns") == [
        {**existing, "metadata": {**existing["metadata"], "resourceVersion": "1"}}
    ]
    if owner == "uid-train":
        assert isinstance(h.last("train"), queue.Admit)
        assert h.decisions[0]["spec"]["computeDomain"] == "train-compute-domain"
    else:
        last = h.last("train")
        assert isinstance(last, queue.Wait)
        assert "ComputeDomain train-compute-domain exists and belongs to something else" in (
            last.message
        )
        assert h.decisions == []


def test_fabric_flag_names_a_shipped_fabric_or_a_file(tmp_path: Any) -> None:
    from mpijob.handlers.startup import load_fabric

    assert load_fabric("") is None
    assert load_fabric("nvl72") == NVL72
    spec = tmp_path / "fabric.yaml"
    spec.write_text(
        "levels:\n"
        "  - {name: block, nodeLabel: cloud.google.com/gce-topology-block, gbps: 25}\n"
        "  - {nodeLabel: kubernetes.io/hostname}\n"
        "outsideGbps: 10\n"
    )
    loaded = load_fabric(str(spec))
    assert loaded is not None
    assert loaded.level_names == ("block", "node")
    with pytest.raises(ValueError, match="neither a shipped fabric"):
        load_fabric(str(tmp_path / "missing.yaml"))
    spec.write_text("levels: [{name: block, gbps: 25}]\n")
    with pytest.raises(ValueError, match=r"fabric.levels\[0\].nodeLabel"):
        load_fabric(str(spec))


# --- Volcano HyperNodes as the fabric -----------------------------------------------------------

HYPERNODE_FABRIC = fabric_labels.fabric_from_spec(
    {
        "levels": [
            {"name": "spine", "hyperNodeTier": 2, "gbps": 25},
            {"name": "rack", "hyperNodeTier": 1, "gbps": 900},
        ],
        "outsideGbps": 12.5,
    }
)
# Two racks of trays, no GFD or GKE label read: only the HyperNodes say which tray is where.
HYPERNODES = [
    {
        "metadata": {"name": f"rack-{c}"},
        "spec": {
            "tier": 1,
            "members": [{"type": "Node", "selector": {"regexMatch": {"pattern": f"^c{c}-"}}}],
        },
    }
    for c in range(2)
] + [
    {
        "metadata": {"name": "spine"},
        "spec": {
            "tier": 2,
            "members": [{"type": "HyperNode", "selector": {"regexMatch": {"pattern": "^rack-"}}}],
        },
    }
]


def hypernode_harness(*jobs: api.MPIJob, hypernodes: list[dict[str, Any]]) -> Harness:
    h = Harness(*jobs)
    h.admission.fabric = HYPERNODE_FABRIC
    h.admission.snapshot = lambda: topology.Snapshot(RACKS, [], {}, hypernodes=hypernodes)
    return h


async def test_hypernodes_place_a_job_inside_one_tier_one_hypernode() -> None:
    h = hypernode_harness(job("train", 16), hypernodes=HYPERNODES)
    await h.run()
    (decision,) = h.decisions
    assert len({w["node"].split("-")[0] for w in decision["spec"]["workers"]}) == 1
    assert decision["spec"]["ringGBps"] == 900.0
    assert "in rack rack-" in decision["spec"]["summary"]


async def test_required_hypernode_level_across_two_waits_naming_the_tier() -> None:
    h = hypernode_harness(
        job("wide", 20, **{keys.FABRIC_REQUIRED_LEVEL: "rack"}), hypernodes=HYPERNODES
    )
    await h.run()
    last = h.last("wide")
    assert isinstance(last, queue.Wait)
    assert "needs 20x4 GPUs within one rack (tier 1 HyperNodes); most room in one rack: 18" in (
        last.message
    )


async def test_without_hypernodes_a_required_tier_waits_and_the_rest_still_run() -> None:
    # Volcano's CRD absent (or no HyperNode yet): no node is in any domain of those levels.
    h = hypernode_harness(
        job("wide", 2, **{keys.FABRIC_REQUIRED_LEVEL: "rack"}), job("free", 2), hypernodes=[]
    )
    await h.run()
    last = h.last("wide")
    assert isinstance(last, queue.Wait)
    assert "no eligible node is in a tier 1 HyperNode" in last.message
    assert isinstance(h.last("free"), queue.Admit)


@virtual_time
async def test_hypernodes_are_listed_until_volcanos_kind_is_served_and_wake_the_admission() -> None:
    """Listed, not watched: a 404 (Volcano's CRD absent, or not served yet) means none; the
    next list that finds them stores them and wakes the admission."""
    from mpijob.handlers import watches

    kube = FakeKube()
    kube.fail("list", ApiError(404, "NotFound", "page not found"))
    kube.add(
        *({"apiVersion": keys.HYPERNODE_API_VERSION, "kind": "HyperNode", **h} for h in HYPERNODES)
    )
    woken: list[bool] = []
    rt = SimpleNamespace(
        kube=kube,
        cache=SimpleNamespace(hypernodes=[]),
        admission=SimpleNamespace(wake=lambda: woken.append(True)),
    )
    following = asyncio.create_task(watches.follow_hypernodes(rt))  # type: ignore[arg-type]
    await asyncio.sleep(2.5 * watches.HYPERNODE_POLL_SECONDS)  # lists at 0, 10 and 20 s
    following.cancel()
    assert len(kube.calls) == 3
    assert {h["metadata"]["name"] for h in rt.cache.hypernodes} == {
        h["metadata"]["name"] for h in HYPERNODES
    }
    assert woken == [True], "woken once: when they appeared, not for an unchanged list"
    assert {c.args[:2] for c in kube.calls} == {(keys.HYPERNODE_API_VERSION, "HyperNode")}


# --- A level annotation the fabric lacks: the job is Invalid, naming the annotation ------------


def test_a_level_the_fabric_lacks_makes_the_job_invalid_naming_annotation_and_levels() -> None:
    from mpijob.handlers.reconcile import checked
    from mpijob.settings import OperatorSettings

    raw: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND,
        "metadata": {
            "name": "odd",
            "namespace": "ns",
            "uid": "uid-odd",
            "annotations": {keys.FABRIC_PREFERRED_LEVEL: "rack"},
        },
        "spec": {
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": TEMPLATE},
                "Worker": {"replicas": 2, "template": TEMPLATE},
            }
        },
    }
    _, errors = checked(raw, OperatorSettings(), NVL72)
    message = api.validation_message(errors)
    assert "metadata.annotations[mpijob.io/fabric-preferred-level]" in message
    assert 'Unsupported value: "rack"' in message
    assert '"block", "clique", "leaf", "node"' in message
    # Without a fabric the annotation means nothing and refuses nothing.
    assert checked(raw, OperatorSettings(), None)[1] == []
    raw["metadata"]["annotations"] = {keys.FABRIC_PREFERRED_LEVEL: "clique"}
    assert checked(raw, OperatorSettings(), NVL72)[1] == []


async def test_hypernodes_that_appear_later_are_read_on_the_next_pass() -> None:
    seen: list[dict[str, Any]] = []
    h = hypernode_harness(job("train", 16, **{keys.FABRIC_REQUIRED_LEVEL: "rack"}), hypernodes=seen)
    await h.run()
    assert isinstance(h.last("train"), queue.Wait)
    await h.admission.run_pass()  # the same nodes and HyperNodes: where they are is kept
    assert isinstance(h.last("train"), queue.Wait)
    seen += HYPERNODES
    await h.admission.run_pass()
    assert isinstance(h.last("train"), queue.Admit)

"""The examples: valid MPIJobs (and the one plain Job, cuda-sample), upstream fields only (plus
our one annotation), documented."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from manifests_files import ROOT

from mpijob import api, keys
from mpijob.shares.request import read_request

pytestmark = pytest.mark.unit

EXAMPLES = ROOT / "examples"
#: The plain batch/v1 Job asking for a GPU share (fractional GPUs work for any pod).
PLAIN_JOB = "cuda-sample.yaml"
ALL_FILES = sorted(EXAMPLES.glob("*.yaml"))
FILES = [p for p in ALL_FILES if p.name != PLAIN_JOB]


def load(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path.name}: one MPIJob per file"
    return dict(docs[0])


def our_keys(value: Any) -> set[str]:
    """Every mapping key under our prefix, anywhere in the document."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if str(key).startswith(keys.PREFIX):
                found.add(str(key))
            found |= our_keys(item)
    elif isinstance(value, list):
        for item in value:
            found |= our_keys(item)
    return found


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_example_is_a_valid_mpijob(path: Path) -> None:
    body = load(path)
    assert body["apiVersion"] == keys.API_VERSION
    assert body["kind"] == keys.KIND
    assert body["metadata"]["name"] == path.stem
    job = api.with_defaults(api.parse({**body, "metadata": {**body["metadata"], "namespace": "x"}}))
    assert api.validate(job) == []


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_example_uses_no_extension_but_the_topology_and_launch_annotations(path: Path) -> None:
    """Upstream's CRD takes every file unchanged; simulation annotations never ship."""
    assert our_keys(load(path)) <= {keys.GPU_TOPOLOGY, keys.LAUNCH}


def test_the_seed_scenarios_are_all_there() -> None:
    names = {p.stem for p in ALL_FILES}
    assert names >= {
        "pytorch-vgg16-topology",
        "pytorch-vgg16",
        "pytorch-resnet50-topology",
        "pytorch-resnet50",
        "tensorflow-benchmarks",
        "tensorflow-hostnetwork",
        "pi",
        "pi-intel",
        "pi-mpich",
        "pi-restricted",
        "pi-suspended",
        "cuda-sample",
        "pytorch-fractional",
    }


@pytest.mark.parametrize("model", ["vgg16", "resnet50"])
def test_topology_pair_differs_only_in_placement(model: str) -> None:
    topo = load(EXAMPLES / f"pytorch-{model}-topology.yaml")
    plain = load(EXAMPLES / f"pytorch-{model}.yaml")
    assert topo["metadata"]["annotations"] == {keys.GPU_TOPOLOGY: "true"}
    workers = topo["spec"]["mpiReplicaSpecs"]["Worker"]
    assert workers["replicas"] == 4
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[keys.GPU_RESOURCE] == 1
    assert topo["spec"]["runPolicy"].pop("schedulingPolicy") == {"minAvailable": 5}
    assert topo["spec"] == plain["spec"]
    launcher = topo["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][-3] == model


def test_host_network_example_resolves_and_moves_sshd_off_port_22() -> None:
    specs = load(EXAMPLES / "tensorflow-hostnetwork.yaml")["spec"]["mpiReplicaSpecs"]
    for replica in specs.values():
        pod = replica["template"]["spec"]
        assert pod["hostNetwork"] is True
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "2222" in specs["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert "-p 2222" in specs["Launcher"]["template"]["spec"]["containers"][0]["command"]


def test_restricted_example_runs_as_uid_1000_without_privileges() -> None:
    body = load(EXAMPLES / "pi-restricted.yaml")
    assert body["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    for replica in body["spec"]["mpiReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 1000
        for container in pod["containers"]:
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_readme_lists_every_example() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    assert all(f"`{p.name}`" in readme for p in ALL_FILES)


def test_share_examples_ask_for_valid_shares() -> None:
    """cuda-sample: the seed's 2 GiB and 30%, in a plain Job; the MPIJob's workers 2 GiB, 25%."""
    job = load(EXAMPLES / PLAIN_JOB)
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == (
        "batch/v1",
        "Job",
        "cuda-sample",
    )
    assert our_keys(job) == set()
    request = read_request(job["spec"]["template"]["spec"])
    assert request.errors == ()
    assert request.share is not None
    assert (request.share.memory_gib, request.share.percentage) == (2, 30)
    workers = load(EXAMPLES / "pytorch-fractional.yaml")["spec"]["mpiReplicaSpecs"]["Worker"]
    share = read_request(workers["template"]["spec"]).share
    assert share is not None
    assert (workers["replicas"], share.memory_gib, share.percentage) == (4, 2, 25)

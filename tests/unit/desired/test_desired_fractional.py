"""What a placed share writes into its pod: env, annotation, pipe mount, node pinning."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob import keys
from mpijob.api.fractional import Placed, Share
from mpijob.desired.fractional import (
    PIPE_VOLUME,
    client_env,
    json_patch,
    mps_directories,
    pod_edits,
)

UUID = "GPU-51db687b-8982-c807-8457-7a4fbbbe99ff"
MEM = keys.GPU_MEM_RESOURCE
CORE = keys.GPU_CORE_PERCENTAGE_RESOURCE


def apply(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A small RFC 6902 add/replace, enough to check the patch lands where intended."""
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = document
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        last = parts[-1]
        if isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            else:
                target[int(last)] = op["value"]
        else:
            assert op["op"] == "add" or last in target
            target[last] = op["value"]
    return document


def cuda_sample(**extra: Any) -> dict[str, Any]:
    container = {
        "name": "cuda",
        "image": "cuda-sample",
        "resources": {"limits": {MEM: "2", CORE: "30"}},
    }
    container.update(extra)
    return {
        "metadata": {"name": "cuda-sample"},
        "spec": {"containers": [{"name": "side"}, container]},
    }


PLACED = Placed("gpu-node-1", 2, UUID, Share(2, 30))


def test_the_client_sees_one_gpu_as_device_zero_with_its_limits() -> None:
    env = client_env((2, 30), UUID)
    assert env == {
        keys.ENV_NVIDIA_VISIBLE_DEVICES: UUID,
        keys.ENV_MPS_PIPE_DIRECTORY: f"{keys.MPS_ROOT}/{UUID}/pipe",
        keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT: "0=2G",
        keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE: "30",
    }


def test_memory_only_sets_no_thread_percentage() -> None:
    assert keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE not in client_env((4, None), UUID)


def test_edits_touch_only_the_containers_holding_the_share() -> None:
    edits = pod_edits(cuda_sample(), PLACED)
    assert set(edits.env) == {1}
    assert edits.env[1][keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT] == "0=2G"
    assert edits.mounts[1] == (
        {"name": PIPE_VOLUME, "mountPath": mps_directories(UUID).pipe, "readOnly": True},
    )
    assert Placed.loads(edits.annotations[keys.GPU_SHARE]) == PLACED


def test_the_patch_applies_to_a_bare_pod() -> None:
    pod = cuda_sample()
    patched = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    container = patched["spec"]["containers"][1]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[keys.ENV_NVIDIA_VISIBLE_DEVICES] == UUID
    assert env[keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "30"
    assert container["volumeMounts"][0]["mountPath"] == mps_directories(UUID).pipe
    assert "env" not in patched["spec"]["containers"][0]
    assert patched["spec"]["volumes"] == [
        {"name": PIPE_VOLUME, "hostPath": {"path": mps_directories(UUID).pipe, "type": "Directory"}}
    ]
    assert patched["metadata"]["annotations"][keys.GPU_SHARE] == PLACED.dumps()
    terms = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}
    ]


def test_our_variables_replace_the_users_and_theirs_stay() -> None:
    pod = cuda_sample(
        env=[
            {"name": "FOO", "value": "bar"},
            {"name": keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE, "value": "100"},
        ]
    )
    patched = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    env = patched["spec"]["containers"][1]["env"]
    assert {"name": "FOO", "value": "bar"} in env
    values = [e["value"] for e in env if e["name"] == keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE]
    assert values == ["30"]


def test_existing_node_affinity_terms_each_get_the_node() -> None:
    pod = cuda_sample()
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["x"]}
                        ]
                    },
                ]
            }
        }
    }
    patched = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    terms = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}
    assert all(pin in term["matchFields"] for term in terms)
    assert terms[0]["matchExpressions"][0]["key"] == "zone"
    assert len(terms[1]["matchFields"]) == 2


@pytest.mark.parametrize("annotations", [None, {"a": "b"}])
def test_annotations_are_added_beside_existing_ones(annotations: dict[str, str] | None) -> None:
    pod = cuda_sample()
    if annotations is not None:
        pod["metadata"]["annotations"] = dict(annotations)
    patched = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    assert patched["metadata"]["annotations"].get("a") == (annotations or {}).get("a")
    assert keys.GPU_SHARE in patched["metadata"]["annotations"]

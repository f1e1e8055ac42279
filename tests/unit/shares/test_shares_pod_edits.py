"""What a share writes into its pod: env, annotations, MPS mount, node pinning or the gate."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from mpijob import keys
from mpijob.shares.pod_edits import (
    MPS_VOLUME,
    UUID_FIELD,
    client_env,
    container_env,
    json_patch,
    placement_edits,
    pod_edits,
    resolve_env,
)
from mpijob.shares.request import ContainerShare, Placed, Share

UUID = "GPU-51db687b-8982-c807-8457-7a4fbbbe99ff"
MEM = keys.GPU_MEM_RESOURCE
CORE = keys.GPU_CORE_PERCENTAGE_RESOURCE


def apply(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(document, ops)
    return result


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


def seen(pod: dict[str, Any], index: int = 1) -> dict[str, str]:
    """What container ``index`` of ``pod`` sees when it starts."""
    container = pod["spec"]["containers"][index]
    return resolve_env(container["env"], pod["metadata"].get("annotations") or {})


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


def test_the_written_env_names_no_gpu_and_reads_its_uuid_at_start() -> None:
    entries = container_env(ContainerShare("cuda", 2, 30))
    assert UUID not in repr(entries)
    assert entries[0] == {
        "name": keys.ENV_NVIDIA_VISIBLE_DEVICES,
        "valueFrom": {"fieldRef": {"fieldPath": UUID_FIELD}},
    }
    assert f"metadata.annotations['{keys.GPU_SHARE_UUID}']" == UUID_FIELD
    assert entries[1]["value"] == f"{keys.MPS_ROOT}/$(NVIDIA_VISIBLE_DEVICES)/pipe"


def test_env_resolution_follows_the_kubelet() -> None:
    entries = [
        {"name": "B", "value": "$(A)/x"},  # A not defined yet: left as written
        {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['k']"}}},
        {"name": "C", "value": "$(A)/$(A)-$(NONE)"},
        {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gone']"}}},
    ]
    assert resolve_env(entries, {"k": "v"}) == {
        "B": "$(A)/x",
        "A": "v",
        "C": "v/v-$(NONE)",
        "D": "",
    }
    with pytest.raises(ValueError, match="unsupported fieldRef"):
        resolve_env([{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}], {})


def test_edits_touch_only_the_containers_holding_the_share() -> None:
    edits = pod_edits(cuda_sample(), PLACED)
    assert set(edits.env) == {1}
    assert edits.mounts[1] == ({"name": MPS_VOLUME, "mountPath": keys.MPS_ROOT, "readOnly": True},)
    assert Placed.loads(edits.annotations[keys.GPU_SHARE]) == PLACED
    assert edits.annotations[keys.GPU_SHARE_UUID] == UUID


def test_the_patch_applies_to_a_bare_pod() -> None:
    pod = cuda_sample()
    patched = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    assert seen(patched) == client_env((2, 30), UUID)
    container = patched["spec"]["containers"][1]
    assert container["volumeMounts"][0]["mountPath"] == keys.MPS_ROOT
    assert "env" not in patched["spec"]["containers"][0]
    # The node agent's CSI driver, never a hostPath (a baseline namespace refuses those).
    assert patched["spec"]["volumes"] == [
        {"name": MPS_VOLUME, "csi": {"driver": keys.MPS_CSI_DRIVER, "readOnly": True}}
    ]
    assert patched["metadata"]["annotations"] == {
        keys.GPU_SHARE: PLACED.dumps(),
        keys.GPU_SHARE_UUID: UUID,
    }
    assert "schedulingGates" not in patched["spec"]
    terms = patched["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}
    ]


def test_a_pod_that_waits_is_gated_and_placed_later_as_if_placed_at_once() -> None:
    pod = cuda_sample()
    pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    waiting = apply(pod, json_patch(pod, pod_edits(pod, "no GPU has 2 GiB free")))
    assert waiting["spec"]["schedulingGates"] == [
        {"name": "kueue.x-k8s.io/admission"},
        {"name": keys.GPU_SHARE_GATE},
    ]
    assert waiting["metadata"]["annotations"] == {keys.GPU_SHARE_WAITING: "no GPU has 2 GiB free"}
    assert "affinity" not in waiting["spec"]
    # Started now, the container would name no GPU (its UUID annotation is not there yet).
    assert seen(waiting)[keys.ENV_NVIDIA_VISIBLE_DEVICES] == ""
    placed = apply(waiting, json_patch(waiting, placement_edits(PLACED)))
    assert placed["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    at_once = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    assert placed == at_once
    assert seen(placed) == client_env((2, 30), UUID)


def test_placing_a_pod_whose_gate_went_meanwhile_fails_whole() -> None:
    pod = cuda_sample()
    waiting = apply(pod, json_patch(pod, pod_edits(pod, "full")))
    ops = json_patch(waiting, placement_edits(PLACED))
    moved = copy.deepcopy(waiting)
    moved["spec"]["schedulingGates"].insert(0, {"name": "other"})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        apply(moved, ops)


def test_our_variables_replace_the_users_and_theirs_stay_first() -> None:
    pod = cuda_sample(
        env=[
            {"name": keys.ENV_MPS_PIPE_DIRECTORY, "value": "/elsewhere"},
            {"name": "FOO", "value": "bar"},
            {"name": keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE, "value": "100"},
        ]
    )
    patched = apply(pod, json_patch(pod, pod_edits(pod, PLACED)))
    env = patched["spec"]["containers"][1]["env"]
    assert env[0] == {"name": "FOO", "value": "bar"}
    assert [e["name"] for e in env].count(keys.ENV_MPS_ACTIVE_THREAD_PERCENTAGE) == 1
    assert seen(patched) == {"FOO": "bar", **client_env((2, 30), UUID)}


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


def test_a_share_pod_naming_no_runtime_class_gets_the_configured_one() -> None:
    """Seed 001's cuda-sample names no RuntimeClass; the share's NVIDIA_VISIBLE_DEVICES is read
    only by the nvidia runtime, so the operator's setting fills it in at admission."""
    body = cuda_sample()
    patched = apply(body, json_patch(body, pod_edits(body, PLACED, runtime_class="nvidia")))
    assert patched["spec"]["runtimeClassName"] == "nvidia"
    waiting = apply(body, json_patch(body, pod_edits(body, "no room", runtime_class="nvidia")))
    assert waiting["spec"]["runtimeClassName"] == "nvidia"


def test_a_pods_own_runtime_class_is_kept_and_an_empty_setting_adds_none() -> None:
    own = cuda_sample()
    own["spec"]["runtimeClassName"] = "nvidia-cdi"
    ops = json_patch(own, pod_edits(own, PLACED, runtime_class="nvidia"))
    assert not [op for op in ops if op["path"] == "/spec/runtimeClassName"]
    assert apply(own, ops)["spec"]["runtimeClassName"] == "nvidia-cdi"
    body = cuda_sample()
    assert "runtimeClassName" not in apply(body, json_patch(body, pod_edits(body, PLACED))).get(
        "spec", {}
    )


def test_placing_a_waiting_pod_later_never_touches_its_runtime_class() -> None:
    """The field is immutable once the pod exists: only admission may write it."""
    body = cuda_sample()
    assert not [
        op for op in json_patch(body, placement_edits(PLACED)) if "runtimeClassName" in op["path"]
    ]


def test_why_a_pod_waits_is_written_only_while_it_is_gated() -> None:
    from mpijob.shares.pod_edits import ADMITTED, waiting_patch

    pod = cuda_sample()
    gated = apply(pod, json_patch(pod, pod_edits(pod, ADMITTED)))
    told = apply(gated, waiting_patch(gated, "no GPU has 2 GiB free"))
    assert told["metadata"]["annotations"][keys.GPU_SHARE_WAITING] == "no GPU has 2 GiB free"
    placed = apply(gated, json_patch(gated, placement_edits(PLACED)))
    # A reason computed from a stale body fails as a whole once the pod was placed.
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        apply(placed, waiting_patch(gated, "late"))
    assert waiting_patch(placed, "late") == []

"""The agent's report of placements not honoured, against a fake kubelet and a fake API.

The kubelet is a real gRPC server on a unix socket (:mod:`support.fake_kubelet`); the API server is
:class:`FakeKube`, which keeps pods and records patches and Events as the real one would.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mpijob import keys
from mpijob.agent.gpu_actual import GpuActual
from mpijob.agent.podresources import Verdict
from support.fake_kubelet import NODE, UUIDS, FakeKubelet, api_pod, dra_pod, plugin_pod, serving

METRIC = "mpijob_agent_placements_not_honoured_total"


class FakeKube:
    """The agent's API calls, served from memory."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: list[dict[str, Any]] = []
        self.patches: list[tuple[str, str, str, str | None]] = []
        self.events: list[tuple[dict[str, Any], str, str, str]] = []
        self.fail_patch = False

    def add(self, pod: dict[str, Any], *, job: str = "vgg16", claim: bool = False) -> None:
        meta = pod["metadata"]
        meta["ownerReferences"] = [
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND,
                "name": job,
                "uid": f"uid-{job}",
                "controller": True,
            }
        ]
        if claim:
            meta["annotations"][keys.GPU_CLAIM] = meta["name"] + "-gpus"
        self.pods[(meta["namespace"], meta["name"])] = pod

    def annotation(self, name: str, namespace: str = "team") -> str | None:
        value = self.pods[(namespace, name)]["metadata"]["annotations"].get(keys.GPU_ACTUAL)
        return None if value is None else str(value)

    def node_pods(self, node: str) -> list[Mapping[str, Any]]:
        return [dict(p) for p in self.pods.values()]

    def node_slices(self, node: str) -> list[Mapping[str, Any]]:
        return list(self.slices)

    def annotate_pod(self, namespace: str, name: str, key: str, value: str | None) -> None:
        if self.fail_patch:
            raise RuntimeError("apiserver said no")
        self.patches.append((namespace, name, key, value))
        annotations = self.pods[(namespace, name)]["metadata"]["annotations"]
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value

    def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        self.events.append((dict(involved), type_, reason, message))


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "kubelet.sock")


@pytest.fixture
def kubelet(socket_path: str) -> Iterator[FakeKubelet]:
    with serving(socket_path) as fake:
        yield fake


def counted(binding: str) -> float:
    return REGISTRY.get_sample_value(METRIC, {"binding": binding}) or 0.0


def test_a_pod_holding_its_placed_gpus_gets_no_annotation(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[1], UUIDS[0]]))
    kubelet.pods = [plugin_pod("w-0", [UUIDS[0], UUIDS[1]])]
    checks = GpuActual(kube, NODE, socket=socket_path).step()
    assert [c.verdict for c in checks] == [Verdict.MATCH]
    assert kube.patches == []
    assert kube.events == []


def test_a_mismatch_is_annotated_counted_and_reported_once(
    kubelet: FakeKubelet, socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0], UUIDS[1]]))
    kubelet.pods = [plugin_pod("w-0", [UUIDS[0], UUIDS[5]])]
    check = GpuActual(kube, NODE, socket=socket_path)
    before = counted("annotations")
    with caplog.at_level(logging.WARNING, logger="mpijob.agent"):
        for _ in range(3):
            assert [c.verdict for c in check.step()] == [Verdict.MISMATCH]
    actual = f"{UUIDS[0]},{UUIDS[5]}"
    assert kube.annotation("w-0") == actual
    assert kube.patches == [("team", "w-0", keys.GPU_ACTUAL, actual)]
    assert counted("annotations") - before == 1
    assert kube.events == [
        (
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND,
                "name": "vgg16",
                "namespace": "team",
                "uid": "uid-vgg16",
            },
            "Warning",
            "PlacementNotHonoured",
            f"Pod w-0 was placed on GPUs {UUIDS[0]},{UUIDS[1]} but its containers hold "
            f"{actual} (reported by the node agent from the kubelet's pod-resources API)",
        )
    ]
    assert len(caplog.records) == 1
    assert "binding=annotations" in caplog.messages[0]


def test_an_agent_restarted_does_not_report_an_annotated_pod_again(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0]]))
    kubelet.pods = [plugin_pod("w-0", [UUIDS[3]])]
    GpuActual(kube, NODE, socket=socket_path).step()
    GpuActual(kube, NODE, socket=socket_path).step()  # a new process: no memory of the first
    assert len(kube.events) == 1
    # The plugin's choice changes (a restarted container got other GPUs): a new report.
    kubelet.pods = [plugin_pod("w-0", [UUIDS[4]])]
    GpuActual(kube, NODE, socket=socket_path).step()
    assert kube.annotation("w-0") == UUIDS[4]
    assert len(kube.events) == 2


def test_a_tenant_written_actual_annotation_never_moves_the_count(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    """The annotation is the pod's: whoever may patch the pod may write it. Rewriting it at
    every turn counts nothing more; writing the true GPUs first hides nothing."""
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0]]))
    kubelet.pods = [plugin_pod("w-0", [UUIDS[3]])]
    check = GpuActual(kube, NODE, socket=socket_path)
    before = counted("annotations")
    for forged in (UUIDS[6], "", UUIDS[7]):
        check.step()
        kube.pods[("team", "w-0")]["metadata"]["annotations"][keys.GPU_ACTUAL] = forged
    check.step()
    assert counted("annotations") - before == 1
    assert kube.annotation("w-0") == UUIDS[3]  # the agent's record comes back

    kube.add(api_pod("w-1", [UUIDS[1]]))
    kube.pods[("team", "w-1")]["metadata"]["annotations"][keys.GPU_ACTUAL] = UUIDS[4]
    kubelet.pods = [plugin_pod("w-0", [UUIDS[3]]), plugin_pod("w-1", [UUIDS[4]])]
    check.step()
    assert counted("annotations") - before == 2


def test_a_match_removes_a_stale_annotation(kubelet: FakeKubelet, socket_path: str) -> None:
    kube = FakeKube()
    pod = api_pod("w-0", [UUIDS[0]])
    pod["metadata"]["annotations"][keys.GPU_ACTUAL] = UUIDS[7]
    kube.add(pod)
    kubelet.pods = [plugin_pod("w-0", [UUIDS[0]])]
    GpuActual(kube, NODE, socket=socket_path).step()
    assert kube.patches == [("team", "w-0", keys.GPU_ACTUAL, None)]
    assert kube.annotation("w-0") is None
    assert kube.events == []


def test_dra_devices_are_named_by_the_slice_and_counted_as_dra(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[4], UUIDS[5]]), claim=True)
    kube.add(api_pod("w-1", [UUIDS[6], UUIDS[7]]), claim=True)
    kube.slices = [
        {
            "spec": {
                "driver": keys.NVIDIA_GPU_DRIVER,
                "pool": {"name": NODE},
                "devices": [
                    {"name": f"gpu-{i}", "attributes": {"uuid": {"string": UUIDS[i]}}}
                    for i in range(8)
                ],
            }
        }
    ]
    kubelet.pods = [dra_pod("w-0", ["gpu-4", "gpu-5"]), dra_pod("w-1", ["gpu-6", "gpu-1"])]
    before = counted("dra")
    checks = GpuActual(kube, NODE, socket=socket_path).step()
    assert {c.pod: c.verdict for c in checks} == {"w-0": Verdict.MATCH, "w-1": Verdict.MISMATCH}
    assert kube.annotation("w-1") == f"{UUIDS[6]},{UUIDS[1]}"
    assert counted("dra") - before == 1


def test_device_plugin_indices_are_named_by_the_topology(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[2], UUIDS[3]]))
    kubelet.pods = [plugin_pod("w-0", ["2", "3"])]
    check = GpuActual(kube, NODE, socket=socket_path)
    check.index_uuids = {str(i): u for i, u in enumerate(UUIDS)}
    assert [c.verdict for c in check.step()] == [Verdict.MATCH]


def test_a_pod_the_kubelet_does_not_know_is_left_alone(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0]]))
    kube.add(api_pod("w-1", [UUIDS[1]]))
    kubelet.pods = [plugin_pod("w-0", [UUIDS[0]])]
    checks = GpuActual(kube, NODE, socket=socket_path).step()
    assert {c.pod: c.verdict for c in checks} == {
        "w-0": Verdict.MATCH,
        "w-1": Verdict.POD_NOT_FOUND,
    }
    assert kube.patches == []
    assert kube.events == []


def test_a_missing_socket_is_one_clear_line_and_no_crash(
    socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0]]))
    kube.add(api_pod("w-1", [UUIDS[1]]))
    check = GpuActual(kube, NODE, socket=socket_path)
    with caplog.at_level(logging.INFO, logger="mpijob.agent"):
        for _ in range(3):
            checks = check.step()
            assert {c.verdict for c in checks} == {Verdict.SOCKET_MISSING}
    assert caplog.messages == [
        f"no pod-resources socket at {socket_path}: cannot check what placed pods' containers "
        f"hold (mount /var/lib/kubelet/pod-resources into the agent) node={NODE}"
    ]
    assert kube.patches == []
    assert kube.events == []
    # The kubelet comes up: one line says so, and the check works.
    caplog.clear()
    with serving(socket_path) as fake, caplog.at_level(logging.INFO, logger="mpijob.agent"):
        fake.pods = [plugin_pod("w-0", [UUIDS[0]]), plugin_pod("w-1", [UUIDS[1]])]
        assert {c.verdict for c in check.step()} == {Verdict.MATCH}
    assert caplog.messages == [f"The kubelet's pod-resources API answers again node={NODE}"]


def test_no_placed_pod_means_no_kubelet_call(kubelet: FakeKubelet, socket_path: str) -> None:
    kube = FakeKube()
    unplaced = {"metadata": {"name": "x", "namespace": "team", "annotations": {}}, "status": {}}
    kube.add(unplaced)
    kube.add(api_pod("w-0", [UUIDS[0]], phase="Succeeded"))
    assert GpuActual(kube, NODE, socket=socket_path).step() == []
    assert kubelet.calls == 0


def test_a_failed_patch_is_retried_at_the_next_turn_before_any_event(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0]]))
    kubelet.pods = [plugin_pod("w-0", [UUIDS[2]])]
    check = GpuActual(kube, NODE, socket=socket_path)
    kube.fail_patch = True
    check.step()
    assert kube.events == []
    kube.fail_patch = False
    check.step()
    assert kube.annotation("w-0") == UUIDS[2]
    assert len(kube.events) == 1


def test_a_pod_without_an_mpijob_owner_is_annotated_without_an_event(
    kubelet: FakeKubelet, socket_path: str
) -> None:
    kube = FakeKube()
    kube.add(api_pod("w-0", [UUIDS[0]]))
    kube.pods[("team", "w-0")]["metadata"]["ownerReferences"] = []
    kubelet.pods = [plugin_pod("w-0", [UUIDS[2]])]
    GpuActual(kube, NODE, socket=socket_path).step()
    assert kube.annotation("w-0") == UUIDS[2]
    assert kube.events == []

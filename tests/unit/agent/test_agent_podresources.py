"""The pod-resources client against a fake kubelet: a real gRPC server on a unix socket.

The server speaks the kubelet's ``v1.PodResourcesLister`` (the generated stubs) and answers
``List`` with canned pods; the agent's client and comparison run unchanged against it.
"""

from __future__ import annotations

import logging
import socket as sockets
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from mpijob.agent import podresources
from mpijob.agent.podresources import Check, ContainerHeld, Verdict
from mpijob.agent.podresources_v1 import api_pb2, api_pb2_grpc

UUIDS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000" for i in range(8)]
NODE = "gpu-node-0"


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.status: grpc.StatusCode | None = None
        self.calls = 0

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.status is not None:
            context.abort(self.status, "pod resources API is disabled")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[FakeKubelet, str]]:
    path = str(tmp_path / "kubelet.sock")
    fake = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    yield fake, path
    server.stop(grace=None)


def plugin_pod(name: str, ids: list[str], namespace: str = "team") -> api_pb2.PodResources:
    devices = api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)
    container = api_pb2.ContainerResources(name="worker", devices=[devices], cpu_ids=[2, 3])
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[container])


def dra_pod(name: str, devices: list[str], namespace: str = "team") -> api_pb2.PodResources:
    resources = [
        api_pb2.ClaimResource(
            driver_name="gpu.nvidia.com",
            pool_name=NODE,
            device_name=device,
            cdi_devices=[api_pb2.CDIDevice(name=f"k8s.gpu.nvidia.com/device={device}")],
        )
        for device in devices
    ]
    dynamic = api_pb2.DynamicResource(
        claim_name=f"{name}-gpus", claim_namespace=namespace, claim_resources=resources
    )
    container = api_pb2.ContainerResources(name="worker", dynamic_resources=[dynamic])
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[container])


def api_pod(name: str, uuids: list[str], phase: str = "Running", namespace: str = "team") -> Any:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {"mpijob.io/gpu-uuids": ",".join(uuids)},
        },
        "status": {"phase": phase},
    }


def verdicts(checks: list[Check]) -> dict[str, Verdict]:
    return {check.pod: check.verdict for check in checks}


def test_a_pod_holding_its_placed_gpus_matches(kubelet: tuple[FakeKubelet, str]) -> None:
    fake, path = kubelet
    fake.pods = [plugin_pod("w-0", [UUIDS[2], UUIDS[3]])]
    checks = podresources.check_node([api_pod("w-0", [UUIDS[3], UUIDS[2]])], socket=path)
    assert checks == [
        Check("team", "w-0", Verdict.MATCH, (UUIDS[3], UUIDS[2]), (UUIDS[2], UUIDS[3]))
    ]
    assert fake.calls == 1


def test_gpus_other_than_placed_are_a_mismatch_logged_plainly(
    kubelet: tuple[FakeKubelet, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, path = kubelet
    fake.pods = [plugin_pod("w-0", [UUIDS[0], UUIDS[5]])]
    with caplog.at_level(logging.WARNING, logger="mpijob.agent"):
        checks = podresources.check_node([api_pod("w-0", [UUIDS[0], UUIDS[1]])], socket=path)
    assert verdicts(checks) == {"w-0": Verdict.MISMATCH}
    assert checks[0].actual == (UUIDS[0], UUIDS[5])
    assert caplog.messages == [
        f"pod team/w-0: placed on GPUs {UUIDS[0]},{UUIDS[1]} but its containers hold "
        f"{UUIDS[0]},{UUIDS[5]}"
    ]


def test_a_pod_the_kubelet_does_not_know_is_not_found(kubelet: tuple[FakeKubelet, str]) -> None:
    fake, path = kubelet
    fake.pods = [plugin_pod("w-0", [UUIDS[0]]), plugin_pod("w-1", [UUIDS[1]], namespace="other")]
    pods = [api_pod("w-0", [UUIDS[0]]), api_pod("w-1", [UUIDS[1]])]
    checks = podresources.check_node(pods, socket=path)
    assert verdicts(checks) == {"w-0": Verdict.MATCH, "w-1": Verdict.POD_NOT_FOUND}


def test_a_missing_socket_is_a_clear_line_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "absent.sock")
    with caplog.at_level(logging.WARNING, logger="mpijob.agent"):
        checks = podresources.check_node([api_pod("w-0", [UUIDS[0]])], socket=path)
    assert verdicts(checks) == {"w-0": Verdict.SOCKET_MISSING}
    assert caplog.messages == [
        f"pod team/w-0: cannot check its GPUs: no pod-resources socket at {path} "
        "(mount /var/lib/kubelet/pod-resources into the agent)"
    ]


def test_a_path_that_is_no_socket_counts_as_missing(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("not a socket")
    with pytest.raises(podresources.SocketMissing):
        podresources.list_pods(str(path))


def test_a_socket_nobody_serves_is_unreadable(tmp_path: Path) -> None:
    path = str(tmp_path / "dead.sock")
    listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    listener.bind(path)
    listener.close()  # the file stays; nothing answers on it
    checks = podresources.check_node([api_pod("w-0", [UUIDS[0]])], socket=path, timeout=2)
    assert verdicts(checks) == {"w-0": Verdict.UNREADABLE}
    assert "UNAVAILABLE" in checks[0].detail


def test_an_error_from_the_kubelet_is_reported(kubelet: tuple[FakeKubelet, str]) -> None:
    fake, path = kubelet
    fake.status = grpc.StatusCode.UNIMPLEMENTED
    checks = podresources.check_node([api_pod("w-0", [UUIDS[0]])], socket=path)
    assert verdicts(checks) == {"w-0": Verdict.UNREADABLE}
    assert checks[0].message == (
        "pod team/w-0: cannot check its GPUs: the kubelet did not answer "
        "(UNIMPLEMENTED: pod resources API is disabled)"
    )


def test_dra_devices_are_read_and_named_by_the_nodes_slice(
    kubelet: tuple[FakeKubelet, str],
) -> None:
    fake, path = kubelet
    fake.pods = [dra_pod("w-0", ["gpu-4", "gpu-5"]), dra_pod("w-1", ["gpu-6", "gpu-1"])]
    held = podresources.list_pods(path)
    assert held[("team", "w-0")][0].claimed == (
        podresources.ClaimDevice("gpu.nvidia.com", NODE, "gpu-4", "team/w-0-gpus"),
        podresources.ClaimDevice("gpu.nvidia.com", NODE, "gpu-5", "team/w-0-gpus"),
    )
    slice_ = {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": NODE},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"uuid": {"string": UUIDS[i]}}} for i in range(8)
            ],
        }
    }
    names = podresources.device_uuids([slice_], NODE)
    pods = [api_pod("w-0", [UUIDS[4], UUIDS[5]]), api_pod("w-1", [UUIDS[6], UUIDS[7]])]
    checks = podresources.check_node(pods, socket=path, device_uuids=names)
    assert verdicts(checks) == {"w-0": Verdict.MATCH, "w-1": Verdict.MISMATCH}
    assert checks[1].actual == (UUIDS[6], UUIDS[1])


def test_finished_and_unplaced_pods_are_not_checked(kubelet: tuple[FakeKubelet, str]) -> None:
    fake, path = kubelet
    fake.pods = [plugin_pod("w-0", [UUIDS[0]])]
    unplaced = {"metadata": {"name": "x", "namespace": "team"}, "status": {"phase": "Running"}}
    pods = [api_pod("w-0", [UUIDS[1]], phase="Succeeded"), unplaced]
    assert podresources.check_node(pods, socket=path) == []


@pytest.mark.parametrize(
    ("ids", "index_uuids", "expected"),
    [
        ([f"{UUIDS[1]}::0", f"{UUIDS[1]}::3"], None, (UUIDS[1],)),
        (["2", "3"], {"2": UUIDS[2], "3": UUIDS[3]}, (UUIDS[2], UUIDS[3])),
        (["7"], {}, ("7",)),
    ],
    ids=["shared-replicas", "index-strategy", "unknown-index-kept"],
)
def test_device_plugin_ids_become_uuids(
    ids: list[str], index_uuids: dict[str, str] | None, expected: tuple[str, ...]
) -> None:
    container = ContainerHeld("worker", {"nvidia.com/gpu": tuple(ids)})
    assert podresources.held_gpus([container], index_uuids=index_uuids) == expected


def test_other_resources_and_drivers_are_not_gpus() -> None:
    container = ContainerHeld(
        "worker",
        {"example.com/nic": ("mlx5_0",)},
        (podresources.ClaimDevice("rdma.example.com", NODE, "mlx-0"),),
    )
    assert podresources.held_gpus([container]) == ()

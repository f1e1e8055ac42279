"""The pod-resources client against a fake kubelet: a real gRPC server on a unix socket.

The server (:mod:`fake_kubelet`) speaks the kubelet's ``v1.PodResourcesLister`` (the generated
stubs) and answers ``List`` with canned pods; the agent's client and comparison run unchanged
against it.
"""

from __future__ import annotations

import logging
import socket as sockets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mpijob.agent import podresources
from mpijob.agent.podresources import Check, ContainerHeld, Verdict
from support.fake_kubelet import NODE, UUIDS, FakeKubelet, api_pod, dra_pod, plugin_pod, serving


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[FakeKubelet, str]]:
    path = str(tmp_path / "kubelet.sock")
    with serving(path) as fake:
        yield fake, path


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

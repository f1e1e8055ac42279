"""The ``--gpu-binding`` detection: what two reads of the API server decide, and the log line."""

from __future__ import annotations

import logging

import pytest

from mpijob.desired.gpu_binding import GpuBinding
from mpijob.handlers.startup import detect_gpu_binding
from mpijob.platform.kube import ApiError
from support.fake_kube import FakeKube


def cluster(*, api: int = 200, device_class: int = 200) -> FakeKube:
    """A cluster whose DRA API answers ``api`` and whose DeviceClass read answers
    ``device_class`` (200: it exists; 404: it does not; else that refusal)."""
    kube = FakeKube()
    if api == 200:
        kube.served["/apis/resource.k8s.io/v1"] = {"kind": "APIResourceList"}
    elif api != 404:
        kube.fail("resources", ApiError(api, "Forbidden", "no"))
    if device_class == 200:
        kube.add(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu.nvidia.com"},
            }
        )
    elif device_class != 404:
        kube.fail("get", ApiError(device_class, "Forbidden", "deviceclasses is forbidden"))
    return kube


def reads(kube: FakeKube) -> list[str]:
    """What was read: discovery paths, and objects as apiVersion/kind/name."""
    return [
        f"/apis/{c.args[0]}" if c.verb == "resources" else f"{c.args[0]}/{c.args[1]}/{c.args[3]}"
        for c in kube.calls
    ]


async def test_a_dra_cluster_gets_dra_and_the_log_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = cluster()
    with caplog.at_level(logging.INFO, logger="mpijob.handlers.startup"):
        choice = await detect_gpu_binding(kube, "auto")
    assert choice.mode is GpuBinding.DRA
    assert reads(kube) == [
        "/apis/resource.k8s.io/v1",
        "resource.k8s.io/v1/DeviceClass/gpu.nvidia.com",
    ]
    assert caplog.records[-1].levelno == logging.INFO
    assert caplog.messages[-1].startswith("GPU binding mode: dra (--gpu-binding=auto: ")


async def test_no_device_class_means_annotations() -> None:
    choice = await detect_gpu_binding(cluster(device_class=404), "auto")
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert not choice.warning


async def test_an_old_server_is_not_asked_for_device_classes() -> None:
    kube = cluster(api=404)
    choice = await detect_gpu_binding(kube, "auto")
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert reads(kube) == ["/apis/resource.k8s.io/v1"]


async def test_a_forbidden_read_is_named_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mpijob.handlers.startup"):
        choice = await detect_gpu_binding(cluster(device_class=403), "auto")
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert "DeviceClass gpu.nvidia.com: 403 deviceclasses is forbidden" in choice.reason
    assert caplog.records[-1].levelno == logging.WARNING


async def test_forcing_dra_on_an_old_server_is_refused() -> None:
    with pytest.raises(ValueError, match="--gpu-binding=dra"):
        await detect_gpu_binding(cluster(api=404), "dra")

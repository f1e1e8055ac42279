"""The ``--gpu-binding`` detection: what two reads of the API server decide, and the log line."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mpijob.desired.gpu_binding import GpuBinding
from mpijob.handlers.startup import detect_gpu_binding
from mpijob.platform.kube import ApiError


class FakeKube:
    """Answers discovery and the DeviceClass read as a cluster with ``answers`` would."""

    def __init__(self, *, api: int = 200, device_class: int = 200) -> None:
        self.api, self.device_class = api, device_class
        self.reads: list[str] = []

    async def resources(self, group_version: str) -> dict[str, Any] | None:
        self.reads.append(f"/apis/{group_version}")
        if self.api == 404:
            return None
        if self.api != 200:
            raise ApiError(self.api, "Forbidden", "no")
        return {"kind": "APIResourceList"}

    async def get(self, api_version: str, kind: str, ns: str | None, name: str) -> Any:
        self.reads.append(f"{api_version}/{kind}/{name}")
        if self.device_class == 404:
            return None
        if self.device_class != 200:
            raise ApiError(self.device_class, "Forbidden", "deviceclasses is forbidden")
        return {"metadata": {"name": name}}


async def test_a_dra_cluster_gets_dra_and_the_log_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    with caplog.at_level(logging.INFO, logger="mpijob.handlers.startup"):
        choice = await detect_gpu_binding(kube, "auto")
    assert choice.mode is GpuBinding.DRA
    assert kube.reads == [
        "/apis/resource.k8s.io/v1",
        "resource.k8s.io/v1/DeviceClass/gpu.nvidia.com",
    ]
    assert caplog.records[-1].levelno == logging.INFO
    assert caplog.messages[-1].startswith("GPU binding mode: dra (--gpu-binding=auto: ")


async def test_no_device_class_means_annotations() -> None:
    choice = await detect_gpu_binding(FakeKube(device_class=404), "auto")
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert not choice.warning


async def test_an_old_server_is_not_asked_for_device_classes() -> None:
    kube = FakeKube(api=404)
    choice = await detect_gpu_binding(kube, "auto")
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert kube.reads == ["/apis/resource.k8s.io/v1"]


async def test_a_forbidden_read_is_named_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mpijob.handlers.startup"):
        choice = await detect_gpu_binding(FakeKube(device_class=403), "auto")
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert "DeviceClass gpu.nvidia.com: 403 deviceclasses is forbidden" in choice.reason
    assert caplog.records[-1].levelno == logging.WARNING


async def test_forcing_dra_on_an_old_server_is_refused() -> None:
    with pytest.raises(ValueError, match="--gpu-binding=dra"):
        await detect_gpu_binding(FakeKube(api=404), "dra")

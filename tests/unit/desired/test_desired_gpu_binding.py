"""The ``--gpu-binding`` decision: which mode from the flag and what the cluster serves."""

from __future__ import annotations

import pytest

from mpijob.desired.gpu_binding import ClusterFacts, GpuBinding, choose

BOTH = ClusterFacts(dra_served=True, gpu_device_class=True)
NO_CLASS = ClusterFacts(dra_served=True, gpu_device_class=False)
NO_API = ClusterFacts(dra_served=False, gpu_device_class=False)


def test_auto_picks_dra_where_the_api_and_the_device_class_exist() -> None:
    choice = choose("auto", BOTH)
    assert choice.mode is GpuBinding.DRA
    assert "resource.k8s.io/v1 is served and DeviceClass gpu.nvidia.com exists" in choice.reason
    assert not choice.warning


@pytest.mark.parametrize(
    ("facts", "missing"),
    [
        (NO_CLASS, "no DeviceClass gpu.nvidia.com"),
        (NO_API, "does not serve resource.k8s.io/v1"),
    ],
)
def test_auto_falls_back_to_annotations_and_says_why(facts: ClusterFacts, missing: str) -> None:
    choice = choose("auto", facts)
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert missing in choice.reason
    assert "the device plugin picks which GPUs" in choice.reason
    assert not choice.warning


def test_auto_warns_when_a_fact_could_not_be_read() -> None:
    facts = ClusterFacts(dra_served=True, gpu_device_class=False, unknown="deviceclasses: 403")
    choice = choose("auto", facts)
    assert choice.mode is GpuBinding.ANNOTATIONS
    assert choice.warning
    assert "(deviceclasses: 403)" in choice.reason


def test_annotations_is_honoured_even_where_dra_works() -> None:
    assert choose("annotations", BOTH).mode is GpuBinding.ANNOTATIONS


def test_forced_dra_without_the_device_class_warns_but_binds() -> None:
    choice = choose("dra", NO_CLASS)
    assert choice.mode is GpuBinding.DRA
    assert choice.warning
    assert "stay Pending until NVIDIA's DRA driver is installed" in choice.reason


def test_forced_dra_on_a_server_without_the_api_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--gpu-binding=dra: the API server does not serve"):
        choose("dra", NO_API)


def test_an_unknown_flag_value_names_the_choices() -> None:
    with pytest.raises(ValueError, match="use one of auto, dra, annotations"):
        choose("device-plugin", BOTH)

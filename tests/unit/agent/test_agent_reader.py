"""The NVML reader rebuilds every shipped topology from a fake NVML, link by link."""

from __future__ import annotations

import json

import pytest

from mpijob.agent import fake_nvml, nvml_reader
from mpijob.agent.fake_nvml import FakeNvml
from mpijob.placement import codec, topologies

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", topologies.NAMES)
def test_reader_rebuilds_every_shipped_topology(name: str) -> None:
    fake = FakeNvml(topologies.load(name), product=name)
    topology = nvml_reader.discover(fake)
    assert topology == fake.topology
    assert not fake.initialised, "NVML is shut down after reading"
    assert topology.uuids_of(range(topology.size)) is not None


def test_nvswitch_pairs_count_their_switch_links() -> None:
    """NVIDIA's allocator finds NVLink in no pair of an NVSwitch box; we find NV18 in all."""
    topology = nvml_reader.discover(FakeNvml(topologies.load("dgx-h100")))
    assert {(link.nvlinks, link.nvswitch) for link in topology.links} == {(18, True)}
    assert topology.nvlink_gen == 4
    assert json.loads(codec.dumps(topology))["links"][0] == "NS18:NODE"


def test_published_json_for_a_known_box() -> None:
    fake = FakeNvml(topologies.for_node("rtx8000-4x", "gpu-box"), product="Quadro RTX 8000")
    uuids = [gpu.uuid for gpu in fake.topology.gpus]
    expected = {
        "v": 1,
        "name": "Quadro RTX 8000",
        "nvlink": 2,
        "pcie": 3,
        "gpus": [
            {"uuid": uuids[0], "bus": "00000000:18:00.0", "numa": 0},
            {"uuid": uuids[1], "bus": "00000000:20:00.0", "numa": 0},
            {"uuid": uuids[2], "bus": "00000000:28:00.0", "numa": 1},
            {"uuid": uuids[3], "bus": "00000000:30:00.0", "numa": 1},
        ],
        "links": ["NODE", "SYS", "NV2:SYS", "NV2:SYS", "SYS", "NODE"],
    }
    assert json.loads(codec.dumps(nvml_reader.discover(fake))) == expected


def test_pcie_only_box_has_no_nvlink_generation() -> None:
    topology = nvml_reader.discover(FakeNvml(topologies.load("pcie-8gpu-2socket")))
    assert topology.nvlink_gen == 0
    assert not any(link.nvlinks for link in topology.links)


@pytest.mark.parametrize(
    "code", [fake_nvml.ERROR_LIBRARY_NOT_FOUND, fake_nvml.ERROR_DRIVER_NOT_LOADED]
)
def test_no_driver_is_no_topology(code: int) -> None:
    fake = FakeNvml(topologies.load("dgx1-v100"), init_error=code)
    with pytest.raises(nvml_reader.NoTopology, match="NVML did not initialise"):
        nvml_reader.discover(fake)


def test_nvml_failing_midway_is_no_topology_and_shuts_down() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetUUID(self, handle: int) -> str:
            raise fake_nvml.FakeNvmlError(999)

    fake = Broken(topologies.load("rtx8000-4x"))
    with pytest.raises(nvml_reader.NoTopology, match="NVML error 999"):
        nvml_reader.discover(fake)
    assert not fake.initialised


def test_unknown_numa_node_is_left_out() -> None:
    class NoNuma(FakeNvml):
        def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
            return -1

    topology = nvml_reader.discover(NoNuma(topologies.load("rtx8000-4x")))
    assert [gpu.numa_node for gpu in topology.gpus] == [None] * 4

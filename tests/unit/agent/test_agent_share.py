"""The node side of GPU shares: what is advertised, in which patch, after which daemons."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from click.testing import CliRunner

from mpijob import keys
from mpijob.agent import fake_nvml, main
from mpijob.agent.fake_nvml import FakeNvml
from mpijob.agent.mps import Defaults, Health, MpsError
from mpijob.agent.share import (
    SharedGpu,
    ShareStep,
    extended_resources,
    read_gpus,
    status_patch,
)
from mpijob.placement import topologies

GIB = 1 << 30


def fake(memory: int = fake_nvml.H100_MEMORY, **kwargs: Any) -> FakeNvml:
    return FakeNvml(topologies.load("dgx1-v100"), memory=memory, **kwargs)


def test_memory_is_rounded_down_to_whole_gib_per_gpu() -> None:
    gpus = read_gpus(fake())
    assert [g.memory_gib for g in gpus] == [79] * 8  # 81,559 MiB is 79.6 GiB
    assert gpus[0].uuid.startswith("GPU-")
    assert [g.memory_gib for g in read_gpus(fake(memory=16 * GIB - 1))] == [15] * 8


def test_the_seed_node_advertises_the_seed_counts() -> None:
    four = [SharedGpu(i, f"GPU-{i}", 15) for i in range(4)]
    assert extended_resources(four) == {
        keys.GPU_COUNT_RESOURCE: 4,
        keys.GPU_MEM_RESOURCE: 60,
        keys.GPU_CORE_PERCENTAGE_RESOURCE: 400,
    }


def test_the_patch_sets_capacity_and_allocatable_with_escaped_names() -> None:
    body = status_patch({keys.GPU_MEM_RESOURCE: 60})
    assert body == [
        {"op": "add", "path": "/status/capacity/aliyun.com~1gpu-mem", "value": "60"},
        {"op": "add", "path": "/status/allocatable/aliyun.com~1gpu-mem", "value": "60"},
    ]


class Daemons:
    def __init__(self, fail: str | None = None) -> None:
        self.started: list[tuple[str, Defaults]] = []
        self.fail = fail

    def __call__(self, uuid: str) -> Any:
        outer = self

        class One:
            def start(self, defaults: Defaults) -> Health:
                if uuid == outer.fail:
                    raise MpsError(f"the MPS daemon of {uuid} did not start")
                outer.started.append((uuid, defaults))
                return Health(uuid, ok=True, percentage=defaults.percentage)

        return One()


def test_daemons_start_for_every_gpu_before_the_patch() -> None:
    nvml = fake()
    order: list[str] = []
    daemons = Daemons()

    def patch(node: str, body: list[dict[str, Any]]) -> None:
        order.append(f"patch:{len(daemons.started)}")
        assert node == "gpu-1"
        assert {
            "op": "add",
            "path": "/status/allocatable/aliyun.com~1gpu-count",
            "value": "8",
        } in body

    assert ShareStep(nvml, node="gpu-1", patch=patch, daemon=daemons)()
    assert order == ["patch:8"]
    assert [u for u, _ in daemons.started] == [g.uuid for g in read_gpus(nvml)]


def test_a_daemon_that_fails_means_no_advertisement(caplog: pytest.LogCaptureFixture) -> None:
    nvml = fake()
    broken = read_gpus(nvml)[3].uuid
    calls: list[Any] = []
    step = ShareStep(nvml, node="n", patch=lambda *a: calls.append(a), daemon=Daemons(fail=broken))
    with caplog.at_level(logging.ERROR):
        assert not step()
    assert calls == []
    assert broken in caplog.text


def test_without_nvml_nothing_is_advertised_and_the_agent_carries_on() -> None:
    calls: list[Any] = []
    nvml = fake(init_error=fake_nvml.ERROR_DRIVER_NOT_LOADED)
    assert ShareStep(nvml, node="n", patch=lambda *a: calls.append(a), daemon=None)()
    assert calls == []


def test_a_failed_patch_fails_the_turn_and_once_exits_one() -> None:
    def refuse(node: str, body: list[dict[str, Any]]) -> None:
        raise RuntimeError("forbidden")

    nvml = fake()
    step = ShareStep(nvml, node="n", patch=refuse, daemon=None)
    assert not step()
    code = main.run(nvml, node="n", annotate=lambda *a: None, once=True, interval=60, steps=[step])
    assert code == 1


def test_cli_dry_run_prints_the_status_patch_and_starts_no_daemon() -> None:
    result = CliRunner().invoke(
        main.main, ["--once", "--dry-run", "--share-gpus", "--simulate", "dgx1-v100"]
    )
    assert result.exit_code == 0, result.output
    body = json.loads(result.output.strip().splitlines()[-1])
    values = {op["path"]: op["value"] for op in body}
    assert values["/status/capacity/aliyun.com~1gpu-mem"] == str(79 * 8)
    assert values["/status/allocatable/aliyun.com~1gpu-core.percentage"] == "800"

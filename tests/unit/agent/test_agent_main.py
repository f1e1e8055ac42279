"""The agent's loop and CLI: publishes on change, never crashes without NVML."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import pynvml
import pytest
from click.testing import CliRunner

from mpijob import keys
from mpijob.agent import fake_nvml, main
from mpijob.agent.fake_nvml import FakeNvml
from mpijob.placement import codec, topologies

pytestmark = pytest.mark.unit


class Stop(Exception):
    pass


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail

    def __call__(self, node: str, key: str, value: str) -> None:
        if self.fail:
            raise RuntimeError("apiserver said no")
        self.calls.append((node, key, value))


def sleeps(rounds: int) -> tuple[list[float], Callable[[float], None]]:
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) >= rounds:
            raise Stop

    return slept, sleep


def test_once_patches_the_node_with_the_annotation() -> None:
    fake = FakeNvml(topologies.for_node("dgx1-v100", "node-3"), product="Tesla V100-SXM2-32GB")
    recorder = Recorder()
    code = main.run(fake, node="node-3", annotate=recorder, once=True, interval=60)
    assert code == 0
    assert recorder.calls == [("node-3", keys.GPU_TOPOLOGY, codec.dumps(fake.topology))]


def test_loop_patches_only_when_the_topology_changes() -> None:
    fake = FakeNvml(topologies.load("dgx1-v100"))
    recorder = Recorder()
    slept, sleep = sleeps(3)
    with pytest.raises(Stop):
        main.run(fake, node="n", annotate=recorder, once=False, interval=30, sleep=sleep)
    assert slept == [30, 30, 30]
    assert len(recorder.calls) == 1


def test_without_nvml_once_exits_zero_with_a_clear_log(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(topologies.load("dgx1-v100"), init_error=fake_nvml.ERROR_LIBRARY_NOT_FOUND)
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="mpijob.agent"):
        code = main.run(fake, node="n", annotate=recorder, once=True, interval=60)
    assert code == 0
    assert recorder.calls == []
    assert "Published no GPU topology: NVML did not initialise" in caplog.text
    assert "NVML Shared Library Not Found" in caplog.text


def test_without_nvml_the_loop_keeps_trying() -> None:
    fake = FakeNvml(topologies.load("dgx1-v100"), init_error=fake_nvml.ERROR_DRIVER_NOT_LOADED)
    recorder = Recorder()
    slept, sleep = sleeps(2)
    with pytest.raises(Stop):
        main.run(fake, node="n", annotate=recorder, once=False, interval=5, sleep=sleep)
    assert slept == [5, 5]
    fake.init_error = None
    main.run(fake, node="n", annotate=recorder, once=True, interval=5)
    assert len(recorder.calls) == 1


def test_failed_patch_exits_one_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(topologies.load("rtx8000-4x"))
    code = main.run(fake, node="n", annotate=Recorder(fail=True), once=True, interval=5)
    assert code == 1
    assert "Failed to patch the GPU topology node=n" in caplog.text


def test_cli_dry_run_prints_the_simulated_annotation() -> None:
    result = CliRunner().invoke(
        main.main, ["--simulate", "dgx1-v100", "--dry-run", "--once"], env={"NODE_NAME": "kw-1"}
    )
    assert result.exit_code == 0, result.output
    expected = FakeNvml(topologies.for_node("dgx1-v100", "kw-1"), product="dgx1-v100").topology
    assert result.output.strip() == codec.dumps(expected)


def test_cli_needs_a_node_name_to_publish() -> None:
    result = CliRunner().invoke(main.main, ["--once"], env={"NODE_NAME": ""})
    assert result.exit_code == 2
    assert "set NODE_NAME" in result.output


def test_cli_on_a_node_without_driver_exits_zero(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The real pynvml, failing as it does without libnvidia-ml."""

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    result = CliRunner().invoke(main.main, ["--dry-run", "--once"])
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert "NVML Shared Library Not Found" in caplog.text


def test_every_turn_of_the_loop_beats_for_the_health_endpoint() -> None:
    """/healthz stays OK only while the loop turns; without NVML it still turns (and beats)."""
    beats: list[int] = []
    _, sleep = sleeps(3)
    with pytest.raises(Stop):
        main.run(
            FakeNvml(topologies.load("dgx1-v100"), init_error=fake_nvml.ERROR_DRIVER_NOT_LOADED),
            node="n",
            annotate=Recorder(),
            once=False,
            interval=30,
            sleep=sleep,
            beat=lambda: beats.append(1),
        )
    assert len(beats) == 3


class CheckRecorder:
    """Stands in for GpuActual: records the turns and the index map it was given."""

    def __init__(self) -> None:
        self.index_uuids: dict[str, str] = {}
        self.steps = 0

    def step(self) -> object:
        self.steps += 1
        return []


def test_each_turn_checks_the_placed_pods_with_the_gpus_uuids() -> None:
    fake = FakeNvml(topologies.for_node("dgx1-v100", "node-3"))
    check = CheckRecorder()
    _, sleep = sleeps(2)
    with pytest.raises(Stop):
        main.run(
            fake,
            node="node-3",
            annotate=Recorder(),
            once=False,
            interval=30,
            sleep=sleep,
            check=check,
        )
    assert check.steps == 2
    assert check.index_uuids == {str(g.index): g.uuid for g in fake.topology.gpus}
    assert len(check.index_uuids) == 8


def test_pods_are_checked_even_without_nvml() -> None:
    fake = FakeNvml(topologies.load("dgx1-v100"), init_error=fake_nvml.ERROR_DRIVER_NOT_LOADED)
    check = CheckRecorder()
    code = main.run(fake, node="n", annotate=Recorder(), once=True, interval=60, check=check)
    assert (code, check.steps, check.index_uuids) == (0, 1, {})


def test_a_turn_runs_the_pod_check_then_the_steps_and_a_failed_step_fails_once() -> None:
    """A core_mem node's share step and the pod check live in one loop: both run every turn."""
    order: list[str] = []

    class OrderedCheck(CheckRecorder):
        def step(self) -> object:
            order.append("check")
            return super().step()

    check = OrderedCheck()

    def step() -> bool:
        order.append("share")
        return False

    fake = FakeNvml(topologies.for_node("dgx1-v100", "node-3"))
    code = main.run(
        fake, node="node-3", annotate=Recorder(), once=True, interval=60, check=check, steps=[step]
    )
    assert (code, order, check.steps) == (1, ["check", "share"], 1)
    assert len(check.index_uuids) == 8


def test_the_loop_ends_with_zero_when_its_sleep_is_cut_short_by_a_stop() -> None:
    fake = FakeNvml(topologies.load("dgx1-v100"))
    recorder = Recorder()
    stop = threading.Event()
    stop.set()
    code = main.run(fake, node="n", annotate=recorder, once=False, interval=30, sleep=stop.wait)
    assert code == 0
    assert len(recorder.calls) == 1


def test_sigterm_stops_the_agent_at_once_with_exit_zero() -> None:
    """As PID 1 in its container the agent has no default SIGTERM action: it must handle it, or
    every rollout and drain waits out the grace period."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from mpijob.agent.main import main; main()", "--simulate",
         "dgx1-v100", "--dry-run", "--interval", "300", "--health-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # the first reading is printed: the loop is sleeping now
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "Stopped on a signal" in out


def test_sigterm_during_start_up_stops_the_agent_after_its_first_turn() -> None:
    """A pod deleted while its agent starts (an upgrade, an uninstall) is sent SIGTERM once,
    then: taken before start-up, it ends the loop at the first sleep, not 30 s later."""
    start = (
        "import os, signal; from mpijob.agent import main as m; real = m._nvml; "
        "m._nvml = lambda *a: (os.kill(os.getpid(), signal.SIGTERM), real(*a))[1]; m.main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", start, "--simulate", "dgx1-v100", "--dry-run", "--interval",
         "300", "--health-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Stopped on a signal" in proc.stderr, proc.stderr


def test_a_stop_signal_that_lands_while_the_loop_is_busy_ends_the_next_sleep_at_once() -> None:
    """The stop is taken by the sleep itself, so a signal between two sleeps is not lost and no
    handler runs code that could wait on a lock the interrupted loop holds."""
    old_fd = signal.set_wakeup_fd(-1)
    old_handler = signal.getsignal(signal.SIGUSR1)
    try:
        sleep = main._StoppableSleep(signal.SIGUSR1)
        assert sleep(0) is False
        signal.raise_signal(signal.SIGUSR1)  # lands while nothing sleeps
        assert sleep(30) is True
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGUSR1, old_handler)

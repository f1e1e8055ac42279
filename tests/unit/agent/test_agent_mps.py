"""The MPS daemon wrapper: start order, defaults in place before returning, health, stop."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from mpijob import keys
from mpijob.agent.mps import Defaults, MpsDaemon, MpsError, Result

UUID = "GPU-4f1c0e2a-0000-1111-2222-333344445555"


class FakeControl:
    """Answers like nvidia-cuda-mps-control: ``-d`` starts it, stdin commands reach it."""

    def __init__(self, *, starts: bool = True, answers_after: int = 0) -> None:
        self.up = False
        self.starts = starts
        self.answers_after = answers_after
        self.percentage = 100.0
        self.memory: str | None = None
        self.commands: list[str] = []
        self.envs: list[dict[str, str]] = []

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], stdin: str | None, timeout: float
    ) -> Result:
        self.envs.append(dict(env))
        if list(argv[1:]) == ["-d"]:
            if self.up:
                return Result(1, "", "An instance of this daemon is already running")
            self.up = self.starts
            return Result(0, "")
        command = (stdin or "").strip()
        self.commands.append(command)
        if not self.up:
            return Result(1, "", "Cannot find MPS control daemon process")
        if self.answers_after > 0:
            self.answers_after -= 1
            return Result(1, "", "starting")
        verb, *args = command.split()
        if verb == "get_server_list":
            return Result(0, "")
        if verb == "set_default_active_thread_percentage":
            self.percentage = float(args[0])
            return Result(0, args[0])
        if verb == "get_default_active_thread_percentage":
            return Result(0, f"{self.percentage:.1f}\n")
        if verb == "set_default_device_pinned_mem_limit":
            self.memory = args[1]
            return Result(0, "")
        if verb == "get_default_device_pinned_mem_limit":
            return Result(0, self.memory or "")
        if verb == "quit":
            self.up = False
            return Result(0, "")
        return Result(1, "", f"unknown command {verb}")


def daemon(tmp_path: Path, control: FakeControl) -> MpsDaemon:
    return MpsDaemon(
        UUID, root=str(tmp_path), run=control, base_env={"PATH": "/usr/bin"}, sleep=lambda _: None
    )


def test_start_makes_the_directories_and_runs_one_daemon_for_its_gpu(tmp_path: Path) -> None:
    control = FakeControl()
    health = daemon(tmp_path, control).start()
    assert health.ok
    assert health.percentage == 100
    for sub in (f"{UUID}/pipe", f"{UUID}/log"):
        assert (tmp_path / sub).is_dir()
    start_env = control.envs[1]
    assert start_env["CUDA_VISIBLE_DEVICES"] == UUID
    assert start_env[keys.ENV_MPS_PIPE_DIRECTORY] == f"{tmp_path}/{UUID}/pipe"
    assert start_env[keys.ENV_MPS_LOG_DIRECTORY] == f"{tmp_path}/{UUID}/log"
    assert start_env["PATH"] == "/usr/bin"


def test_defaults_are_sent_before_start_returns(tmp_path: Path) -> None:
    control = FakeControl()
    health = daemon(tmp_path, control).start(Defaults(percentage=50, memory_mib=40960))
    assert "set_default_active_thread_percentage 50" in control.commands
    assert "set_default_device_pinned_mem_limit 0 40960M" in control.commands
    assert health.percentage == 50
    assert health.memory == "40960M"


def test_start_waits_for_the_daemon_to_answer(tmp_path: Path) -> None:
    control = FakeControl(answers_after=3)
    assert daemon(tmp_path, control).start().ok
    assert control.commands.count("get_server_list") >= 4


def test_a_daemon_that_never_answers_is_an_error_naming_its_log(tmp_path: Path) -> None:
    clock = iter(range(1000))
    control = FakeControl(starts=False)
    mps = MpsDaemon(
        UUID, root=str(tmp_path), run=control, sleep=lambda _: None, clock=lambda: next(clock)
    )
    with pytest.raises(MpsError, match=r"did not answer within .*control\.log"):
        mps.start()


def test_a_running_daemon_is_not_started_twice(tmp_path: Path) -> None:
    control = FakeControl()
    mps = daemon(tmp_path, control)
    mps.start()
    mps.start(Defaults(percentage=40))
    assert control.percentage == 40  # sent again; reaches servers spawned from now on


def test_health_of_a_stopped_daemon_says_so(tmp_path: Path) -> None:
    control = FakeControl()
    mps = daemon(tmp_path, control)
    mps.start()
    mps.stop()
    assert not control.up
    health = mps.health()
    assert not health.ok
    assert "Cannot find MPS control daemon" in health.detail


def test_stop_without_daemon_does_nothing(tmp_path: Path) -> None:
    control = FakeControl()
    daemon(tmp_path, control).stop()
    assert "quit" not in control.commands


def test_a_defaults_mismatch_is_an_error(tmp_path: Path) -> None:
    class Stubborn(FakeControl):
        def __call__(self, argv, env, stdin, timeout):  # type: ignore[no-untyped-def]
            result = super().__call__(argv, env, stdin, timeout)
            self.percentage = 100.0
            return result

    with pytest.raises(MpsError, match="reads back a default of 100%"):
        daemon(tmp_path, Stubborn()).start(Defaults(percentage=30))


def test_the_binary_missing_is_an_error_not_a_crash(tmp_path: Path) -> None:
    mps = MpsDaemon(UUID, root=str(tmp_path), control=str(tmp_path / "absent"))
    assert not mps.running()
    with pytest.raises(MpsError, match="starting the MPS daemon"):
        mps.start()

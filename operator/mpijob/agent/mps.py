"""The CUDA MPS control daemons of a ``core_mem`` node: one per GPU, started, checked, stopped.

Each GPU gets its own ``nvidia-cuda-mps-control -d`` with ``CUDA_VISIBLE_DEVICES=<uuid>`` and its
own pipe and log directory under the host directory pods mount
(:func:`mpijob.shares.pod_edits.mps_directories`). One daemon per GPU keeps the device index
the same on both sides: the daemon's only GPU is its device 0, and so is the one GPU a client
container sees, which is what ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<N>G`` names.

A daemon spawns its MPS server when the first client connects, and ``set_default_*`` only
reaches servers spawned after it. So :meth:`MpsDaemon.start` sends the defaults right after
the daemon starts and reads them back before returning, and the agent advertises the GPU's
extended resources only after that: no pod asking for a share can be admitted to the node
earlier. The defaults are node-wide caps that no client can raise; per-pod limits are the
client environment, which only lowers them (see the README on what that enforces).

Runs the daemon binary through an injectable ``run`` so that tests need no GPU; called by
:mod:`mpijob.agent.main` and by ``bench/gpu/mps_check.py``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from mpijob import keys
from mpijob.shares.pod_edits import CLIENT_DEVICE, MpsDirectories, mps_directories

logger = logging.getLogger("mpijob.agent.mps")

CONTROL: Final = "nvidia-cuda-mps-control"
#: Seconds a daemon gets to answer after ``-d`` (it forks at once; the socket follows).
START_TIMEOUT: Final = 10.0
#: Seconds one control command may take (a stuck daemon must not stall the agent's loop).
COMMAND_TIMEOUT: Final = 5.0


@dataclass(frozen=True)
class Result:
    """What a run of the control binary returned."""

    returncode: int
    stdout: str
    stderr: str = ""


#: Runs ``argv`` with ``env`` (the whole environment) and ``stdin``; raises TimeoutError.
Run = Callable[[Sequence[str], Mapping[str, str], str | None, float], Result]


def run_process(
    argv: Sequence[str], env: Mapping[str, str], stdin: str | None, timeout: float
) -> Result:
    """The real runner: a subprocess."""
    try:
        done = subprocess.run(
            list(argv),
            env=dict(env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        raise TimeoutError(f"{' '.join(argv)} did not answer in {timeout:g}s") from expired
    return Result(done.returncode, done.stdout, done.stderr)


class MpsError(Exception):
    """A daemon did not start, refused a command or answered what was not asked."""


@dataclass(frozen=True)
class Defaults:
    """Daemon-side caps for every client of one GPU (a client's own env only lowers them)."""

    percentage: int = 100
    """``set_default_active_thread_percentage``: 100 leaves compute to the client's env."""
    memory_mib: int | None = None
    """``set_default_device_pinned_mem_limit 0 <N>M``; None sends none (the whole GPU)."""


#: Caps that leave every limit to the client's environment (what the agent sends by default).
NO_CAPS: Final = Defaults()


@dataclass(frozen=True)
class Health:
    """One daemon's state: answering or not, its server PIDs, its defaults as read back."""

    uuid: str
    ok: bool
    servers: tuple[int, ...] = ()
    percentage: int | None = None
    memory: str | None = None
    detail: str = ""


class MpsDaemon:
    """The control daemon of one GPU."""

    def __init__(
        self,
        uuid: str,
        *,
        root: str = keys.MPS_ROOT,
        run: Run = run_process,
        control: str = CONTROL,
        base_env: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.uuid = uuid
        self.dirs: MpsDirectories = mps_directories(uuid, root)
        self._run = run
        self._control = control
        self._base = dict(os.environ if base_env is None else base_env)
        self._sleep = sleep
        self._clock = clock

    @property
    def env(self) -> dict[str, str]:
        """The daemon's environment (and that of every control command sent to it)."""
        return {
            **self._base,
            "CUDA_VISIBLE_DEVICES": self.uuid,
            keys.ENV_MPS_PIPE_DIRECTORY: self.dirs.pipe,
            keys.ENV_MPS_LOG_DIRECTORY: self.dirs.log,
        }

    def command(self, text: str) -> str:
        """Send one control command; its answer, stripped. MpsError if the daemon fails it."""
        try:
            result = self._run([self._control], self.env, text + "\n", COMMAND_TIMEOUT)
        except (TimeoutError, OSError) as error:
            raise MpsError(f"{text!r} to the MPS daemon of {self.uuid}: {error}") from None
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
            raise MpsError(f"{text!r} to the MPS daemon of {self.uuid} failed: {said}")
        return result.stdout.strip()

    def running(self) -> bool:
        """Whether the daemon answers on its pipe directory."""
        try:
            self.command("get_server_list")
        except MpsError:
            return False
        return True

    def start(self, defaults: Defaults = NO_CAPS) -> Health:
        """Start the daemon (if not answering already) and put ``defaults`` in place.

        On a daemon that already runs (an agent restart) the defaults are sent again; they only
        reach servers spawned later, which is why the health says what they read back as.
        """
        for directory in (self.dirs.pipe, self.dirs.log):
            Path(directory).mkdir(parents=True, exist_ok=True)
        if not self.running():
            try:
                result = self._run([self._control, "-d"], self.env, None, COMMAND_TIMEOUT)
            except (TimeoutError, OSError) as error:
                raise MpsError(f"starting the MPS daemon of {self.uuid}: {error}") from None
            if result.returncode != 0:
                said = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
                raise MpsError(f"the MPS daemon of {self.uuid} did not start: {said}")
            deadline = self._clock() + START_TIMEOUT
            while not self.running():
                if self._clock() > deadline:
                    raise MpsError(
                        f"the MPS daemon of {self.uuid} did not answer within"
                        f" {START_TIMEOUT:g}s; see {self.dirs.log}/control.log"
                    )
                self._sleep(0.1)
            logger.info("Started the MPS daemon gpu=%s pipe=%s", self.uuid, self.dirs.pipe)
        self.command(f"set_default_active_thread_percentage {defaults.percentage}")
        if defaults.memory_mib is not None:
            self.command(
                f"set_default_device_pinned_mem_limit {CLIENT_DEVICE} {defaults.memory_mib}M"
            )
        health = self.health()
        if health.percentage != defaults.percentage:
            raise MpsError(
                f"the MPS daemon of {self.uuid} reads back a default of {health.percentage}%"
                f" after being sent {defaults.percentage}%"
            )
        return health

    def health(self) -> Health:
        """Whether the daemon answers, its servers and its defaults (never raises)."""
        try:
            servers = tuple(int(pid) for pid in self.command("get_server_list").split())
            percentage = _number(self.command("get_default_active_thread_percentage"))
        except (MpsError, ValueError) as error:
            return Health(self.uuid, ok=False, detail=str(error))
        try:
            memory = self.command(f"get_default_device_pinned_mem_limit {CLIENT_DEVICE}")
        except MpsError:
            memory = ""  # older daemons have no such query; the percentage proved it answers
        return Health(
            self.uuid,
            ok=True,
            servers=servers,
            percentage=None if percentage is None else round(percentage),
            memory=memory or None,
        )

    def stop(self, timeout: float = START_TIMEOUT) -> None:
        """Ask the daemon to quit (its servers end with it) and wait until it no longer answers."""
        if not self.running():
            return
        self.command("quit")
        deadline = self._clock() + timeout
        while self.running():
            if self._clock() > deadline:
                raise MpsError(f"the MPS daemon of {self.uuid} still answers after quit")
            self._sleep(0.1)
        logger.info("Stopped the MPS daemon gpu=%s", self.uuid)


def _number(text: str) -> float | None:
    """The number a ``get_default_*`` answer holds (``"100.0"``); None when empty."""
    words = text.split()
    return float(words[-1]) if words else None

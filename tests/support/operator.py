"""Our operator as a real process against the test cluster (so SIGKILL means SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from hack.common import free_port
from support.wait import wait_until

#: The count of the admission's timed passes over waiting jobs.
ADMISSION_PASSES = "mpi_operator_admission_pass_seconds_count"
#: The count of syncs (reconciles) of jobs.
SYNCS = "mpi_operator_reconcile_duration_seconds_count"


def two_free_ports() -> tuple[int, int]:
    """Two free ports, never one twice (the operator refuses one port for both)."""
    first = free_port()
    while (second := free_port()) == first:
        pass
    return first, second


class OperatorProcess:
    """``python -m mpijob run`` scoped to one namespace, with its own metrics and health ports
    and log."""

    logged: ClassVar[set[Path]] = set()
    """The log files of this test session's processes."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_dir: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """``env``: variables the process gets beside the test's own (``PYTHONPATH`` is put
        before the test's)."""
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.args = list(args)
        self.env = dict(env or {})
        self.port, self.health_port = two_free_ports()
        """``--monitoring-port`` (/metrics and /readyz) and ``--health-port`` (the liveness
        probe, Kopf's)."""
        self.log_path = log_dir / f"operator-{namespace}.log"
        for n in range(2, 100):  # a second replica in one namespace logs to a file of its own
            if self.log_path not in OperatorProcess.logged:
                break
            self.log_path = log_dir / f"operator-{namespace}-{n}.log"
        OperatorProcess.logged.add(self.log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_from = 0
        """Where the current process's lines begin in the log."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> OperatorProcess:
        self._spawn()
        if not wait:
            return self
        for attempt in range(3):
            try:
                self.wait_healthy()
                return self
            except AssertionError:
                # The ports were free when chosen, and other tests' listeners (xdist workers,
                # clusters' components, real nodes' pods) come and go: another may have taken
                # one since. That is the harness's race, not the operator's: new ports, again.
                if attempt == 2 or not self._port_taken():
                    raise
                self.port, self.health_port = two_free_ports()
                self._spawn()
        return self

    def exit_status(self, timeout: float = 120) -> int:
        """Start it and wait for it to exit, as a replica whose start-up fails must; killed if it
        has not within ``timeout`` (the wait's error then says so)."""
        self._spawn()
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def _port_taken(self) -> bool:
        """Whether this start failed because its monitoring or health port was taken."""
        with self.log_path.open("rb") as log:
            log.seek(self._log_from)
            text = log.read().decode(errors="replace")
        return any(
            f"on port {port}: [Errno 98] Address already in use" in text
            for port in (self.port, self.health_port)
        )

    def _spawn(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "mpijob",
            "run",
            "--namespace",
            self.namespace,
            "--monitoring-port",
            str(self.port),
            "--health-port",
            str(self.health_port),
            "--kube-api-qps",
            "0",
            *self.args,
        ]
        if not any(a.startswith("--leader-elect") or a == "--no-leader-elect" for a in argv):
            argv.append("--no-leader-elect")
        env = {**os.environ, **self.env, "KUBECONFIG": str(self.kubeconfig)}
        if "PYTHONPATH" in self.env and os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.pathsep.join((self.env["PYTHONPATH"], os.environ["PYTHONPATH"]))
        self._log_from = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def healthy(self) -> bool:
        """The liveness probe (Kopf's probe server, up once Kopf runs): the loop beats."""
        return self._probe("/healthz", self.health_port)

    def ready(self) -> bool:
        """``/readyz``: started, its caches filled, campaigning or leading."""
        return self._probe("/readyz")

    def _probe(self, path: str, port: int | None = None) -> bool:
        try:
            url = f"http://127.0.0.1:{port or self.port}{path}"
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 60) -> None:
        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.logs()}")
            return self.healthy()

        wait_until(up, timeout=timeout, what="the operator's /healthz")

    def metric(self, name: str) -> float:
        """Sum of a metric's samples (all label sets) from /metrics."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                head, _, value = line.rpartition(" ")
                if head == name or head.startswith(name + "{"):
                    total += float(value)
        return total

    def wait_admission_passes(self, count: int = 2, timeout: float = 60) -> None:
        """Wait until the admission has run ``count`` more timed passes (passes over waiting
        jobs), each a chance to admit what it must not: a negative check made after them rests
        on what the operator did, not on how long the test slept."""
        target = self.metric(ADMISSION_PASSES) + count
        wait_until(
            lambda: self.metric(ADMISSION_PASSES) >= target, timeout=timeout, what=f"{count} passes"
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

"""mpijob-launch itself, run here: a worker's ``serve`` on a port of 127.0.0.1 and the agent as
mpirun calls it, with a job's keys from mpijob.desired.launch.generate_keys() laid out as the
pods mount them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hack import common, launch_binary
from mpijob.desired import launch
from support.wait import wait_until

pytestmark = pytest.mark.unit

#: Generous: a busy 2-core machine. Nothing here asserts how fast anything is.
TIMEOUT = 60


@pytest.fixture(scope="session")
def binary() -> Path:
    if launch_binary.path().exists():
        return launch_binary.path()
    if not shutil.which("go"):
        pytest.skip("Go is not installed: mpijob-launch cannot be built (hack/launch_binary.py)")
    return launch_binary.ensure()


def write_keys(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / name).chmod(0o400)  # as the Secret's volume holds them
    return folder


def worker_keys(folder: Path, job: dict[str, bytes]) -> Path:
    """A worker's keys folder: its own private key, the launcher's public one."""
    return write_keys(
        folder,
        {
            launch.HOST_KEY_FILE: job[launch.WORKER_KEY],
            launch.AUTHORIZED_KEY_FILE: job[launch.LAUNCHER_PUBLIC_KEY],
        },
    )


def launcher_keys(
    folder: Path, job: dict[str, bytes], workers_of: dict[str, bytes] | None = None
) -> Path:
    """A launcher's keys folder: ``job``'s launcher key, and the workers' public key of
    ``workers_of`` (the same job unless given)."""
    return write_keys(
        folder,
        {
            launch.CLIENT_KEY_FILE: job[launch.LAUNCHER_KEY],
            launch.KNOWN_HOST_KEY_FILE: (workers_of or job)[launch.WORKER_PUBLIC_KEY],
        },
    )


@dataclass
class Server:
    """``mpijob-launch serve`` as a worker runs it, logging to a file."""

    binary: Path
    keys: Path
    port: int
    log: Path
    wrapper: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*self.wrapper, str(self.binary), "serve"],
                env={
                    **os.environ,
                    "MPIJOB_LAUNCH_KEYS": str(self.keys),
                    "MPIJOB_LAUNCH_PORT": str(self.port),
                },
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        proc = self.proc
        wait_until(
            lambda: self.listening() or proc.poll() is not None,
            timeout=TIMEOUT,
            interval=0.05,
            what="the server listening",
        )
        assert proc.poll() is None, self.text()
        return self

    def listening(self) -> bool:
        """Whether the port takes a connection: one that closes at once, as a readiness probe."""
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def started_pids(self) -> list[int]:
        return [int(line.split("started pid ")[1].split(":")[0]) for line in self.lines("started")]

    def lines(self, what: str) -> list[str]:
        return [line for line in self.text().splitlines() if what in line]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        if self.wrapper:  # a PID namespace: its pids are not this one's, and they died with it
            return
        # What a test left running in the server's commands (a killed server leaves them).
        for pid in self.started_pids():
            if common.alive(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)


@dataclass
class Job:
    keys: dict[str, bytes]
    server: Server
    agent_keys: Path
    tmp: Path

    def agent_env(self, keys: Path | None = None, port: int | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "MPIJOB_LAUNCH_KEYS": str(keys or self.agent_keys),
            "MPIJOB_LAUNCH_PORT": str(port or self.server.port),
        }

    def run(
        self,
        *args: str,
        input: bytes = b"",
        keys: Path | None = None,
        port: int | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """The agent, as mpirun calls ssh: ``[options] HOST COMMAND...``."""
        return subprocess.run(
            [str(self.server.binary), *args],
            input=input,
            capture_output=True,
            env=self.agent_env(keys, port),
            timeout=TIMEOUT,
            check=False,
        )

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(self.server.binary), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.agent_env(),
        )


def new_job(binary: Path, tmp: Path, wrapper: list[str] | None = None) -> Job:
    keys = launch.generate_keys()
    server = Server(
        binary, worker_keys(tmp / "worker", keys), common.free_port(), tmp / "server.log"
    )
    server.wrapper = wrapper or []
    return Job(keys, server, launcher_keys(tmp / "launcher", keys), tmp)


@pytest.fixture
def job(binary: Path, tmp_path: Path) -> Iterator[Job]:
    j = new_job(binary, tmp_path)
    j.server.start()
    yield j
    j.server.stop()


def test_stdout_stderr_and_the_exit_status_come_back(job: Job) -> None:
    out = job.run("127.0.0.1", "echo out; echo err >&2; exit 7")
    assert (out.returncode, out.stdout, out.stderr) == (7, b"out\n", b"err\n")
    assert job.run("127.0.0.1", "true").returncode == 0


def test_stdin_is_forwarded_to_its_end(job: Job) -> None:
    data = os.urandom(5 * 2**20)
    out = job.run("127.0.0.1", "cat", input=data)
    assert out.returncode == 0, out.stderr
    assert out.stdout == data
    # A command that reads part of its stdin and exits: the rest is not waited for.
    out = job.run("127.0.0.1", "head -c 10", input=data)
    assert (out.returncode, out.stdout) == (0, data[:10])
    out = job.run("127.0.0.1", "wc -c", input=data)
    assert int(out.stdout) == len(data)


def test_ssh_options_are_skipped_and_the_words_joined(job: Job) -> None:
    out = job.run(
        "-x", "-q", "-o", "ConnectionAttempts=10", "-p", "22", "user@127.0.0.1", "echo", "a", "b"
    )
    assert (out.returncode, out.stdout) == (0, b"a b\n")
    out = job.run("-qx", "-oLogLevel=ERROR", "127.0.0.1", "printf", "%s-", "x", "y")
    assert (out.returncode, out.stdout) == (0, b"x-y-")


def test_no_host_or_an_unknown_option_is_an_error_like_sshs(job: Job) -> None:
    for args in (("-Z", "127.0.0.1", "true"), ("-o",), ()):
        out = job.run(*args)
        assert out.returncode == 255
        assert out.stderr.startswith(b"mpijob-launch: ")


def test_another_jobs_launcher_is_refused_and_runs_nothing(job: Job) -> None:
    other = launch.generate_keys()
    foreign = launcher_keys(job.tmp / "foreign", other, workers_of=job.keys)
    marker = job.tmp / "marker"
    out = job.run("127.0.0.1", f"touch {marker}", keys=foreign)
    assert out.returncode == 255
    assert out.stderr.decode().startswith("mpijob-launch: 127.0.0.1: ")
    assert b"unable to authenticate" in out.stderr
    assert not marker.exists()
    # The server logs the refusal when its side of the handshake ends, which may be just after
    # the client has given up and exited.
    (refused,) = wait_until(
        lambda: job.server.lines("refused"), timeout=TIMEOUT, what="the server's refusal line"
    )
    assert "is not the job's launcher key" in refused
    assert not job.server.lines("started")


def test_a_server_with_another_jobs_host_key_is_refused(job: Job) -> None:
    other = launch.generate_keys()
    wrong_host = launcher_keys(job.tmp / "wrong-host", job.keys, workers_of=other)
    marker = job.tmp / "marker"
    out = job.run("127.0.0.1", f"touch {marker}", keys=wrong_host)
    assert out.returncode == 255
    assert b"host key mismatch" in out.stderr
    assert not marker.exists()
    assert not job.server.lines("started")


class Relay:
    """A TCP relay in front of the server that records what the client sent."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.sent = bytearray()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self.serve_one, daemon=True)
        self.thread.start()

    def serve_one(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(("127.0.0.1", self.target))
        back = threading.Thread(target=self.pump, args=(server, client, None), daemon=True)
        back.start()
        self.pump(client, server, self.sent)
        back.join(TIMEOUT)
        client.close()
        server.close()
        self.listener.close()

    @staticmethod
    def pump(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if record is not None:
                    record += data
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def test_a_replayed_connection_runs_nothing(job: Job) -> None:
    marker = job.tmp / "marker"
    relay = Relay(job.server.port)
    out = job.run("127.0.0.1", f"echo ran >> {marker}", port=relay.port)
    assert out.returncode == 0, out.stderr
    relay.thread.join(TIMEOUT)
    assert marker.read_text() == "ran\n"
    assert len(relay.sent) > 1000  # the whole conversation: handshake, auth, exec
    marker.unlink()

    with socket.create_connection(("127.0.0.1", job.server.port), TIMEOUT) as replay:
        replay_port = replay.getsockname()[1]
        replay.sendall(relay.sent)
        with contextlib.suppress(ConnectionResetError):
            while replay.recv(65536):  # until the server hangs up
                pass
    assert not marker.exists()
    assert len(job.server.lines("started")) == 1  # the real run's
    refused = wait_until(
        lambda: job.server.lines(f"127.0.0.1:{replay_port} refused"),
        timeout=TIMEOUT,
        what="the replay's refusal in the log",
    )
    assert len(refused) == 1


def test_a_killed_server_ends_the_agent_with_255(job: Job) -> None:
    agent = job.popen("127.0.0.1", "echo started; sleep 300")
    assert agent.stdout is not None
    assert agent.stderr is not None
    assert agent.stdout.readline() == b"started\n"
    assert job.server.proc is not None
    job.server.proc.kill()
    assert agent.wait(TIMEOUT) == 255
    assert agent.stderr.read().decode().startswith("mpijob-launch: 127.0.0.1: ")


def test_a_terminated_agent_ends_the_remote_command(job: Job) -> None:
    pidfile = job.tmp / "pid"
    # The command's own child: the whole process group goes, not only the shell.
    agent = job.popen("127.0.0.1", f"sleep 300 & echo $! > {pidfile}; wait")
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), timeout=TIMEOUT))
    assert common.alive(pid)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(TIMEOUT) == 255
    wait_until(lambda: not common.alive(pid), timeout=TIMEOUT, what=f"pid {pid} gone")
    wait_until(lambda: job.server.lines("killed by signal TERM"), timeout=TIMEOUT)
    assert job.server.lines("client gone before pid")


def test_a_terminated_server_ends_its_commands_and_exits_0(job: Job) -> None:
    pidfile = job.tmp / "pid"
    agent = job.popen("127.0.0.1", f"sleep 300 & echo $! > {pidfile}; wait")
    pid = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), timeout=TIMEOUT))
    assert job.server.proc is not None
    job.server.proc.send_signal(signal.SIGTERM)
    assert job.server.proc.wait(TIMEOUT) == 0
    wait_until(lambda: not common.alive(pid), timeout=TIMEOUT, what=f"pid {pid} gone")
    assert agent.wait(TIMEOUT) == 255


def test_the_agent_waits_for_a_worker_that_is_still_starting(binary: Path, tmp_path: Path) -> None:
    job = new_job(binary, tmp_path)
    agent = job.popen("127.0.0.1", "echo reached")
    try:
        time.sleep(2)  # a few attempts refused: nothing listens yet
        assert agent.poll() is None
        job.server.start()
        out, err = agent.communicate(timeout=TIMEOUT)
        assert (agent.returncode, out) == (0, b"reached\n"), err
    finally:
        agent.kill()
        job.server.stop()


def test_an_unreachable_worker_ends_the_agent_after_its_attempts(job: Job) -> None:
    out = job.run("127.0.0.1", "true", port=common.free_port())
    assert out.returncode == 255
    assert b"connection refused" in out.stderr
    assert b"(10 attempts)" in out.stderr


def test_probes_are_not_logged_and_refusals_do_not_flood(job: Job) -> None:
    probes = []
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", job.server.port)) as probe:
            probes.append(probe.getsockname()[1])
    # Garbage from one peer, as fast as it comes: at most a line a second for that peer.
    start = time.monotonic()
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", job.server.port)) as noise:
            noise.sendall(b"GET / HTTP/1.0\r\n\r\n")
            noise.shutdown(socket.SHUT_WR)
            with contextlib.suppress(ConnectionResetError):
                while noise.recv(4096):  # the server logs before it hangs up
                    pass
    elapsed = time.monotonic() - start
    assert job.run("127.0.0.1", "true").returncode == 0  # the server went on
    text = job.server.text()
    assert not any(f"127.0.0.1:{port} " in text for port in probes)
    refused = job.server.lines("refused")
    assert 1 <= len(refused) <= elapsed + 1
    if len(refused) > 1:
        assert "more refused from 127.0.0.1" in refused[-1]


def test_install_copies_a_binary_that_runs(binary: Path, tmp_path: Path) -> None:
    target = tmp_path / "bin"
    target.mkdir()
    out = subprocess.run(
        [str(binary), "install", str(target)], capture_output=True, timeout=TIMEOUT, check=False
    )
    assert out.returncode == 0, out.stderr
    installed = target / "mpijob-launch"
    assert [p.name for p in target.iterdir()] == ["mpijob-launch"]  # no temporary file left
    assert installed.stat().st_mode & 0o777 == 0o755
    assert installed.read_bytes() == binary.read_bytes()
    version = subprocess.run(
        [str(installed), "version"], capture_output=True, timeout=TIMEOUT, check=True
    )
    assert b"golang.org/x/crypto" in version.stdout
    missing = subprocess.run(
        [str(binary), "install", str(tmp_path / "nowhere")], capture_output=True, check=False
    )
    assert missing.returncode == 1
    assert b"nowhere" in missing.stderr


#: The server as a container's first process: PID 1 of a PID namespace of its own.
PID_NAMESPACE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child"]


def test_as_pid_1_it_reaps_orphans_and_keeps_each_commands_status(
    binary: Path, tmp_path: Path
) -> None:
    tried = subprocess.run([*PID_NAMESPACE, "true"], capture_output=True, check=False)
    if tried.returncode != 0:
        pytest.skip(f"no PID namespace here: {tried.stderr.decode().strip()}")
    job = new_job(binary, tmp_path, wrapper=PID_NAMESPACE)
    job.server.start()
    try:
        assert job.run("127.0.0.1", "echo $PPID").stdout == b"1\n"
        # Each command leaves an orphan behind, which the server inherits and must reap while
        # the next commands run, without taking their exit statuses.
        for status in range(20):
            out = job.run("127.0.0.1", f"(sleep 0.2 &); exit {status}")
            assert out.returncode == status, out.stderr
        assert job.server.proc is not None
        unshare = job.server.proc.pid
        (server,) = Path(f"/proc/{unshare}/task/{unshare}/children").read_text().split()
        wait_until(
            lambda: not zombies_of(int(server)), timeout=TIMEOUT, what="no zombie left to PID 1"
        )
    finally:
        job.server.stop()


def zombies_of(parent: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if state == "Z" and int(ppid) == parent:
                out.append(int(stat.parent.name))
    return out

"""Start-up that cannot finish: one line naming what failed and where, status 1, and the Lease
never asked for (no cluster needed: the failures come before or instead of one)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mpijob.desired import sync
from mpijob.handlers import reconcile, startup
from mpijob.handlers.cache import Index
from mpijob.handlers.startup import StartupFailed, step
from mpijob.platform import kopf_tuning
from mpijob.platform.kube import ApiError
from mpijob.settings import OperatorSettings

pytestmark = pytest.mark.unit


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
    )
    return path


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (OSError(98, "Address already in use"), "serving: [Errno 98] Address already in use"),
        (ApiError(422, "Invalid", "bad"), "serving: the API server refused: 422 Invalid: bad"),
        (ValueError("no such fabric"), "serving: no such fabric"),
        (KeyError("x"), "serving: KeyError: 'x'"),
    ],
)
def test_a_step_that_fails_says_what_in_one_line(error: Exception, said: str) -> None:
    with pytest.raises(StartupFailed) as caught, step("serving"):
        raise error
    assert str(caught.value) == said
    assert "\n" not in str(caught.value)


async def test_an_api_server_that_never_answers_fails_the_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(startup, "PREFLIGHT_SECONDS", 0.5)
    ours = OperatorSettings(kubeconfig=str(kubeconfig(tmp_path, f"https://127.0.0.1:{port}")))
    with pytest.raises(StartupFailed) as caught:
        await startup.preflight(ours, "the API server at here")
    assert str(caught.value).startswith("reaching the API server at here: no answer within 0 s:")


def test_the_command_exits_1_with_one_line_when_the_kubeconfig_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    env = {**os.environ, "KUBECONFIG": str(missing)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(
        [sys.executable, "-m", "mpijob", "run", "--namespace", "x", "--leader-elect"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    # One klog line at error level (E<mmdd> <time> ...] "<message>"), naming the file.
    assert lines[0].startswith("E"), lines[0]
    assert (
        f'] "Start-up failed: reading the credentials ({missing}): '
        f"[Errno 2] No such file or directory: '{missing}'\"" in lines[0]
    ), lines[0]


def test_sigterm_while_starting_ends_the_process_at_once(tmp_path: Path) -> None:
    """Before Kopf takes SIGTERM over, the operator's own handler ends start-up: as PID 1 in its
    container it has no default action, and a pod deleted while it starts would wait out its
    grace period. Here start-up waits on an API server that accepts and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    reached = threading.Event()

    def accept() -> None:
        held = []
        while True:
            held.append(server.accept())
            reached.set()

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpijob", "run", "--no-leader-elect", "--monitoring-port", "0",
         "--health-port", "0",
         "--kubeconfig", str(kubeconfig(tmp_path, f"https://127.0.0.1:{port}"))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        assert reached.wait(60), "start-up never reached the API server"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)  # start-up alone would wait 60 s for an answer
    finally:
        proc.kill()
        server.close()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "Stopped by SIGTERM during start-up" in out, out


def test_the_cache_reads_kopfs_indices_as_kopf_makes_them_when_it_starts() -> None:
    """One cache: Kopf's mapping of indices holds the informers' too. Kopf makes its own
    indices anew when it starts (``kopf.operator`` ensures its indexers again): the cache must
    read those, and keep the pod informer's. A copy taken at start-up read empty indices for
    good, and no job was ever synced."""
    registry = startup.registry_for(OperatorSettings())
    indexers, indices, filings = kopf_tuning.indexers_for(registry, [Index.PODS])
    pods = filings[Index.PODS]
    indexers.ensure(registry._indexing.get_all_handlers())  # as kopf.operator() does
    assert indices[Index.PRIORITIES_BY_NAME] is indexers[Index.PRIORITIES_BY_NAME].index
    assert indices[Index.PODS] is pods.index
    assert set(indices) == {Index.PODS, *(h.id for h in registry._indexing.get_all_handlers())}
    assert type(next(iter(filings))) is str  # Kopf formats ids with repr at every call


@pytest.mark.parametrize("threadiness", [1, 2, 8, 32, 64])
def test_the_writing_client_has_a_connection_for_each_creation_of_a_batch(threadiness: int) -> None:
    """aiohttp sends one request at a time per connection: with fewer connections than a
    batch's creations, the batch waits on the API server's latency, not on the rate limit."""
    pod = sync.Create({"kind": "Pod"})
    largest = max(len(batch) for batch in reconcile._batches([pod] * 1024))
    assert startup.write_connections(threadiness) >= largest
    assert startup.write_connections(threadiness) >= threadiness * 2  # two per sync worker

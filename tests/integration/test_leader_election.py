"""One active replica: two operators on one cluster never both write, and a replica that cannot
lead never holds the Lease (a Lease, as upstream's leader election).

Beside the plain take-over (the leader SIGKILLed) and the leader's reconcile workers failing
(it exits at once and releases the Lease), three faults, each while topology jobs wait for GPUs
that other jobs free meanwhile: one replica's start-up fails; the leader is frozen (SIGSTOP)
past its Lease and resumed; the leader is cut off from the API server by a relay that stops
forwarding (its requests hang, as in a partition), then healed. Each asserts from the API
server's audit log that no replica (its own requests and its Kopf's, both naming it) wrote
while it did not hold the Lease and that nothing was written under Kopf's own User-Agent, and
from a sampler that no GPU was ever held by two PlacementDecisions, nor by two live worker pods,
at once.
"""

from __future__ import annotations

import signal
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.relay import Partition
from mpijob import keys
from support import audit
from support.gpu_sampler import GpuSampler
from support.jobs import mpijob
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import stays, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

LEASE_SECONDS = 15
#: The folder of the test-only ``sitecustomize`` that makes the reconcile workers fail.
FAILING_WORKERS = Path(__file__).resolve().parents[1] / "support" / "failing_workers"
#: 6 jobs of 2 workers x 4 GPUs: 48 GPUs asked of the cluster's 32; each launcher succeeds 8 s
#: after it runs and its workers go then (cleanPodPolicy Running), so the last two jobs wait
#: until GPUs free up.
JOBS = 6


def flags(namespace: str) -> tuple[str, ...]:
    return ("--leader-elect", "--lock-namespace", namespace)


def topology_job(index: int) -> dict[str, Any]:
    return mpijob(
        f"topo-{index}",
        workers=2,
        gpus=4,
        annotations={keys.GPU_TOPOLOGY: "true"},
        launcher_annotations={keys.SIM_SUCCEED_AFTER: "8s"},
        run_policy={"cleanPodPolicy": "Running"},
    )


def run_jobs_through(mpijobs: MPIJobs, fault: Any) -> None:
    """Create the jobs, wait until some run and others wait, call ``fault()``, and wait until
    every job Succeeded."""
    for i in range(JOBS):
        mpijobs.create(topology_job(i))
    wait_until(
        lambda: sum(bool(mpijobs.decision(f"topo-{i}")) for i in range(JOBS)) >= 2,
        timeout=60,
        what="the first jobs admitted",
    )
    fault()
    for i in range(JOBS):
        mpijobs.wait_condition(f"topo-{i}", "Succeeded", timeout=240)


def assert_only_holders_wrote(since: datetime, namespace: str, sampler: GpuSampler) -> None:
    time.sleep(1)  # the audit lines of the last responses
    found = audit.events(since)
    outside, checked = audit.writes_outside_terms(found, namespace)
    assert checked > JOBS * 5, f"only {checked} writes by the replicas in the audit log"
    assert outside == [], "writes by a replica that did not hold the Lease:\n" + "\n".join(outside)
    assert audit.writes_by(found, "kopf/") == []  # every request of a replica names it
    assert sampler.samples > 20
    assert (sampler.most_decisions, sampler.most_pods) == (1, 1), sampler.worst


def lease(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return dict(
        cluster.resource("coordination.k8s.io/v1", "Lease")
        .get(name="mpijob-operator", namespace=namespace)
        .to_dict()
    )


def test_only_the_leader_reconciles_and_the_standby_takes_over(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    first = start_operator(*flags(namespace))
    wait_until(
        lambda: first.metric("mpi_operator_is_leader") == 1,
        timeout=30,
        what="the first operator leading",
    )
    second = start_operator(*flags(namespace))
    stays(
        lambda: second.metric("mpi_operator_is_leader") == 0,
        duration=3,
        what="the second operator standing by",
    )

    mpijobs.create(mpijob("one", workers=1))
    mpijobs.wait_condition("one", "Created")
    assert first.metric("mpi_operator_jobs_created_total") == 1
    assert second.metric("mpi_operator_jobs_created_total") == 0
    holder = lease(crds, namespace)["spec"]["holderIdentity"]

    first.kill(signal.SIGKILL)
    # Within one lease duration (15 s) plus a retry period.
    wait_until(
        lambda: second.metric("mpi_operator_is_leader") == 1,
        timeout=45,
        what="the standby taking over",
    )
    mpijobs.create(mpijob("two", workers=1))
    mpijobs.wait_condition("two", "Created", timeout=30)
    assert second.metric("mpi_operator_jobs_created_total") == 1
    assert lease(crds, namespace)["spec"]["holderIdentity"] != holder


def test_a_leader_whose_reconcile_workers_fail_exits_and_the_standby_leads(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    """The leader's reconcile workers' task raises (a bug; injected by
    ``support/failing_workers/sitecustomize.py`` on SIGUSR1): the process exits with status 1
    within 5 s, releasing the Lease, and the standby leads at its next retry and reconciles."""
    first = OperatorProcess(
        crds.kubeconfig,
        namespace,
        ROOT / ".test-logs",
        *flags(namespace),
        env={"PYTHONPATH": str(FAILING_WORKERS), "MPIJOB_TEST_FAIL_WORKERS": "1"},
    )
    try:
        first.start()
        wait_until(lambda: first.metric("mpi_operator_is_leader") == 1, timeout=30, what="a leader")
        second = start_operator(*flags(namespace))
        wait_until(second.ready, timeout=30, what="the standby ready (its caches filled)")
        mpijobs.create(mpijob("one", workers=1))
        mpijobs.wait_condition("one", "Created")  # the workers run, and reconcile
        assert first.metric("mpi_operator_jobs_created_total") == 1
        assert first.ready()
        assert second.metric("mpi_operator_is_leader") == 0
        holder = lease(crds, namespace)["spec"]["holderIdentity"]

        assert first.proc is not None
        raised = time.monotonic()
        first.proc.send_signal(signal.SIGUSR1)
        status = first.proc.wait(timeout=30)
        exited = time.monotonic() - raised
        wait_until(
            lambda: second.metric("mpi_operator_is_leader") == 1,
            timeout=45,
            interval=0.1,
            what="the standby leading",
        )
        leads = time.monotonic() - raised
    finally:
        first.kill()
    print(f"raise -> exit {exited:.2f} s, raise -> the standby leads {leads:.2f} s")
    log = first.logs()
    assert status == 1, log
    assert exited < 5, log
    # The one line on call, with the bug's traceback under it.
    assert (
        "\"reconcile failed: RuntimeError: the reconcile workers failed (the test's injected"
        " bug); exiting (status 1)"
    ) in log, log
    assert "Released the Lease" in log, log
    # Released, not expired: the standby took it at a retry, not a lease duration later.
    assert leads < LEASE_SECONDS - 5
    mpijobs.create(mpijob("two", workers=1))
    mpijobs.wait_condition("two", "Created", timeout=30)
    assert second.metric("mpi_operator_jobs_created_total") == 1
    assert lease(crds, namespace)["spec"]["holderIdentity"] not in (holder, None)


def test_a_replica_whose_start_up_fails_exits_in_one_line_and_never_holds_the_lease(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    since = datetime.now(UTC)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # One replica's monitoring port is in use, another's health port (Kopf's probe server,
        # which Kopf itself would bind only after the manager had started).
        broken = OperatorProcess(crds.kubeconfig, namespace, ROOT / ".test-logs", *flags(namespace))
        broken.port = port
        lame = OperatorProcess(crds.kubeconfig, namespace, ROOT / ".test-logs", *flags(namespace))
        lame.health_port = port
        ended = [
            (broken, broken.exit_status(), "serving /metrics and /readyz"),
            (lame, lame.exit_status(), "serving the liveness probe /healthz"),
        ]
    for replica, status, what in ended:
        log = replica.logs()
        assert status == 1, log
        assert "Traceback" not in log
        failing = [line for line in log.splitlines() if "fail" in line.lower()]
        # One klog line at error level (E<mmdd> <time> ...] "<message>"), naming what and where.
        assert len(failing) == 1, failing
        assert failing[0].startswith("E"), failing
        assert (
            f'] "Start-up failed: {what} on port {port}: [Errno 98] Address already in use"'
        ) in failing[0], failing
    healthy = start_operator(*flags(namespace))
    started = time.monotonic()
    wait_until(
        lambda: healthy.metric("mpi_operator_is_leader") == 1,
        timeout=LEASE_SECONDS,
        what="the healthy replica leading within one lease duration",
    )
    assert time.monotonic() - started < LEASE_SECONDS
    assert lease(crds, namespace)["spec"]["leaseTransitions"] == 0  # no one held it before
    with GpuSampler(crds.api, namespace) as sampler:
        run_jobs_through(mpijobs, lambda: None)
    assert_only_holders_wrote(since, namespace, sampler)


def test_a_leader_frozen_past_its_lease_exits_when_resumed_and_never_writes_again(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs
) -> None:
    since = datetime.now(UTC)
    first = start_operator(*flags(namespace))
    wait_until(lambda: first.metric("mpi_operator_is_leader") == 1, timeout=30, what="a leader")
    second = start_operator(*flags(namespace))
    assert first.proc is not None

    def freeze() -> None:
        first.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        frozen = time.monotonic()
        wait_until(
            lambda: second.metric("mpi_operator_is_leader") == 1,
            timeout=45,
            what="the standby taking over",
        )
        time.sleep(max(0.0, LEASE_SECONDS + 10 - (time.monotonic() - frozen)))
        first.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        assert first.proc.wait(timeout=30) == 1  # type: ignore[union-attr]
        assert "Lost the Lease" in first.logs()

    with GpuSampler(crds.api, namespace) as sampler:
        run_jobs_through(mpijobs, freeze)
    assert_only_holders_wrote(since, namespace, sampler)


def test_a_leader_cut_off_from_the_api_server_stops_writing_and_a_standby_takes_over(
    crds: Cluster, namespace: str, start_operator: Any, mpijobs: MPIJobs, tmp_path: Path
) -> None:
    since = datetime.now(UTC)
    config = yaml.safe_load(crds.kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    relay = Partition((host, int(port)))
    config["clusters"][0]["cluster"]["server"] = f"https://{host}:{relay.start()}"
    behind = tmp_path / "kubeconfig"
    behind.write_text(yaml.safe_dump(config))
    first = start_operator(*flags(namespace), "--kubeconfig", str(behind))
    wait_until(lambda: first.metric("mpi_operator_is_leader") == 1, timeout=30, what="a leader")
    second = start_operator(*flags(namespace))
    assert first.proc is not None

    def partition() -> None:
        relay.cut()
        cut = time.monotonic()
        wait_until(
            lambda: second.metric("mpi_operator_is_leader") == 1,
            timeout=45,
            what="the standby taking over",
        )
        # The cut-off leader gave up at its renew deadline, before the standby could lead.
        assert first.proc.wait(timeout=30) == 1  # type: ignore[union-attr]
        assert "Lost the Lease" in first.logs()
        assert time.monotonic() - cut < 45
        time.sleep(3)
        relay.heal()
        again = start_operator(*flags(namespace), "--kubeconfig", str(behind))  # the restart
        stays(
            lambda: again.metric("mpi_operator_is_leader") == 0,
            duration=3,
            what="the restarted replica standing by",
        )

    with GpuSampler(crds.api, namespace) as sampler:
        run_jobs_through(mpijobs, partition)
    assert_only_holders_wrote(since, namespace, sampler)

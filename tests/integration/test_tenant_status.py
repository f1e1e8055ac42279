"""What a job's life emits moves on what the operator saw of its children, once per job, whatever
its tenant writes into its status; a worker that fails while its job runs is said at once.

The tenant is impersonated with Kubernetes' ``edit`` role and Kubeflow's MPIJob edit role in the
test's namespace: the latter grants ``mpijobs/status``, so it may clear its finished job's
conditions and ``completionTime`` as often as it likes. The operator writes the status back from
the children each time (one write), but counts nothing again and posts no Event again
(upstream counts ``mpi_operator_jobs_created_total`` and ``..._successful_total`` up and posts
``MPIJobCreated`` and ``MPIJobSucceeded`` again on every such rewrite). On kwok's simulated nodes.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from mpijob import keys
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import SYNCS, OperatorProcess
from support.tenants import TenantJobs, bind_tenant
from support.wait import wait_until

pytestmark = pytest.mark.integration

TENANT = "rewriter@example.com"
LIFE_COUNTERS = (
    "mpi_operator_jobs_created_total",
    "mpi_operator_jobs_successful_total",
    "mpi_operator_jobs_failed_total",
    "mpi_operator_job_failures_total",
    "mpi_operator_job_duration_seconds_count",
    "mpi_operator_job_time_to_running_seconds_count",
)
#: The request verbs a sync may send (watches and lists are the informers').
WRITES = ("get", "post", "put", "patch", "delete")


def counters(op: OperatorProcess) -> dict[str, float]:
    return {name: op.metric(name) for name in LIFE_COUNTERS}


def requests(op: OperatorProcess) -> dict[str, float]:
    """The operator's requests to the API server so far, by verb (``mpi_operator_api_requests``)."""
    return {verb: op.metric(f'mpi_operator_api_requests_total{{verb="{verb}"}}') for verb in WRITES}


def event_counts(mpijobs: MPIJobs, name: str) -> dict[str, int]:
    """How often each reason was posted on the job: the Events' counts, summed."""
    out: dict[str, int] = {}
    for e in mpijobs.events(name):
        out[e["reason"]] = out.get(e["reason"], 0) + (e["count"] or 1)
    return out


def settled(op: OperatorProcess, mpijobs: MPIJobs, name: str) -> None:
    """Wait until the operator is done with the job: no sync, request or Event in two seconds
    (Events are sent after the sync that decides them, one at a time)."""
    last: list[object] = [None]

    def unchanged() -> bool:
        now = (op.metric(SYNCS), requests(op), event_counts(mpijobs, name))
        same, last[0] = now == last[0], now
        return same

    wait_until(unchanged, timeout=60, interval=2, what=f"the operator done with {name}")


def restored(mpijobs: MPIJobs, name: str) -> bool:
    status = mpijobs.get(name).get("status") or {}
    ended = {(c["type"], c["status"]) for c in status.get("conditions") or []}
    return (
        bool(status.get("completionTime"))
        and {
            (keys.COND_CREATED, "True"),
            (keys.COND_SUCCEEDED, "True"),
        }
        <= ended
    )


def test_ten_status_rewrites_of_a_finished_job_move_no_counter_and_post_no_event(
    crds: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
) -> None:
    bind_tenant(crds, namespace, TENANT)
    tenant = TenantJobs(crds, namespace, TENANT)
    op = start_operator()
    # Upstream's cleanPodPolicy (None): the finished job's workers stay, and it says so once.
    tenant.create(mpijob("done", workers=1, launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"}))
    mpijobs.wait_condition("done", keys.COND_SUCCEEDED, timeout=90)
    mpijobs.wait_condition("done", keys.COND_WORKERS_LEFT_RUNNING)
    mpijobs.wait_event("done", keys.REASON_WORKERS_LEFT_RUNNING)
    settled(op, mpijobs, "done")
    counted, posted, sent = counters(op), event_counts(mpijobs, "done"), requests(op)
    assert counted["mpi_operator_jobs_created_total"] == 1
    assert counted["mpi_operator_jobs_successful_total"] == 1
    assert posted[keys.REASON_CREATED] == posted[keys.REASON_SUCCEEDED] == 1

    for n in range(10):
        tenant.patch_status("done", {"status": {"conditions": None, "completionTime": None}})
        wait_until(lambda: restored(mpijobs, "done"), timeout=30, what=f"rewrite {n} undone")
    settled(op, mpijobs, "done")
    assert counters(op) == counted
    assert event_counts(mpijobs, "done") == posted
    after = requests(op)
    # Each rewrite cost the one status write that restored it, and nothing else.
    assert {verb: after[verb] - sent[verb] for verb in WRITES} == {
        "get": 0,
        "post": 0,
        "put": 10,
        "patch": 0,
        "delete": 0,
    }
    status = mpijobs.get("done")["status"]
    assert status["completionTime"]
    assert {c["type"]: c["status"] for c in status["conditions"]}[
        keys.COND_WORKERS_LEFT_RUNNING
    ] == "True"

    # A new process counts nothing of what the job did before it, and a rewrite then nothing
    # either (the record of its life is made from the children it finds).
    op.kill(signal.SIGKILL)
    again = start_operator()
    tenant.patch_status("done", {"status": {"conditions": None, "completionTime": None}})
    wait_until(lambda: restored(mpijobs, "done"), timeout=30, what="the rewrite undone")
    settled(again, mpijobs, "done")
    assert set(counters(again).values()) == {0}
    assert event_counts(mpijobs, "done") == posted


def test_a_worker_that_fails_while_its_job_runs_is_named_once_and_counted_once(
    crds: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
) -> None:
    """kwok fails the worker's container (exit code 1, ``Error``) a second after it runs; the
    launcher keeps running. A Warning on the MPIJob names the pod, the container, the reason and
    the exit code within 30 s; the failures metric counts it; a restarted operator does not
    announce it again (a failure older than the process is not news)."""
    op = start_operator()
    mpijobs.create(mpijob("lost", workers=1, worker_annotations={keys.SIM_FAIL_AFTER: "1s"}))
    mpijobs.wait_condition("lost", keys.COND_CREATED)

    def worker_failed() -> bool:
        found = crds.core.list_namespaced_pod(
            namespace, label_selector=f"{keys.LABEL_JOB_ROLE}={keys.ROLE_WORKER}"
        ).items
        return any(p.status.phase == "Failed" for p in found)

    wait_until(worker_failed, timeout=90, what="the worker pod Failed")
    warning = mpijobs.wait_event("lost", keys.REASON_WORKER_FAILED, timeout=30)
    assert warning["type"] == "Warning"
    assert warning["message"] == (
        "worker pod lost-worker-0 container worker Error (exit code 1) while the job runs; "
        "the pod is not restarted"
    )
    settled(op, mpijobs, "lost")
    assert event_counts(mpijobs, "lost")[keys.REASON_WORKER_FAILED] == 1
    assert op.metric('mpi_operator_job_failures_total{reason="Error"}') == 1
    assert mpijobs.condition("lost", keys.COND_FAILED) is None, "the job runs on"

    op.kill(signal.SIGKILL)
    again = start_operator()
    wait_until(lambda: again.metric(SYNCS) >= 1, what="the new process's sync of the job")
    settled(again, mpijobs, "lost")
    assert event_counts(mpijobs, "lost")[keys.REASON_WORKER_FAILED] == 1
    assert again.metric("mpi_operator_job_failures_total") == 0

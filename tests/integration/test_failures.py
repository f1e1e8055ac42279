"""Failures that say why and clean up after themselves, with real containers where it matters.

On the real nodes (real kubelet, containerd, runc, cgroup v1): a worker over its memory limit is
OOM-killed by the kernel and the job's Failed condition, Warning Event and ``mpijob get`` name
the pod, container and ``OOMKilled``; one OOM-killed while its launcher runs on is named at once
in a Warning of its own, and its restarts count that Warning up; a worker evicted through the
Eviction API ends the job as upstream's launcher Job decides, and ``cleanPodPolicy`` cleans up
(Running, All); with WaitForWorkersReady, suspend, an operator restart and resume create the
launcher only after every worker is Ready. On kwok's GPU nodes: a finished job whose workers
cleanPodPolicy None keeps says so (condition, gauge), and ``--default-clean-pod-policy=Running``
frees them.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mpijob import keys
from support.jobs import mpijob
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.realnode import on_real_node, pods, ready_real_node
from support.wait import wait_until

pytestmark = [pytest.mark.integration]

TIMEOUT = 180
SSHD = "/usr/sbin/sshd -De -f /home/mpiuser/.sshd_config"


def pi_job(name: str, **spec: Any) -> dict[str, Any]:
    """Upstream's non-root OpenMPI pi example under ``name``, with ``spec`` merged in."""
    body: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "pi.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["runPolicy"] = {}
    for key, value in spec.items():
        body["spec"][key] = value
    return body


def fails_at_once(body: dict[str, Any], command: list[str]) -> dict[str, Any]:
    """The launcher runs ``command`` once (restartPolicy Never, backoffLimit 0), and only once
    every worker's sshd listens (a readiness probe on its port, WaitForWorkersReady): a launcher
    started earlier would fail on a refused connection, not on what the test does."""
    body["spec"]["runPolicy"]["backoffLimit"] = 0
    body["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
    body["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] = "Never"
    launcher = containers(body, "Launcher")[0]
    launcher["command"], launcher["args"] = command[:1], command[1:]
    containers(body, "Worker")[0]["readinessProbe"] = {
        "tcpSocket": {"port": 2222},
        "periodSeconds": 1,
    }
    return body


def pod_states(cluster: Cluster, namespace: str) -> str:
    """Each pod's phase and containers' states, and the launchers' logs: what a red test shows."""
    out = []
    for p in cluster.core.list_namespaced_pod(namespace).items:
        states = [(c.name, c.state.to_dict()) for c in p.status.container_statuses or []]
        out.append(f"{p.metadata.name} {p.status.phase} {states}")
        if (p.metadata.labels or {}).get(keys.LABEL_JOB_ROLE) == keys.ROLE_LAUNCHER:
            try:
                out.append(cluster.core.read_namespaced_pod_log(p.metadata.name, namespace))
            except client.ApiException as e:
                out.append(f"(no log: {e.reason})")
    return "\n".join(out)


def launcher_logs(cluster: Cluster, namespace: str, job: str) -> str:
    out = []
    for p in pods(cluster, namespace, job, keys.ROLE_LAUNCHER):
        try:
            log = cluster.core.read_namespaced_pod_log(p.metadata.name, namespace)
        except client.ApiException as e:
            log = f"(no log: {e.reason})"
        out.append(f"--- {p.metadata.name} ---\n{log}")
    return "\n".join(out)


def containers(body: dict[str, Any], replica: str) -> list[dict[str, Any]]:
    return body["spec"]["mpiReplicaSpecs"][replica]["template"]["spec"]["containers"]  # type: ignore[no-any-return]


def mpijob_get(cluster: Cluster, namespace: str, name: str) -> str:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mpijob"), "get", name, "-n", namespace,
         "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())


def worker_pods(cluster: Cluster, namespace: str, job: str) -> list[client.V1Pod]:
    return pods(cluster, namespace, job, keys.ROLE_WORKER)


# --- on the real nodes ---------------------------------------------------------------------------


def oom_job() -> dict[str, Any]:
    """pi on the real node, its workers reading /dev/zero into memory past a 64 MiB limit once
    mpirun's ranks have started there (``bench/upstream_failures.py`` sends the same job)."""
    # Open MPI 5.0.7's mpirun was seen to exit 0 after "PRTE has lost communication with a
    # remote daemon" (the job then Succeeded, as upstream's would): the ranks sleep for 120 s,
    # so the launcher fails whenever mpirun returns before that.
    ranks = "mpirun -n 2 sh -c 'touch /tmp/go; exec sleep 120'; exit 1"
    body = fails_at_once(pi_job("oom"), ["sh", "-c", ranks])
    worker = containers(body, "Worker")[0]
    worker["command"] = ["sh", "-c"]
    worker["args"] = [f"{SSHD} & until [ -e /tmp/go ]; do sleep 0.2; done; exec tail /dev/zero"]
    body = on_real_node(body)
    containers(body, "Worker")[0]["resources"]["limits"]["memory"] = "64Mi"
    return body


@pytest.mark.realnode
def test_an_oom_killed_worker_is_named_in_the_condition_the_event_and_mpijob_get(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """Each worker serves SSH; once mpirun's rank has started there, the worker's main process
    reads /dev/zero into memory (``tail`` keeps a line that never ends) past a 64 MiB limit:
    the kernel's OOM killer ends it, the launcher's mpirun loses its ranks and its Job fails
    (backoffLimit 0)."""
    ready_real_node(crds)
    crds.apply(oom_job(), namespace=namespace)

    try:
        failed = mpijobs.wait_condition("oom", keys.COND_FAILED, timeout=TIMEOUT)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_states(crds, namespace)}") from None
    named = re.compile(
        r"first failure: worker pod oom-worker-[01] container mpi-worker OOMKilled "
        r"\(exit code 137\); [12] other pods? failed"
    )
    assert named.search(failed["message"]), (failed, launcher_logs(crds, namespace, "oom"))
    assert failed["reason"].startswith("BackoffLimitExceeded"), failed
    warning = mpijobs.wait_event("oom", failed["reason"])
    assert warning["type"] == "Warning"
    assert named.search(warning["message"]), warning
    shown = mpijob_get(crds, namespace, "oom")
    assert named.search(shown), shown
    assert re.search(r"oom-worker-[01] OOMKilled", shown), shown
    # Each kill counts once: as a worker's failure when a sync saw it while the launcher still
    # ran (a WorkerFailed Warning says so), else as the job's first failure.
    said = [e for e in mpijobs.events("oom") if e["reason"] == keys.REASON_WORKER_FAILED]
    first = re.search(r"first failure: worker pod (oom-worker-[01]) ", failed["message"])
    assert first is not None, failed
    counted = sum(e["count"] or 1 for e in said)
    if not any(e["message"].startswith(f"worker pod {first[1]} ") for e in said):
        counted += 1
    assert operator.metric('mpi_operator_job_failures_total{reason="OOMKilled"}') == counted


def oom_while_running_job() -> dict[str, Any]:
    """pi on the real node, its one worker reading /dev/zero into memory past a 64 MiB limit as
    soon as it starts and restarted each time (restartPolicy OnFailure), its launcher only
    sleeping: nothing ends the job, as an MPI that hangs on a lost rank would not."""
    body = pi_job("oom-running")
    replicas = body["spec"]["mpiReplicaSpecs"]
    replicas["Worker"]["replicas"] = 1
    replicas["Worker"]["restartPolicy"] = "OnFailure"
    launcher = containers(body, "Launcher")[0]
    launcher["command"], launcher["args"] = ["sleep"], ["600"]
    worker = containers(body, "Worker")[0]
    worker["command"], worker["args"] = ["sh", "-c"], ["exec tail /dev/zero"]
    body = on_real_node(body)
    containers(body, "Worker")[0]["resources"]["limits"]["memory"] = "64Mi"
    return body


def oom_killed(cluster: Cluster, namespace: str, job: str) -> bool:
    """Whether a worker of the job shows an OOM kill (its container's run now, or the last)."""
    return any(
        s is not None and s.terminated is not None and s.terminated.reason == "OOMKilled"
        for p in worker_pods(cluster, namespace, job)
        for c in p.status.container_statuses or []
        for s in (c.state, c.last_state)
    )


@pytest.mark.realnode
def test_a_worker_oom_killed_while_its_launcher_runs_is_named_in_a_warning_within_30_s(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """The kernel kills the worker, the launcher runs on: a Warning on the MPIJob names the pod,
    the container, ``OOMKilled`` and the exit code within 30 s of the kill, while nothing else
    says anything (the job stays Created, as before); each restart and kill again counts the
    same Warning up, and the failures metric counts every kill once."""
    ready_real_node(crds)
    crds.apply(oom_while_running_job(), namespace=namespace)
    wait_until(
        lambda: oom_killed(crds, namespace, "oom-running"),
        timeout=TIMEOUT,
        interval=0.5,
        what="the worker OOM-killed",
    )
    warning = mpijobs.wait_event("oom-running", keys.REASON_WORKER_FAILED, timeout=30)
    assert warning["type"] == "Warning"
    assert warning["message"] == (
        "worker pod oom-running-worker-0 container mpi-worker OOMKilled (exit code 137) while "
        "the job runs; the kubelet restarts the container (restartPolicy OnFailure)"
    ), warning
    launchers = pods(crds, namespace, "oom-running", keys.ROLE_LAUNCHER)
    assert any(p.status.phase == "Running" for p in launchers), pod_states(crds, namespace)
    status = mpijobs.get("oom-running").get("status") or {}
    assert not status.get("completionTime"), status

    # Killed again after its restart (CrashLoopBackOff waits 10 s): the same Event, counted up.
    def counted_twice() -> list[dict[str, Any]] | None:
        said = [
            e for e in mpijobs.events("oom-running") if e["reason"] == keys.REASON_WORKER_FAILED
        ]
        return said if sum(e["count"] or 1 for e in said) >= 2 else None

    said = wait_until(counted_twice, timeout=90, what="the second kill counted up")
    assert len(said) == 1, said
    assert operator.metric('mpi_operator_job_failures_total{reason="OOMKilled"}') >= 2


@pytest.mark.realnode
@pytest.mark.parametrize("policy", ["Running", "All"])
def test_a_worker_evicted_through_the_eviction_api_ends_the_job_and_policy_cleans_up(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs, policy: str
) -> None:
    """As upstream: the evicted worker is made again, the launcher's mpirun loses its rank, the
    launcher Job's outcome (backoffLimit 0) is the MPIJob's, with a completion time, and the
    finished job's cleanup deletes what ``cleanPodPolicy`` names."""
    ready_real_node(crds)
    name = f"evict-{policy.lower()}"
    body = pi_job(name, runPolicy={"cleanPodPolicy": policy})
    body = fails_at_once(
        body, ["mpirun", "-n", "2", "sh", "-c", "echo rank up on $(hostname); exec sleep 300"]
    )
    crds.apply(on_real_node(body), namespace=namespace)
    try:
        mpijobs.wait_condition(name, keys.COND_RUNNING, timeout=TIMEOUT)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{launcher_logs(crds, namespace, name)}") from None

    def launcher_running() -> bool:
        found = pods(crds, namespace, name, keys.ROLE_LAUNCHER)
        return any(p.status.phase == "Running" for p in found)

    wait_until(launcher_running, timeout=60, what="the launcher pod Running")

    def ranks_up() -> bool:
        log = launcher_logs(crds, namespace, name)
        return all(f"rank up on {name}-worker-{i}" in log for i in range(2))

    wait_until(ranks_up, timeout=120, what="mpirun's ranks running on both workers")
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=f"{name}-worker-0", namespace=namespace)
    )
    crds.core.create_namespaced_pod_eviction(f"{name}-worker-0", namespace, eviction)

    def finished() -> str | None:
        for c in (mpijobs.get(name).get("status") or {}).get("conditions") or []:
            if c["type"] in (keys.COND_SUCCEEDED, keys.COND_FAILED) and c["status"] == "True":
                return str(c["type"])
        return None

    # Upstream's definition: the launcher Job's outcome is the job's. mpirun decides it: a rank
    # whose worker was stopped fails it, unless Open MPI counts the SIGTERM'd rank as done.
    outcome = wait_until(finished, timeout=TIMEOUT, what=f"MPIJob {name} finished")
    launcher_job = crds.batch.read_namespaced_job(f"{name}-launcher", namespace)
    ended = {c.type for c in launcher_job.status.conditions or [] if c.status == "True"}
    if outcome == keys.COND_FAILED:
        assert "Failed" in ended, ended
        assert mpijobs.condition(name, keys.COND_FAILED)["reason"].startswith(
            "BackoffLimitExceeded"
        )
    else:
        assert "Complete" in ended, ended
    assert mpijobs.get(name)["status"].get("completionTime"), "a finished job"

    def cleaned() -> bool:
        left = [p for p in worker_pods(crds, namespace, name) if not p.metadata.deletion_timestamp]
        if policy == "All":
            return not left
        return not [p for p in left if p.status.phase in ("Running", "Pending")]

    wait_until(cleaned, timeout=60, what=f"cleanPodPolicy {policy}'s cleanup of the workers")
    running = [
        p.metadata.name
        for p in worker_pods(crds, namespace, name)
        if p.status.phase in ("Running", "Pending") and not p.metadata.deletion_timestamp
    ]
    assert running == []


class CreationOrder:
    """Records, from a watch of the job's pods, when each was first seen and first seen Ready."""

    def __init__(self, cluster: Cluster, namespace: str, job: str) -> None:
        self.cluster, self.namespace, self.job = cluster, namespace, job
        self.created: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        selector = f"{keys.LABEL_JOB_NAME}={self.job}"
        while not self.stop.is_set():
            # One time per list: pods seen in the same list were seen together, and the order
            # the list happens to give them in says nothing of which came first.
            now = time.monotonic()
            for p in self.cluster.core.list_namespaced_pod(
                self.namespace, label_selector=selector
            ).items:
                self.created.setdefault(p.metadata.name, now)
                if (
                    any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
                    and not p.metadata.deletion_timestamp
                ):
                    self.ready.setdefault(p.metadata.name, now)
            time.sleep(0.2)

    def __enter__(self) -> CreationOrder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def ready_since(p: client.V1Pod) -> datetime:
    (ready,) = [c for c in p.status.conditions or [] if c.type == "Ready" and c.status == "True"]
    return ready.last_transition_time  # type: ignore[no-any-return]


@pytest.mark.realnode
def test_wait_for_workers_ready_holds_across_suspend_an_operator_restart_and_resume(
    crds: Cluster,
    namespace: str,
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
) -> None:
    ready_real_node(crds)
    operator = start_operator()
    body = pi_job("wait", launcherCreationPolicy="WaitForWorkersReady")
    # pi ends in about 3 s: a launcher that waits first stays Running long enough to be seen
    # Running and suspended, however late a busy machine's sync comes.
    launcher = containers(body, "Launcher")[0]
    launcher["args"] = ["-c", 'sleep 10 && exec mpirun "$@"', "mpirun", *launcher["args"]]
    launcher["command"] = ["sh"]
    crds.apply(on_real_node(body), namespace=namespace)
    mpijobs.wait_condition("wait", keys.COND_RUNNING, timeout=TIMEOUT)

    mpijobs.patch("wait", {"spec": {"runPolicy": {"suspend": True}}})
    mpijobs.wait_condition("wait", keys.COND_SUSPENDED, timeout=60)
    wait_until(
        lambda: (
            not pods(crds, namespace, "wait", keys.ROLE_WORKER)
            and not pods(crds, namespace, "wait", keys.ROLE_LAUNCHER)
        ),
        timeout=120,
        what="the suspended job's pods gone",
    )
    operator.kill()

    with CreationOrder(crds, namespace, "wait") as order:
        mpijobs.patch("wait", {"spec": {"runPolicy": {"suspend": False}}})
        start_operator()
        mpijobs.wait_condition("wait", keys.COND_SUCCEEDED, timeout=TIMEOUT)

    workers = ["wait-worker-0", "wait-worker-1"]
    launchers = [n for n in order.created if n.startswith("wait-launcher")]
    assert launchers, order.created
    assert all(w in order.ready for w in workers), order.ready
    first_launcher = min(order.created[n] for n in launchers)
    assert first_launcher >= max(order.ready[w] for w in workers), (order.created, order.ready)
    # The API's own times say the same (to the second they are written with).
    launcher_pod = min(
        pods(crds, namespace, "wait", keys.ROLE_LAUNCHER),
        key=lambda p: p.metadata.creation_timestamp,
    )
    for w in worker_pods(crds, namespace, "wait"):
        assert launcher_pod.metadata.creation_timestamp >= ready_since(w)


# --- on kwok's GPU nodes ------------------------------------------------------------------------


def gpu_job(name: str, policy: str | None) -> dict[str, Any]:
    run_policy = {} if policy is None else {"cleanPodPolicy": policy}
    return mpijob(
        name,
        workers=2,
        gpus=2,
        launcher_annotations={keys.SIM_SUCCEED_AFTER: "2s"},
        run_policy=run_policy,
    )


def test_workers_left_running_after_success_say_so_and_hold_gpus(
    operator: OperatorProcess, mpijobs: MPIJobs, crds: Cluster, namespace: str
) -> None:
    mpijobs.create(gpu_job("kept", "None"))
    mpijobs.wait_condition("kept", keys.COND_SUCCEEDED, timeout=120)
    left = mpijobs.wait_condition("kept", keys.COND_WORKERS_LEFT_RUNNING, timeout=60)
    assert left["reason"] == keys.REASON_CLEAN_POD_POLICY
    assert "kept-worker-0, kept-worker-1" in left["message"], left
    assert "holding 4 GPU(s)" in left["message"], left
    assert mpijobs.wait_event("kept", keys.REASON_WORKERS_LEFT_RUNNING)["type"] == "Warning"
    wait_until(
        lambda: operator.metric("mpi_operator_finished_jobs_gpus_held") == 4,
        timeout=30,
        what="4 GPUs held by finished jobs",
    )
    assert "WorkersLeftRunning" in mpijob_get(crds, namespace, "kept")

    for p in worker_pods(crds, namespace, "kept"):
        crds.core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)
    mpijobs.wait_condition("kept", keys.COND_WORKERS_LEFT_RUNNING, "False", timeout=60)
    wait_until(
        lambda: operator.metric("mpi_operator_finished_jobs_gpus_held") == 0,
        timeout=30,
        what="no GPUs held by finished jobs",
    )


def test_the_admins_default_clean_pod_policy_frees_the_gpus_of_jobs_that_set_none(
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
    crds: Cluster,
    namespace: str,
) -> None:
    operator = start_operator("--default-clean-pod-policy", "Running")
    mpijobs.create(gpu_job("freed", None))
    own = copy.deepcopy(gpu_job("own", "None"))
    mpijobs.create(own)
    mpijobs.wait_condition("freed", keys.COND_SUCCEEDED, timeout=120)
    mpijobs.wait_condition("own", keys.COND_SUCCEEDED, timeout=120)
    wait_until(
        lambda: not worker_pods(crds, namespace, "freed"),
        timeout=60,
        what="the workers of the job that set no cleanPodPolicy deleted",
    )
    assert mpijobs.condition("freed", keys.COND_WORKERS_LEFT_RUNNING) is None
    # A job's own cleanPodPolicy wins over the admin's default.
    mpijobs.wait_condition("own", keys.COND_WORKERS_LEFT_RUNNING, timeout=60)
    wait_until(
        lambda: operator.metric("mpi_operator_finished_jobs_gpus_held") == 4,
        timeout=30,
        what="only the GPUs of the job that kept its workers counted",
    )

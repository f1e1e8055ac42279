"""The failure scenarios of tests/integration/test_failures.py, run on upstream's mpi-operator.

Run as ``PYTHONPATH=tests:. .venv/bin/python -m bench.upstream_failures SCENARIO`` against the
running local cluster (``make cluster crds``; its real nodes for every scenario but ``kept``).
It builds the same MPIJob bodies as the tests (their own helpers), starts upstream's v0.8.2
binary scoped to a fresh namespace (``--namespace``/``--lock-namespace``, admin kubeconfig),
and prints what upstream does: the MPIJob's conditions, its Events, the pods with their
containers' states, the launcher Job and upstream's ``mpi_operator_*`` metrics. Scenarios:

- ``oom``: a worker over its 64 MiB limit is OOM-killed by the kernel;
- ``evict-running`` / ``evict-all``: a worker evicted through the Eviction API while mpirun's
  ranks run, cleanPodPolicy Running / All;
- ``kept``: cleanPodPolicy None after Succeeded on kwok's GPU nodes (2 workers x 2 GPUs);
  ``kept-default``: the same job with no cleanPodPolicy;
- ``wait``: WaitForWorkersReady, suspend, operator stopped, resume, operator started: when the
  launcher Job and pods were created and unsuspended against when each worker became Ready;
  ``wait-no-restart``: the same with the operator running throughout.

Upstream sets only Open MPI 4's hostfile variables, so with the image's Open MPI 5 every rank
runs on the launcher and the OOM and eviction jobs never use their workers; ``--prte-hostfile``
adds ``PRTE_MCA_prte_default_hostfile`` to the launcher (what upstream's users add) so that they
do. Each run writes its printout and the operator's log under ``.bench/upstream-failures/``. It
never starts our operator; the namespace is deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, config

from hack import cluster, realnode
from hack.common import ROOT
from integration.test_failures import containers, fails_at_once, gpu_job, oom_job, pi_job
from mpijob import keys

OUT = ROOT / ".bench" / "upstream-failures"
UPSTREAM_HEALTH_PORT = 8080  # fixed in upstream's binary, on every interface
TIMEOUT = 240.0
# Upstream sets only Open MPI 4's OMPI_MCA_orte_* names; Open MPI 5's mpirun (PRRTE) reads none
# of them and runs every rank on the launcher. Users of upstream add this to reach the workers.
PRTE_HOSTFILE = {"name": "PRTE_MCA_prte_default_hostfile", "value": "/etc/mpi/hostfile"}
GROUP, VERSION, PLURAL = "kubeflow.org", "v2beta1", "mpijobs"


def upstream_binary() -> str:
    """Upstream's binary from the cache (``hack/build-bins.sh mpi-operator`` builds it); not
    bench.reconcile's helper, whose import points hack.cluster at the benchmark's cluster."""
    version = cluster.versions()["MPI_OPERATOR_VERSION"]
    path = cluster.cache_dir() / "bin" / f"mpi-operator-v{version}" / "mpi-operator"
    if not path.exists():
        raise SystemExit(f"{path} is missing; build it with hack/build-bins.sh mpi-operator")
    return str(path)


class Run:
    """One scenario's namespace, API clients, upstream operator and printout."""

    def __init__(self, scenario: str, prte_hostfile: bool = False) -> None:
        self.scenario = scenario
        self.prte_hostfile = prte_hostfile
        self.namespace = f"up-{scenario}-{int(time.time()) % 100000}"
        self.kubeconfig = cluster.state_dir() / "kubeconfig"
        api = config.new_client_from_config(str(self.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        OUT.mkdir(parents=True, exist_ok=True)
        self.report = (OUT / f"{self.namespace}.txt").open("w")

    def say(self, text: str) -> None:
        stamped = f"[{time.strftime('%H:%M:%S', time.gmtime())}] {text}"
        print(stamped, flush=True)
        self.report.write(stamped + "\n")
        self.report.flush()

    # --- upstream's operator ---

    def start_operator(self) -> None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", UPSTREAM_HEALTH_PORT)) == 0:
                raise SystemExit(f"port {UPSTREAM_HEALTH_PORT} is taken; upstream needs it")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        argv = [upstream_binary(), "--kubeConfig", str(self.kubeconfig),
                "--namespace", self.namespace, "--lock-namespace", self.namespace,
                "--monitoring-port", str(self.port)]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        log = (OUT / f"{self.namespace}-operator.log").open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.wait(lambda: self.metric("mpi_operator_is_leader") == 1, 60, "upstream leading")
        self.say(f"upstream mpi-operator v0.8.2 leading (pid {self.proc.pid})")

    def stop_operator(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def metrics(self) -> list[str]:
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return []
        return [line for line in text.splitlines() if line.startswith("mpi_operator_")]

    def metric(self, name: str) -> float | None:
        for line in self.metrics():
            key, _, value = line.rpartition(" ")
            if key == name:
                return float(value)
        return None

    # --- objects ---

    def apply(self, body: dict[str, Any]) -> None:
        if self.prte_hostfile:
            for c in containers(body, "Launcher"):
                c.setdefault("env", []).append(PRTE_HOSTFILE)
        self.say("MPIJob applied:\n" + json.dumps(body["spec"], indent=1))
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def job(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(  # type: ignore[no-any-return]
            GROUP, VERSION, self.namespace, PLURAL, name
        )

    def patch(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, patch
        )

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        for c in (self.job(name).get("status") or {}).get("conditions") or []:
            if c["type"] == kind and c["status"] == "True":
                return c  # type: ignore[no-any-return]
        return None

    def pods(self, job: str, role: str | None = None) -> list[client.V1Pod]:
        selector = f"{keys.LABEL_JOB_NAME}={job}"
        if role:
            selector += f",{keys.LABEL_JOB_ROLE}={role}"
        found = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return list(found)

    def wait(self, done: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(client.ApiException):
                if result := done():
                    return result
            time.sleep(0.5)
        self.say(f"TIMED OUT after {timeout:.0f} s waiting for {what}")
        return None

    def finished(self, name: str) -> str | None:
        for kind in (keys.COND_SUCCEEDED, keys.COND_FAILED):
            if self.condition(name, kind):
                return kind
        return None

    def show(self, name: str) -> None:
        """Everything upstream wrote about job ``name``, and its pods as the kubelet left them."""
        status = self.job(name).get("status") or {}
        self.say("MPIJob status:\n" + json.dumps(status, indent=1, default=str))
        events = self.core.list_namespaced_event(self.namespace).items
        lines = [
            f"  {e.type} {e.reason} {e.involved_object.kind}/{e.involved_object.name} "
            f"x{e.count or 1} [{e.source.component if e.source else ''}]: {e.message}"
            for e in sorted(events, key=lambda e: str(e.last_timestamp or e.event_time))
            if e.involved_object.kind in ("MPIJob", "Job")
            or (e.involved_object.name or "").startswith(name)
        ]
        self.say("Events (MPIJob, Job, and the job's pods):\n" + "\n".join(lines))
        kubectl = cluster.kubectl(cluster.State.load(), "get", "pods", "-o", "wide", "-n",
                                  self.namespace)  # fmt: skip
        self.say(f"kubectl get pods -o wide:\n{kubectl}")
        for p in self.pods(name):
            states = [
                (c.name, c.state.to_dict(), c.last_state.to_dict())
                for c in p.status.container_statuses or []
            ]
            self.say(
                f"pod {p.metadata.name}: phase {p.status.phase} reason {p.status.reason} "
                f"deleting {bool(p.metadata.deletion_timestamp)} "
                f"created {p.metadata.creation_timestamp}; containers (state, last) {states}"
            )
        try:
            launcher = self.batch.read_namespaced_job(f"{name}-launcher", self.namespace)
            self.say(
                f"launcher Job: suspend {launcher.spec.suspend} conditions "
                + str([(c.type, c.status, c.reason) for c in launcher.status.conditions or []])
            )
        except client.ApiException as e:
            self.say(f"launcher Job: {e.reason}")
        for p in self.pods(name, keys.ROLE_LAUNCHER):
            env = [f"{e.name}={e.value}" for c in p.spec.containers for e in c.env or []]
            self.say(f"env of {p.metadata.name}: {env}")
            with contextlib.suppress(client.ApiException):
                log = self.core.read_namespaced_pod_log(p.metadata.name, self.namespace)
                self.say(f"log of {p.metadata.name} (last 1500 chars):\n{log[-1500:]}")
        self.say("upstream metrics:\n" + "\n".join(self.metrics()))

    @contextlib.contextmanager
    def session(self) -> Iterator[Run]:
        self.core.create_namespace(client.V1Namespace(metadata={"name": self.namespace}))
        try:
            self.start_operator()
            yield self
        finally:
            self.stop_operator()
            self.core.delete_namespace(self.namespace)
            self.report.close()


def real(body: dict[str, Any]) -> dict[str, Any]:
    return realnode.place_on_real_node(body)


# --- scenarios: the bodies are test_failures.py's ------------------------------------------------


def oom(run: Run) -> None:
    run.apply(oom_job())
    outcome = run.wait(lambda: run.finished("oom"), TIMEOUT, "MPIJob oom finished")
    run.say(f"outcome: {outcome}")
    time.sleep(5)  # Events and the last pod updates
    run.show("oom")


def evict(run: Run, policy: str) -> None:
    name = f"evict-{policy.lower()}"
    body = pi_job(name, runPolicy={"cleanPodPolicy": policy})
    body = fails_at_once(
        body, ["mpirun", "-n", "2", "sh", "-c", "echo rank up on $(hostname); exec sleep 300"]
    )
    run.apply(real(body))

    def ranks_up() -> bool:
        logs = ""
        for p in run.pods(name, keys.ROLE_LAUNCHER):
            with contextlib.suppress(client.ApiException):
                logs += run.core.read_namespaced_pod_log(p.metadata.name, run.namespace)
        return logs.count("rank up on") >= 2 and logs

    logs = run.wait(ranks_up, TIMEOUT, "mpirun's two ranks up")
    if not logs:
        run.show(name)
        return
    run.say(f"launcher log once both ranks are up:\n{logs}")
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=f"{name}-worker-0"))
    run.core.create_namespaced_pod_eviction(f"{name}-worker-0", run.namespace, eviction)
    run.say(f"evicted {name}-worker-0 through the Eviction API")
    outcome = run.wait(lambda: run.finished(name), 120, f"MPIJob {name} finished")
    run.say(f"outcome: {outcome}")
    time.sleep(20)  # upstream's cleanup, if any, and pod terminations
    run.show(name)


def kept(run: Run, name: str = "kept", policy: str | None = "None") -> None:
    run.apply(gpu_job(name, policy))
    outcome = run.wait(lambda: run.finished(name), 120, f"MPIJob {name} finished")
    run.say(f"outcome: {outcome}")
    time.sleep(30)  # anything upstream would say later about the workers left running
    run.show(name)


class ResumeOrder:
    """A 0.2 s poll of the job's pods and launcher Job: when each pod was first seen and first
    seen Ready, when the launcher Job was first seen unsuspended, and each launcher's first
    failed run (seconds after ``since``)."""

    def __init__(self, run: Run, job: str, since: float) -> None:
        self.run, self.job, self.since = run, job, since
        self.seen: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.restarts: dict[str, str] = {}
        self.unsuspended: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(client.ApiException):
                for p in self.run.pods(self.job):
                    self._record(p, time.time() - self.since)
                job = self.run.batch.read_namespaced_job(f"{self.job}-launcher", self.run.namespace)
                if not job.spec.suspend and self.unsuspended is None:
                    self.unsuspended = time.time() - self.since
            time.sleep(0.2)

    def _record(self, p: client.V1Pod, now: float) -> None:
        name = p.metadata.name
        self.seen.setdefault(name, now)
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []):
            self.ready.setdefault(name, now)
        for c in p.status.container_statuses or []:
            ended = c.last_state.terminated if c.last_state else None
            if c.restart_count and ended and name not in self.restarts:
                self.restarts[name] = (
                    f"restarted, seen at {now:.2f}; its first run ended {ended.reason} exit "
                    f"{ended.exit_code} at {ended.finished_at}"
                )

    def report(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.run.say("seen by a 0.2 s poll, seconds after the resume patch:")
        for pod, t in sorted(self.seen.items(), key=lambda kv: kv[1]):
            r = self.ready.get(pod)
            shown = f"{r:.2f}" if r is not None else "never seen Ready"
            self.run.say(f"  {pod}: first seen {t:.2f}, Ready {shown}")
        if self.unsuspended is not None:
            self.run.say(f"  launcher Job seen unsuspended at {self.unsuspended:.2f}")
        for pod, text in self.restarts.items():
            self.run.say(f"  {pod} {text}")
        for p in self.run.pods(self.job):
            ready = [c.last_transition_time for c in p.status.conditions or [] if c.type == "Ready"]
            self.run.say(
                f"  API: {p.metadata.name} created {p.metadata.creation_timestamp}, "
                f"Ready transition {ready}"
            )


def wait_for_workers_ready(run: Run, restart: bool = True) -> None:
    body = pi_job("wait", launcherCreationPolicy="WaitForWorkersReady")
    run.apply(real(body))
    run.wait(lambda: run.condition("wait", keys.COND_RUNNING), TIMEOUT, "Running")
    run.say("Running; suspending")
    run.patch("wait", {"spec": {"runPolicy": {"suspend": True}}})
    run.wait(lambda: run.condition("wait", keys.COND_SUSPENDED), 60, "Suspended")
    run.wait(lambda: not run.pods("wait"), 120, "the suspended job's pods gone")
    launcher = run.batch.read_namespaced_job("wait-launcher", run.namespace)
    run.say(
        f"suspended, pods gone; launcher Job exists: created {launcher.metadata.creation_timestamp}"
        f" suspend={launcher.spec.suspend}"
    )
    if restart:
        run.stop_operator(kill=True)
        run.say("upstream operator SIGKILLed")
    order = ResumeOrder(run, "wait", time.time())
    run.patch("wait", {"spec": {"runPolicy": {"suspend": False}}})
    run.say("resumed (suspend: false)")
    if restart:
        run.start_operator()
    outcome = run.wait(lambda: run.finished("wait"), TIMEOUT, "MPIJob wait finished")
    run.say(f"outcome: {outcome}")
    order.report()
    run.show("wait")


SCENARIOS: dict[str, Callable[[Run], None]] = {
    "oom": oom,
    "evict-running": lambda run: evict(run, "Running"),
    "evict-all": lambda run: evict(run, "All"),
    "kept": kept,
    "kept-default": lambda run: kept(run, "freed", None),
    "wait": wait_for_workers_ready,
    "wait-no-restart": lambda run: wait_for_workers_ready(run, restart=False),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument(
        "--prte-hostfile",
        action="store_true",
        help="add PRTE_MCA_prte_default_hostfile to the launcher, so that Open MPI 5's ranks "
        "run on the workers under upstream",
    )
    args = parser.parse_args(argv)
    run = Run(args.scenario, args.prte_hostfile)
    with run.session():
        SCENARIOS[args.scenario](run)
    print(f"printout: {OUT / (run.namespace + '.txt')}", file=sys.stderr)


if __name__ == "__main__":
    main()

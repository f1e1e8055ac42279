"""The real node for tests: find it (or say why there is none), send jobs there, read their logs.

A real node (hack/realnode.py) carries the label and NoSchedule taint ``mpijob.io/real-node``;
a job meant to run real processes selects and tolerates it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from kubernetes import client

from mpijob import keys
from support.kube import ROOT, Cluster
from support.wait import wait_until

ROLE = "mpijob.io/real-node"


def ready_real_node(cluster: Cluster) -> str:
    """The name of a Ready real node; fails with the reason the local cluster recorded."""
    error = ROOT / ".cluster" / "realnode" / "error.txt"

    def ready() -> str | None:
        for node in cluster.core.list_node(label_selector=f"{ROLE}=true").items:
            for c in node.status.conditions or []:
                if c.type == "Ready" and c.status == "True":
                    return str(node.metadata.name)
        if cluster.local and error.exists():
            raise AssertionError(f"the real node did not start:\n{error.read_text()}")
        return None

    return wait_until(
        ready,
        timeout=60,
        what=f"a Ready node labelled {ROLE}=true (hack/cluster.py up starts one unless "
        "REAL_NODES=0)",
    )


def on_real_node(body: dict[str, Any]) -> dict[str, Any]:
    """The job sent to the real node (hack/realnode.py's placement, as ``make demo`` uses)."""
    from hack import realnode

    return realnode.place_on_real_node(body)


def with_image(body: dict[str, Any], image: str, name: str) -> dict[str, Any]:
    """``body`` under another name, every container on ``image``, and the launcher printing its
    MPI's version before it runs its command (so the log proves which MPI ran). The command
    goes in ``args``, so the image's entrypoint still runs first: for MPICH and Intel MPI it
    waits until every host's name resolves, which their process managers do not."""
    body["metadata"]["name"] = name
    for spec in body["spec"]["mpiReplicaSpecs"].values():
        for c in spec["template"]["spec"]["containers"]:
            c["image"] = image
    launcher = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    argv = [*(launcher.pop("command", None) or []), *(launcher.pop("args", None) or [])]
    launcher["args"] = ["sh", "-c", 'mpirun --version && exec "$@"', "sh", *argv]
    return body


def pods(cluster: Cluster, namespace: str, job: str, role: str) -> list[client.V1Pod]:
    selector = f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}={role}"
    return list(cluster.core.list_namespaced_pod(namespace, label_selector=selector).items)


def launcher_log(cluster: Cluster, namespace: str, job: str) -> str:
    """The log of the job's newest launcher pod (its last run)."""
    found = pods(cluster, namespace, job, keys.ROLE_LAUNCHER)
    assert found, f"MPIJob {job} has no launcher pod"
    newest = max(found, key=lambda p: p.metadata.creation_timestamp)
    return str(cluster.core.read_namespaced_pod_log(newest.metadata.name, namespace))


def run_to_success(
    cluster: Cluster, mpijobs: Any, namespace: str, body: dict[str, Any], timeout: float
) -> str:
    """Apply the MPIJob, wait for it to succeed with every launcher run exiting 0, and return
    its launcher's log."""
    cluster.apply(body, namespace=namespace)
    name = body["metadata"]["name"]
    try:
        mpijobs.wait_condition(name, keys.COND_SUCCEEDED, timeout=timeout)
    except Exception as e:
        raise AssertionError(f"{e}\n{job_state(cluster, namespace, name)}") from e
    launchers = pods(cluster, namespace, name, keys.ROLE_LAUNCHER)
    assert launchers, "the launcher pod is gone"
    assert all(0 in exit_codes(p) for p in launchers), [exit_codes(p) for p in launchers]
    return launcher_log(cluster, namespace, name)


def job_state(cluster: Cluster, namespace: str, job: str) -> str:
    """What a job that did not finish left to read: its pods' phases and containers' states,
    and its launcher's log, for the failure's message."""
    lines = []
    for role in (keys.ROLE_LAUNCHER, keys.ROLE_WORKER):
        for pod in pods(cluster, namespace, job, role):
            statuses = [*(pod.status.init_container_statuses or []),
                        *(pod.status.container_statuses or [])]  # fmt: skip
            states = ", ".join(f"{c.name}: {c.state}".replace("\n", " ") for c in statuses)
            lines.append(
                f"{pod.metadata.name} {pod.status.phase} on {pod.spec.node_name}: {states}"
            )
    try:
        lines.append("launcher log:\n" + launcher_log(cluster, namespace, job)[-3000:])
    except Exception as e:  # no launcher pod, or no log yet: say so
        lines.append(f"no launcher log: {e}")
    return "\n".join(lines)


def exit_codes(pod: client.V1Pod) -> list[int]:
    """Exit codes of the pod's containers, last run and the one before it."""
    out = []
    for status in pod.status.container_statuses or []:
        for state in (status.state, status.last_state):
            if state and state.terminated:
                out.append(int(state.terminated.exit_code))
    return out


def in_node(node: str, argv: list[str]) -> tuple[list[str], str]:
    """``argv`` run in the real node ``node``'s mount namespace (where its kubelet and
    containerd mount), and that kubelet's ``--root-dir``."""
    from hack import realnode

    root = ROOT / ".cluster"
    state = realnode.NodeState.load(root)
    assert state is not None, "no real node state under .cluster/realnode"
    (index,) = [i for i in range(state.count) if realnode.node_name(i) == node]
    kubelet = root / "realnode" / f"node-{index}" / "kubelet"
    return realnode.in_node_ns(state, argv), str(kubelet)


def node_mount_points(node: str) -> list[str]:
    """Mount points in the real node ``node``'s mount namespace (its kubelet's view)."""
    argv, _ = in_node(node, ["true"])
    holder = argv[1].split("/")[2]  # nsenter --mount=/proc/<pid>/ns/mnt
    with open(f"/proc/{holder}/mountinfo") as lines:
        return [line.split()[4] for line in lines]


def kill_pod_processes(pod: str) -> int:
    """SIGKILL every process of a real node's pod ``pod``, as a crash or the OOM killer would
    (no SIGTERM, so nothing of the pod's graceful stop runs); how many there were. They are this
    machine's processes: containerd gives each the pod's name as ``HOSTNAME``."""
    mark = f"HOSTNAME={pod}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or a kernel thread
            continue
        if mark in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
    return killed

"""The ``mpijob`` command against the local cluster, run as a user runs it: a process whose
output is piped (so it must be plain text), with the kubeconfig in the environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image
from matplotlib.colors import to_rgb

from mpijob import keys
from mpijob.console import plot
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("idle_gpus")]

ANSI = re.compile(r"\x1b\[")
WORKERS = 4


def mpijob_cli(
    cluster: Cluster, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mpijob"), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert not ANSI.search(result.stdout + result.stderr), "colour codes in piped output"
    if check:
        assert result.returncode == 0, result.stderr
    return result


def table(text: str, header: str) -> list[list[str]]:
    """The whitespace-split rows of the table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def submit_topology_job(cluster: Cluster, namespace: str, name: str) -> str:
    result = mpijob_cli(
        cluster,
        "submit",
        f"--name={name}",
        f"--workers={WORKERS}",
        "--gpus=1",
        "--gang",
        "--gputopology=true",
        "--image=horovod/horovod:0.28.1",
        "-n",
        namespace,
        "--wait",
        "--timeout=120",
        "--",
        "python",
        "/horovod/examples/pytorch/pytorch_synthetic_benchmark.py",
        "--model",
        "vgg16",
    )
    return result.stdout


def test_submit_then_get_shows_gpu_ids_and_nodes(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    out = submit_topology_job(crds, namespace, "vgg16")
    assert out.splitlines()[0] == "mpijob.kubeflow.org/vgg16 created"
    assert "RUNNING" in out
    job = mpijobs.get("vgg16")
    assert job["metadata"]["annotations"][keys.GPU_TOPOLOGY] == "true"
    assert job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == WORKERS + 1

    def placed() -> str | None:
        text = mpijob_cli(crds, "get", "vgg16", "-n", namespace).stdout
        rows = table(text, "NAME")[1:]
        # IS_CHIEF and GPU(IDs) are the 4th and 6th columns whatever GPU columns follow.
        workers = [r for r in rows if r[3] == "false"]
        done = len(workers) == WORKERS and all(r[5] != "N/A" for r in workers)
        return text if done else None

    text = wait_until(placed, timeout=60, what="every worker placed with GPU ids")
    fields = dict(line.split(":", 1) for line in text.splitlines()[:6])
    assert {k: v.strip() for k, v in fields.items()} == {
        "Name": "vgg16",
        "Status": "RUNNING",
        "Namespace": namespace,
        "Priority": "N/A",
        "Trainer": "MPIJOB",
        "Duration": fields["Duration"].strip(),
    }
    rows = table(text, "NAME")
    header = rows[0]
    # Arena's columns; GPU(Allocated) joins them before NODE when the workers' GPUs are pinned
    # by DRA claims (the binding mode the cluster offers), GPU(Actual) only on a mismatch.
    assert header in (
        ["NAME", "STATUS", "AGE", "IS_CHIEF", "GPU(Requested)", "GPU(IDs)", "NODE"],
        [
            "NAME",
            "STATUS",
            "AGE",
            "IS_CHIEF",
            "GPU(Requested)",
            "GPU(IDs)",
            "GPU(Allocated)",
            "NODE",
        ],
    )
    column = {name: i for i, name in enumerate(header)}
    launcher, workers = rows[1], rows[2:]
    assert launcher[0].startswith("vgg16-launcher-")
    assert launcher[column["IS_CHIEF"]] == "true"
    assert [w[0] for w in workers] == [f"vgg16-worker-{i}" for i in range(WORKERS)]
    for worker in workers:
        assert worker[column["STATUS"]] == "Running"
        assert worker[column["GPU(Requested)"]] == "1"
        assert worker[column["NODE"]].startswith("gpu-node-")
        if "GPU(Allocated)" in column:
            # The scheduler allocated exactly the chosen GPU (no "!" mark).
            assert worker[column["GPU(Allocated)"]] == worker[column["GPU(IDs)"]]
    # Four 1-GPU workers fit one DGX-1 NVLink ring: one node, four distinct GPUs.
    assert len({w[column["NODE"]] for w in workers}) == 1
    assert len({w[column["GPU(IDs)"]] for w in workers}) == WORKERS


def test_topology_shows_the_node_and_draws_the_jobs_gpus(
    crds: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    submit_topology_job(crds, namespace, "resnet")

    def node_of_job() -> str | None:
        pods = crds.core.list_namespaced_pod(
            namespace, label_selector=f"{keys.LABEL_JOB_NAME}=resnet,{keys.LABEL_JOB_ROLE}=worker"
        ).items
        placed = [p for p in pods if (p.metadata.annotations or {}).get(keys.GPU_IDS)]
        return placed[0].spec.node_name if len(placed) == WORKERS else None

    node = wait_until(node_of_job, timeout=60, what="the workers placed")
    png = tmp_path / "node.png"
    out = mpijob_cli(crds, "topology", node, "--png", str(png)).stdout
    assert out.startswith(f"Node {node}: dgx1-v100, 8 GPUs, NVLink gen 2")
    rows = table(out, "GPU0")
    assert rows[0] == [*(f"GPU{i}" for i in range(8)), "NUMA", "JOB"]
    holders = [row[-1] for row in rows[1:]]
    assert holders.count(f"{namespace}/resnet") == WORKERS
    assert f"Wrote {png}" in out

    pixels = image.imread(png)[:, :, :3]
    # The job's colour is the first of the palette when it is alone on the node, else its rank.
    jobs = sorted({h for h in holders if h != "-"})
    colour = plot.JOB_COLOURS[jobs.index(f"{namespace}/resnet") % len(plot.JOB_COLOURS)]
    marked = np.all(np.abs(pixels - np.array(to_rgb(colour))) < 1 / 255, axis=-1).sum()
    free = np.all(np.abs(pixels - np.array(to_rgb(plot.FREE_COLOUR))) < 1 / 255, axis=-1).sum()
    assert marked > 1000
    assert free > 1000 or holders.count("-") == 0


def test_list_logs_and_delete(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    mpijob_cli(
        crds,
        "submit",
        "--name=pi",
        "--workers=2",
        "--image=mpioperator/mpi-pi:openmpi",
        "-n",
        namespace,
        "--wait",
        "--",
        "/home/mpiuser/pi",
    )
    rows = table(mpijob_cli(crds, "list", "-n", namespace).stdout, "NAME")
    assert rows[0] == ["NAME", "STATUS", "TRAINER", "DURATION", "GPU(Requested)", "NODE"]
    assert [r[:3] for r in rows[1:]] == [["pi", "RUNNING", "MPIJOB"]]

    # Simulated pods have no kubelet behind them, so the API server has no log to give: the
    # command must say so in one clear line, not with a traceback.
    logs = mpijob_cli(crds, "logs", "pi", "-n", namespace, check=False)
    assert logs.returncode == 1
    assert logs.stderr.startswith(f"error: cannot read the logs of pod {namespace}/pi-launcher-")
    assert len(logs.stderr.strip().splitlines()) == 1

    missing = mpijob_cli(crds, "get", "nope", "-n", namespace, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"error: MPIJob {namespace}/nope not found"

    deleted = mpijob_cli(crds, "delete", "pi", "-n", namespace)
    assert deleted.stdout.strip() == "mpijob.kubeflow.org/pi deleted"
    wait_until(lambda: not mpijobs.api.get(namespace=namespace).items, what="the job gone")
    assert mpijob_cli(crds, "list", "-n", namespace).stdout.strip() == (
        f"No MPIJobs in namespace {namespace}."
    )

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
from support.gpus import hold
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.tenants import TenantJobs, bind_tenant
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


# --- Seeds 000 and 002, replayed ------------------------------------------------------------

#: The seeds' training image (arena's docs use their own registry's); this one has the script
#: at the path the seeds' command names. On the simulated GPU nodes no container runs.
SEED_IMAGE = "mpijob.local/pytorch-benchmark:openmpi"
#: Seed 000's command, quoted as one argument as its user types it.
SEED_COMMAND = (
    "mpirun --allow-run-as-root -np 4 -bind-to none -map-by slot -x NCCL_DEBUG=INFO python "
    "/examples/pytorch_synthetic_benchmark.py --model=vgg16 --batch-size=64"
)
SEED_NODES = ("gpu-node-0", "gpu-node-1")


def launcher_command(mpijobs: MPIJobs, name: str) -> list[str]:
    spec = mpijobs.get(name)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    container = spec["containers"][0]
    return [*container.get("command", []), *container.get("args", [])]


def wait_running(cluster: Cluster, namespace: str, job: str, workers: int = 4) -> None:
    """Until the job's workers are Running (read from the API: a CLI call per poll is slow)."""
    selector = f"{keys.LABEL_JOB_NAME}={job},{keys.LABEL_JOB_ROLE}={keys.ROLE_WORKER}"

    def running() -> bool:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
        return len(pods) == workers and all(p.status.phase == "Running" for p in pods)

    wait_until(running, timeout=60, what=f"{job}'s {workers} workers Running")


def replay_comparison_job(crds: Cluster, namespace: str, mpijobs: MPIJobs) -> None:
    """Seeds 000/002's baseline: arena's `submit mpijob` form, the same command, no topology.
    --gang alone asks for a gang scheduler this operator does not run: a note says what it
    does instead."""
    plain = "pytorch-4-vgg16"
    compared = mpijob_cli(
        crds, "submit", "mpijob", f"--name={plain}", "--gpus=1", "--workers=4", "--gang",
        f"--image={SEED_IMAGE}", "-n", namespace, SEED_COMMAND,
    )  # fmt: skip
    assert compared.stdout.strip() == f"mpijob.kubeflow.org/{plain} created"
    note = compared.stderr.strip()
    gang = "note: --gang sets schedulingPolicy.minAvailable=5; it takes effect only where"
    assert note.startswith(f"{gang} the operator runs a gang scheduler"), note
    assert launcher_command(mpijobs, plain) == SEED_COMMAND.split()
    assert keys.GPU_TOPOLOGY not in (mpijobs.get(plain)["metadata"].get("annotations") or {})

    wait_running(crds, namespace, plain)
    text = mpijob_cli(crds, "get", plain, "-n", namespace).stdout
    others = [r for r in table(text, "NAME")[1:] if r[3] == "false"]
    assert [r[1] for r in others] == ["Running"] * 4, text
    # Placed by the scheduler alone: no GPU ids of ours, on the seed's nodes.
    assert all(r[5] == "N/A" for r in others), others
    assert {r[-1] for r in others} <= set(SEED_NODES), others


def test_seed_000_002_topology_job_and_its_comparison_as_typed(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """Seeds 000/002 step by step, arena's commands spelled ``mpijob``: two 8-GPU V100 nodes
    labelled for topology-aware scheduling, the VGG16 job with ``--gang --gputopology=true`` and
    its quoted mpirun, ``get`` and ``get --type mpijob``, ``logs``, then the same job without
    topology for comparison. The GPU nodes are simulated: what is checked is what the seeds show
    of placement and status; the img/s lines need real containers (the seed 003 test reads them
    with ``mpijob logs`` from a real training job)."""
    for node in ("gpu-node-2", "gpu-node-3"):  # leave the seeds' two nodes
        hold(crds, namespace, node)
    label = f"{keys.NODE_GPU_SCHEDULE_LABEL}={keys.NODE_GPU_SCHEDULE_TOPOLOGY}"
    # The nodes as they are before the seed's first step: not opted in.
    crds.kubectl("label", "node", *SEED_NODES, f"{keys.NODE_GPU_SCHEDULE_LABEL}-")
    try:
        # Step 1: `kubectl label node <node> ack.node.gpu.schedule=topology`.
        for node in SEED_NODES:
            assert crds.kubectl("label", "node", node, label).strip() == f"node/{node} labeled"

        # Step 2: seed 000's submit as typed (arena's `submit mpi`): the quoted mpirun is the
        # launcher's command, word for word, never wrapped in another mpirun.
        name = "pytorch-topo-4-vgg16"
        submitted = mpijob_cli(
            crds, "submit", "mpi", f"--name={name}", "--gpus=1", "--workers=4", "--gang",
            "--gputopology=true", f"--image={SEED_IMAGE}", "-n", namespace, SEED_COMMAND,
        )  # fmt: skip
        assert submitted.stdout.strip() == f"mpijob.kubeflow.org/{name} created"
        assert submitted.stderr == ""  # gang and topology together: the operator's own gang
        command = launcher_command(mpijobs, name)
        assert command == SEED_COMMAND.split()
        assert command.count("mpirun") == 1

        # --gang is honoured: the operator admits launcher and workers as one gang of 5.
        policy = mpijobs.get(name)["spec"]["runPolicy"]["schedulingPolicy"]
        assert policy["minAvailable"] == 5
        admitted = mpijobs.wait_condition(name, keys.COND_GANG_ADMITTED, timeout=60)
        assert admitted["reason"] == "GangAdmitted"

        # Step 3: `arena get pytorch-topo-4-vgg16`, the seed's columns.
        wait_running(crds, namespace, name)
        mpijobs.wait_condition(name, keys.COND_RUNNING)
        text = mpijob_cli(crds, "get", name, "-n", namespace).stdout
        fields = dict(line.split(":", 1) for line in text.splitlines()[:6])
        assert [fields[k].strip() for k in ("Name", "Status", "Trainer")] == [
            name, "RUNNING", "MPIJOB"
        ]  # fmt: skip
        rows = table(text, "NAME")
        header = rows[0]
        assert header[:6] == ["NAME", "STATUS", "AGE", "IS_CHIEF", "GPU(Requested)", "GPU(IDs)"]
        assert header[-1] == "NODE"
        launcher, *workers = rows[1:]
        assert (launcher[3], launcher[4], launcher[5]) == ("true", "0", "N/A")
        assert [w[0] for w in workers] == [f"{name}-worker-{i}" for i in range(4)]
        assert [(w[1], w[4]) for w in workers] == [("Running", "1")] * 4
        # All four on one of the seed's nodes, on four distinct GPUs of its NVLink ring.
        assert len({w[-1] for w in workers}) == 1
        assert workers[0][-1] in SEED_NODES
        assert len({w[5] for w in workers}) == 4

        # Step 4: `arena get --type mpijob ...` shows the same job.
        typed = mpijob_cli(crds, "get", name, "--type", "mpijob", "-n", namespace).stdout

        def same(r: list[str]) -> tuple[str, ...]:  # AGE moves on between the two calls
            return (r[0], r[3], r[4], r[5], r[-1])

        assert [same(r) for r in table(typed, "NAME")[1:]] == [same(r) for r in rows[1:]]

        # Step 5: `arena logs`: simulated pods have no containers, so the one-line reason.
        logs = mpijob_cli(crds, "logs", name, "-n", namespace, check=False)
        assert logs.returncode == 1
        assert logs.stderr.startswith(f"error: cannot read the logs of pod {namespace}/{name}-")

        # Step 6: the comparison job, without topology.
        replay_comparison_job(crds, namespace, mpijobs)
    finally:
        crds.kubectl("label", "node", *SEED_NODES, label, "--overwrite")


# --- A tenant's text on an admin's terminal -------------------------------------------------

#: What a status message breaking its line would add to ``mpijob get``: a row that passes for
#: an instance of the job, holding a node's eight GPUs.
FORGED_ROW = "evil-worker-7  Running  1m  false  8  0,1,2,3,4,5,6,7  gpu-node-0"
#: Characters a terminal obeys (but LF, the CLI's own line break), written out here: C0, DEL,
#: C1, the bidi marks, embeddings, overrides and isolates.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The only sequences the CLI may send a terminal: its own colours and styles (SGR).
OWN_STYLES = re.compile(r"\x1b\[[0-9;]*m")


def hostile(what: str) -> str:
    """A tenant's text: its line erased and the cursor moved up, the window retitled, red,
    then CR/LF and a forged row, a bidi override, a C1 CSI clearing the screen, a tab."""
    return f"{what}\x1b[2K\x1b[1A\x1b]0;owned\x07\x1b[31m\r\n{FORGED_ROW}\u202e\x9b2J\tend"


def shown(what: str) -> str:
    """:func:`hostile` as the CLI must print it: escaped, on one line."""
    return (
        f"{what}\\x1b[2K\\x1b[1A\\x1b]0;owned\\x07\\x1b[31m\\r\\n{FORGED_ROW}\\u202e\\x9b2J\\tend"
    )


def assert_inert(out: str) -> None:
    """Nothing a terminal obeys; no line the tenant's text started."""
    assert not RAW.search(out), repr(out)
    assert not any(line.lstrip().startswith("evil-worker-7") for line in out.splitlines()), out


def test_a_tenants_escape_sequences_and_line_breaks_reach_no_admins_terminal_raw(
    crds: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    """A tenant writes escape sequences and line breaks into its job's status (conditions'
    reason and message, through the status subresource its role grants), its spec's priority
    class and the annotations of a pod that carries the job's labels; an admin's ``mpijob get``
    and ``list`` print every one escaped, on its own line, piped and on a colour terminal."""
    user = bind_tenant(crds, namespace, "console-tenant@example.com")
    tenant = TenantJobs(crds, namespace, user)
    body = mpijob("forger", workers=1)
    body["spec"]["runPolicy"] = {"schedulingPolicy": {"priorityClass": hostile("priority")}}
    tenant.create(body)
    failed = {"type": "Failed", "status": "True"}
    left = {"type": keys.COND_WORKERS_LEFT_RUNNING, "status": "True", "reason": "Left"}
    conditions = [
        {**failed, "reason": hostile("reason"), "message": hostile("message")},
        {**left, "message": hostile("left")},
    ]
    tenant.patch_status("forger", {"status": {"conditions": conditions}})
    labels = {
        keys.LABEL_OPERATOR_NAME: keys.OPERATOR_NAME,
        keys.LABEL_JOB_NAME: "forger",
        keys.LABEL_JOB_ROLE: keys.ROLE_WORKER,
    }
    tenant.create_pod(
        {
            "metadata": {
                "name": "forger-worker-0",
                "labels": labels,
                # mpijob.io/gpu-ids is the tenant's to write on its pods (placement believes only
                # PlacementDecisions); gpu-actual is not, where the agent's policy is installed.
                "annotations": {keys.GPU_IDS: hostile("ids")},
            },
            # Pending for good: no node has this label, so it holds nothing of the cluster's.
            "spec": {
                "nodeSelector": {"mpijob.io/test-nowhere": "true"},
                "containers": [{"name": "worker", "image": "busybox"}],
            },
        }
    )
    stored = mpijobs.get("forger")["status"]["conditions"]
    assert stored[0]["message"] == hostile("message")  # the API keeps it as written

    out = mpijob_cli(crds, "get", "forger", "-n", namespace).stdout
    assert_inert(out)
    for what in ("priority", "reason", "message", "left", "ids"):
        assert shown(what) in out, f"{what} not shown escaped:\n{out}"
    assert len([line for line in out.splitlines() if line.startswith("Why:")]) == 2
    assert [row[0] for row in table(out, "NAME")] == ["NAME", "forger-worker-0"]

    listed = mpijob_cli(crds, "list", "-n", namespace).stdout
    assert_inert(listed)
    assert [row[:2] for row in table(listed, "NAME")] == [["NAME", "STATUS"], ["forger", "FAILED"]]

    # On a colour terminal: the CLI's own colours, and no other sequence.
    env = {**os.environ, "KUBECONFIG": str(crds.kubeconfig), "FORCE_COLOR": "1", "COLUMNS": "400"}
    env.pop("NO_COLOR", None)
    coloured = subprocess.run(
        [str(Path(sys.executable).parent / "mpijob"), "get", "forger", "-n", namespace],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    ).stdout
    assert OWN_STYLES.search(coloured), "no colour: not printed as on a terminal"
    plain = OWN_STYLES.sub("", coloured)
    assert "\x1b" not in plain, repr(coloured)
    assert_inert(plain)
    assert shown("message") in plain

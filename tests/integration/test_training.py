"""Data-parallel PyTorch training for real: examples/pytorch-cpu.yaml on two real nodes.

The job runs in real containers of the training image (hack/pytorch_image.py): the launcher's
``mpirun`` starts one rank on each worker over SSH, the ranks meet over MPI and train with
``torch.distributed`` (gloo) across the two nodes' pods. What is checked is what the ranks
printed: where each ran, the benchmark's img/s lines, and the checksum of every rank's model
after training, equal only if the gradients were all-reduced (each rank trains on its own data).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import keys
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.realnode import ROLE, exit_codes, launcher_log, pods, ready_real_node
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

# The image's first import of torch in a fresh container and the benchmark's few iterations of a
# small model take well under a minute per rank on a 2-core machine; the rest is slack for a
# machine shared with other jobs.
TIMEOUT = 240
NAME = "pytorch-cpu"


def real_nodes(cluster: Cluster, count: int) -> list[str]:
    """``count`` Ready real nodes (the test fails, naming why, while fewer are Ready)."""
    ready_real_node(cluster)

    def enough() -> list[str] | None:
        ready = [
            str(n.metadata.name)
            for n in cluster.core.list_node(label_selector=f"{ROLE}=true").items
            if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        ]
        return sorted(ready) if len(ready) >= count else None

    return wait_until(
        enough, timeout=60, what=f"{count} Ready real nodes (REAL_NODES={count} or more)"
    )


def training_job(workers: int) -> dict[str, Any]:
    from hack import pytorch_image

    body = yaml.safe_load((ROOT / "examples" / f"{NAME}.yaml").read_text())
    job: dict[str, Any] = pytorch_image.on_real_nodes(body, workers=workers)
    return job


def test_pytorch_trains_data_parallel_across_two_real_nodes(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    nodes = real_nodes(crds, 2)
    body = training_job(2)
    # The workers stay after the launcher ends, to be checked for where they ran.
    body["spec"]["runPolicy"]["cleanPodPolicy"] = "None"
    crds.apply(body, namespace=namespace)
    mpijobs.wait_condition(NAME, keys.COND_SUCCEEDED, timeout=TIMEOUT)
    launchers = pods(crds, namespace, NAME, keys.ROLE_LAUNCHER)
    assert launchers, "the launcher pod is gone"
    assert all(0 in exit_codes(p) for p in launchers), [exit_codes(p) for p in launchers]
    log = launcher_log(crds, namespace, NAME)

    # One rank on each worker, none on the launcher, and the two workers on two nodes.
    ranks = dict(re.findall(r"^Rank (\d+) of 2 on (\S+) \(CPU\)$", log, re.M))
    assert sorted(ranks) == ["0", "1"], log
    assert sorted(ranks.values()) == [f"{NAME}-worker-0", f"{NAME}-worker-1"], log
    workers = pods(crds, namespace, NAME, keys.ROLE_WORKER)
    where = {p.metadata.name: p.spec.node_name for p in workers}
    assert len(where) == 2, where
    assert len(set(where.values())) == 2, where
    assert set(where.values()) <= set(nodes), where

    # The benchmark's lines, as Horovod's prints them.
    iters = re.findall(r"^Iter #(\d+): ([\d.]+) img/sec per CPU$", log, re.M)
    assert [int(i) for i, _ in iters] == list(range(5)), log
    assert all(float(rate) > 0 for _, rate in iters), log
    total = re.findall(r"^Total img/sec on 2 CPU\(s\): ([\d.]+) \+-[\d.]+$", log, re.M)
    assert len(total) == 1, log
    assert float(total[0]) > 0, log

    # Every rank ends with the same parameters: the all-reduce ran.
    sums = dict(re.findall(r"^Rank (\d+) parameter checksum: ([0-9a-f]{16})$", log, re.M))
    assert sorted(sums) == ["0", "1"], log
    assert len(set(sums.values())) == 1, sums


# --- Seed 003: NetApp's synchronous distributed training as one MPIJob -----------------------

#: What an admin makes once: a class for local volumes, bound when a pod needs one.
STORAGE_CLASS = "seed-local"
VOLUME_LABEL = "mpijob.io/test-volume"
SEED_003 = "sync-distributed-training"
#: Each rank: where it is, what its node's dataset volume holds, what /dev/shm is, then the
#: training, its output also kept on the results volume of its node.
RANK_SCRIPT = (
    "r=$OMPI_COMM_WORLD_RANK; "
    'echo "rank $r dataset: $(cat /mnt/dataset/NAME)"; '
    'echo "rank $r shm: $(stat -f -c %T /dev/shm) $(df -k --output=size /dev/shm | tail -1)"; '
    "python /examples/pytorch_synthetic_benchmark.py --model=convnet --batch-size=16 "
    "--num-iters=3 | tee /mnt/results/rank-$r.log"
)


def seed_003_job() -> dict[str, Any]:
    """NetApp's flow as one MPIJob: the workers mount the dataset read-only and the results
    volume, both claims bound to local volumes of the node each worker lands on, and /dev/shm
    memory-backed; the launcher runs mpirun across them instead of a `kubectl exec`."""
    claim = {
        "storageClassName": STORAGE_CLASS,
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    }
    body = training_job(2)
    body["metadata"]["name"] = SEED_003
    body["spec"]["runPolicy"] = {"cleanPodPolicy": "None"}
    specs = body["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    launcher["command"] = ["mpirun"]
    launcher["args"] = ["-n", "2", "-bind-to", "none", "-map-by", "slot", "sh", "-c", RANK_SCRIPT]
    worker = specs["Worker"]["template"]["spec"]
    selector = worker["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]
    selector["training.kubeflow.org/job-name"] = SEED_003
    worker["containers"][0]["volumeMounts"] = [
        {"name": "dataset", "mountPath": "/mnt/dataset", "readOnly": True},
        {"name": "results", "mountPath": "/mnt/results"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    worker["volumes"] = [
        *(
            {
                "name": name,
                "ephemeral": {
                    "volumeClaimTemplate": {
                        "spec": {**claim, "selector": {"matchLabels": {VOLUME_LABEL: name}}}
                    }
                },
            }
            for name in ("dataset", "results")
        ),
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}},
    ]
    return body


def local_volume(name: str, node: str, path: Path, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {VOLUME_LABEL: role}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


@pytest.fixture
def local_volumes(crds: Cluster, tmp_path: Path) -> Iterator[dict[str, dict[str, Path]]]:
    """As an admin sets them up: on each real node a dataset directory (holding the node's
    name, so a rank shows which copy it read) and a results directory, each a local
    PersistentVolume pinned to its node; removed afterwards."""
    nodes = real_nodes(crds, 2)
    crds.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )
    made: dict[str, dict[str, Path]] = {}
    names = []
    for node in nodes:
        made[node] = {}
        for role in ("dataset", "results"):
            path = tmp_path / node / role
            path.mkdir(parents=True)
            path.chmod(0o777)  # the ranks run as uid 1000
            made[node][role] = path
            names.append(f"{node}-{role}-{tmp_path.name[-12:]}".lower().replace("_", "-"))
            crds.apply(local_volume(names[-1], node, path, role))
        (made[node]["dataset"] / "NAME").write_text(f"copy on {node}\n")
    yield made
    for name in names:
        crds.kubectl("delete", "pv", name, "--ignore-not-found", "--wait=false")
    crds.kubectl("delete", "storageclass", STORAGE_CLASS, "--ignore-not-found", "--wait=false")


def test_seed_003_synchronous_training_with_claims_on_local_volumes_and_shm(
    crds: Cluster,
    namespace: str,
    operator: OperatorProcess,
    mpijobs: MPIJobs,
    local_volumes: dict[str, dict[str, Path]],
) -> None:
    """Seed 003 (NetApp): a Deployment of workers on the dataset and results volumes, then
    `kubectl exec` into one to start mpirun; here one MPIJob does both. Two workers on the two
    real nodes train synchronously; each reads the dataset copy of its node, writes to the
    results volume there, and has a memory-backed /dev/shm. The log is read as the seeds' users
    read it: `mpijob logs`."""
    crds.apply(seed_003_job(), namespace=namespace)
    mpijobs.wait_condition(SEED_003, keys.COND_SUCCEEDED, timeout=TIMEOUT)
    env = {**os.environ, "KUBECONFIG": str(crds.kubeconfig)}
    logs = subprocess.run(
        [str(Path(sys.executable).parent / "mpijob"), "logs", SEED_003, "-n", namespace],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    )  # fmt: skip
    log = logs.stdout

    # The workers on the two nodes, each with claims bound to that node's local volumes.
    workers = {p.metadata.name: p for p in pods(crds, namespace, SEED_003, keys.ROLE_WORKER)}
    assert sorted(w.spec.node_name for w in workers.values()) == sorted(local_volumes), workers
    for pod in workers.values():
        for role in ("dataset", "results"):
            claim = crds.core.read_namespaced_persistent_volume_claim(
                f"{pod.metadata.name}-{role}", namespace
            )
            assert claim.status.phase == "Bound"
            volume = crds.core.read_persistent_volume(claim.spec.volume_name)
            assert volume.spec.local.path == str(local_volumes[pod.spec.node_name][role])

    # Each rank read its own node's dataset copy and had a memory-backed /dev/shm of the limit.
    ranks = dict(re.findall(r"^Rank (\d+) of 2 on (\S+) \(CPU\)$", log, re.M))
    assert sorted(ranks) == ["0", "1"], log
    for rank, host in ranks.items():
        node = workers[host].spec.node_name
        assert f"rank {rank} dataset: copy on {node}" in log, log
        # df pads the size: a tmpfs of exactly the sizeLimit, 256 MiB in KiB.
        assert re.search(rf"^rank {rank} shm: tmpfs +{256 * 1024}$", log, re.M), log

    # Synchronous training: img/s lines, and after it every rank holds the same parameters.
    assert re.search(r"^Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+$", log, re.M), log
    sums = dict(re.findall(r"^Rank (\d+) parameter checksum: ([0-9a-f]{16})$", log, re.M))
    assert sorted(sums) == ["0", "1"], log
    assert len(set(sums.values())) == 1, sums

    # The results stay on the nodes' volumes: each rank's output, in the directory of its node.
    for rank, host in ranks.items():
        kept = local_volumes[workers[host].spec.node_name]["results"] / f"rank-{rank}.log"
        assert f"Rank {rank} parameter checksum: {sums[rank]}" in kept.read_text()

"""Data-parallel PyTorch training for real: examples/pytorch-cpu.yaml on two real nodes.

The job runs in real containers of the training image (hack/pytorch_image.py): the launcher's
``mpirun`` starts one rank on each worker over SSH, the ranks meet over MPI and train with
``torch.distributed`` (gloo) across the two nodes' pods. What is checked is what the ranks
printed: where each ran, the benchmark's img/s lines, and the checksum of every rank's model
after training, equal only if the gradients were all-reduced (each rank trains on its own data).
"""

from __future__ import annotations

import re
import sys
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
    sys.path.insert(0, str(ROOT / "hack"))
    import pytorch_image  # hack/pytorch_image.py

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

"""The training job on the real nodes: examples/pytorch-cpu.yaml in the training image.

The image (``mpijob.local/pytorch-benchmark:openmpi``, data-parallel PyTorch over Open MPI 5) is
built with the others, by hack/images.py (``python -m hack.images build pytorch``).
"""

from __future__ import annotations

from typing import Any

from hack import images, realnode

REFERENCE = images.PYTORCH_REFERENCE


def on_real_nodes(
    body: dict[str, Any], workers: int | None = None, cpu: str = "1"
) -> dict[str, Any]:
    """The training MPIJob (examples/pytorch-cpu.yaml) sent to the real nodes with ``workers``
    workers and ranks (default: as written). Each container may use ``cpu`` but asks only for
    a tenth of a CPU, so 4 workers and the launcher still fit on two nodes of a 2-core machine:
    the limit keeps a rank from starving the others, the request decides nothing here."""
    job = realnode.place_on_real_node(body, cpu=cpu)
    specs = job["spec"]["mpiReplicaSpecs"]
    if workers is not None:
        specs["Worker"]["replicas"] = workers
        args = specs["Launcher"]["template"]["spec"]["containers"][0]["args"]
        args[args.index("-n") + 1] = str(workers)
    for spec in specs.values():
        for c in spec["template"]["spec"]["containers"]:
            c["resources"].setdefault("requests", {})["cpu"] = "100m"
    return job

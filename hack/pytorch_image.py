"""The training image: data-parallel PyTorch over Open MPI 5, for the real nodes.

``mpijob.local/pytorch-benchmark:openmpi`` is ``mpioperator/mpi-pi:openmpi``'s recipe
(hack/images.py: trixie, Open MPI 5, OpenSSH on 2222, ``mpiuser`` uid 1000, the same entrypoint,
pi) plus Debian's ``python3-torch`` (CPU only; PyPI's torch wheels carry CUDA and are
gigabytes), ``python3-mpi4py`` for the rendezvous, ``python-is-python3`` so commands written
``python ...`` run, and hack/pytorch/pytorch_synthetic_benchmark.py at /examples/, where the
seeds' commands look for it. It shares the pi image's MPI wiring by construction: its recipe is
that recipe with packages and one file added, so a change there rebuilds this one too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import images  # hack/images.py

NAME = "pytorch"
REFERENCE = "mpijob.local/pytorch-benchmark:openmpi"
BASE = "openmpi"
PACKAGES = ["python3-torch", "python3-mpi4py", "python-is-python3"]
SCRIPT = images.HACK / "pytorch" / "pytorch_synthetic_benchmark.py"


def recipe() -> list[str]:
    """The Open MPI 5 pi image's mmdebstrap arguments, with the packages added and the
    benchmark copied in before the build tools are purged."""
    argv = images.mpi_recipe(BASE)
    include = next(i for i, a in enumerate(argv) if a.startswith("--include="))
    argv[include] += "," + ",".join(PACKAGES)
    install = (
        f'mkdir -p "$1/examples" && install -m 0755 {SCRIPT} '
        '"$1/examples/pytorch_synthetic_benchmark.py"'
    )
    purge = next(i for i, a in enumerate(argv) if "apt-get purge" in a)
    argv.insert(purge, f"--customize-hook={install}")
    # Recommends would add compilers and BLAS variants the CPU path never loads.
    argv.insert(1, '--aptopt=APT::Install-Recommends "false"')
    return argv


def archive_path() -> Path:
    files = [*images.RECIPE_FILES, SCRIPT]
    argv = [a.replace(str(images.HACK), "hack") for a in recipe()]
    extra = json.dumps([argv, images.EXTRA_DIRS, images.image_config(BASE)])
    return images.cache_dir() / f"{NAME}-{images.recipe_digest(files, extra)}.oci.tar"


def build(dest: Path) -> None:
    images.build_rootfs(NAME, recipe(), REFERENCE, images.image_config(BASE), dest)


def on_real_nodes(
    body: dict[str, Any], workers: int | None = None, cpu: str = "1"
) -> dict[str, Any]:
    """The training MPIJob (examples/pytorch-cpu.yaml) sent to the real nodes with ``workers``
    workers and ranks (default: as written). Each container may use ``cpu`` but asks only for
    a tenth of a CPU, so 4 workers and the launcher still fit on two nodes of a 2-core machine:
    the limit keeps a rank from starving the others, the request decides nothing here."""
    import realnode  # hack/realnode.py

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

"""Every child of the upstream pi examples (OpenMPI, Intel, MPICH), against golden YAML.

Golden files live in tests/data/golden as ``<job>.mpijob.yaml`` (input) and
``<job>.children.yaml`` (expected Service, ConfigMap, Secret, workers, launcher Job). After an
intended change, rewrite them with ``MPIJOB_UPDATE_GOLDEN=1 pytest tests/unit/build`` and review
the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import api
from mpijob.desired.config_map import build_config_map
from mpijob.desired.launcher import build_launcher_job
from mpijob.desired.service import build_service
from mpijob.desired.ssh import build_ssh_secret
from mpijob.desired.worker import build_worker

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden"
PRIVATE_PEM = b"-----BEGIN EC PRIVATE KEY-----\nFIXED\n-----END EC PRIVATE KEY-----\n"
PUBLIC_LINE = b"ecdsa-sha2-nistp521 AAAAFIXED\n"


def _children(job: api.MPIJob) -> list[dict[str, Any]]:
    launcher, _ = build_launcher_job(job)
    running = [f"{job.name}-worker-0"]
    return [
        build_service(job),
        build_config_map(job, running),
        build_ssh_secret(job, PRIVATE_PEM, PUBLIC_LINE),
        *(build_worker(job, i) for i in range(job.spec.worker_replicas)),
        launcher,
    ]


@pytest.mark.parametrize(
    "source", sorted(GOLDEN.glob("*.mpijob.yaml")), ids=lambda p: p.name.split(".")[0]
)
def test_children_match_golden(source: Path) -> None:
    job = api.with_defaults(api.parse(yaml.safe_load(source.read_text())))
    assert api.validate(job) == []
    children = _children(job)
    golden = source.with_name(source.name.replace(".mpijob.", ".children."))
    if os.environ.get("MPIJOB_UPDATE_GOLDEN"):
        golden.write_text(yaml.safe_dump_all(children, sort_keys=False))
    assert children == list(yaml.safe_load_all(golden.read_text()))


def test_there_is_a_golden_job_per_implementation() -> None:
    implementations = {
        yaml.safe_load(p.read_text())["spec"].get("mpiImplementation", "OpenMPI")
        for p in GOLDEN.glob("*.mpijob.yaml")
    }
    assert implementations == {"OpenMPI", "Intel", "MPICH"}

"""``mpijob.io/launch`` is the tenant's to write: it wires the tenant's own pods and nothing
that decides GPUs reads it (placement, gang admission, GPU shares, the node agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "mpijob"
GPU_DECIDING = ("placement", "gang", "shares", "agent")


@pytest.mark.parametrize("package", GPU_DECIDING)
def test_no_module_that_decides_gpus_reads_the_launch_annotation(package: str) -> None:
    readers = [
        str(path.relative_to(PACKAGE))
        for path in sorted((PACKAGE / package).rglob("*.py"))
        if any(n in path.read_text() for n in ("keys.LAUNCH", "launch_agent", "mpijob.io/launch"))
    ]
    assert readers == []


#: Where the annotation may be read: its validation, and the builders of the job's own pods
#: and Secret.
WIRING = {
    "api/launch.py",
    "api/models.py",
    "desired/launch.py",
    "desired/launcher.py",
    "desired/names.py",
    "desired/sync.py",
    "desired/worker.py",
}


def test_the_annotation_is_read_only_where_a_job_is_validated_and_its_pods_wired() -> None:
    readers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "keys.LAUNCH)" in path.read_text() or "launch_agent" in path.read_text()
    }
    assert readers
    assert readers <= WIRING

"""The real nodes' disk check: refused with the shortfall named, before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from hack import realnode


def archive(tmp_path: Path, name: str, size: int) -> Path:
    path = tmp_path / name
    path.write_bytes(b"\0" * size)
    return path


def fake_free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(
        realnode.shutil, "disk_usage", lambda _p: type(usage)(usage.total, usage.used, free)
    )


def test_too_little_disk_is_refused_naming_what_is_needed_and_what_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archives = [archive(tmp_path, "pytorch-1.oci.tar", 1 << 20)]
    fake_free(monkeypatch, realnode.DISK_MARGIN)
    with pytest.raises(realnode.NodeError) as e:
        realnode.check_disk(tmp_path / "cluster", 2, archives)
    text = str(e.value.code)
    assert "2 real node(s) need about 2.0 GiB free under" in text
    assert "2.0 GiB is free" in text
    assert "REAL_NODES" in text


def test_nodes_that_already_hold_the_images_need_only_the_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archives = [archive(tmp_path, "openmpi-1.oci.tar", 1 << 30)]
    root = tmp_path / "cluster"
    for i in range(2):
        marker = root / "realnode" / f"node-{i}" / "containerd" / "imported.json"
        marker.parent.mkdir(parents=True)
        marker.write_text(json.dumps({"docker.io/mpioperator/mpi-pi:openmpi": archives[0].name}))
    fake_free(monkeypatch, realnode.DISK_MARGIN)
    realnode.check_disk(root, 2, archives)
    # A third node would hold them twice more.
    with pytest.raises(realnode.NodeError):
        realnode.check_disk(root, 3, archives)


def test_enough_disk_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archives: list[Any] = [archive(tmp_path, "mpich-1.oci.tar", 1 << 20)]
    fake_free(monkeypatch, realnode.DISK_MARGIN + 4 * (1 << 20))
    realnode.check_disk(tmp_path / "cluster", 2, archives)

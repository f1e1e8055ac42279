"""``mpijob topology``: the link matrix, who holds which GPU, and the NVLink picture."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image
from matplotlib.colors import to_rgb
from rich.console import Console

from mpijob import keys
from mpijob.console import plot
from mpijob.console import topology as view
from mpijob.placement import codec, smi, topologies
from mpijob.shares.request import Placed, Share
from support.console_objects import pod_body

pytestmark = pytest.mark.unit

DGX1 = topologies.load("dgx1-v100")


def usage_two_jobs() -> dict[int, view.GpuUse]:
    pods = [
        pod_body("vgg16-worker-0", gpu_ids="0,1"),
        pod_body("vgg16-worker-1", gpu_ids="2,3"),
        pod_body("resnet-worker-0", job="resnet", gpu_ids="5", namespace="team-b"),
        pod_body("done-worker-0", job="done", gpu_ids="6", phase="Succeeded"),
        pod_body("plain", job="plain", gpu_ids=None),
    ]
    return view.gpu_usage(pods)


def test_gpu_usage_maps_each_gpu_to_its_job_and_skips_finished_pods() -> None:
    usage = usage_two_jobs()
    assert {i: u.job for i, u in usage.items()} == {
        0: "team-a/vgg16",
        1: "team-a/vgg16",
        2: "team-a/vgg16",
        3: "team-a/vgg16",
        5: "team-b/resnet",
    }
    assert usage[2].pod == "vgg16-worker-1"
    assert view.jobs_of(usage) == ["team-a/vgg16", "team-b/resnet"]


def test_link_codes_match_nvidia_smi() -> None:
    """Every cell equals what ``nvidia-smi topo -m`` prints for the shipped DGX-1."""
    rows = [line.split("\t") for line in smi.render(DGX1).splitlines()[1 : 1 + DGX1.size]]
    for a, row in enumerate(rows):
        for b in range(DGX1.size):
            assert view.link_code(DGX1, a, b) == row[1 + b].strip()


def test_matrix_table_has_a_row_per_gpu_with_codes_numa_and_job() -> None:
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(view.matrix_table(DGX1, usage_two_jobs()))
    lines = [line.split() for line in buffer.getvalue().splitlines()]
    assert lines[0] == [*(f"GPU{i}" for i in range(8)), "NUMA", "JOB"]
    assert lines[1] == [
        "GPU0",
        "X",
        "NV1",
        "NV1",
        "NV2",
        "NV2",
        "SYS",
        "SYS",
        "SYS",
        "0",
        "team-a/vgg16",
    ]
    assert lines[5][-1] == "-"
    assert lines[6][-1] == "team-b/resnet"
    assert len(lines) == 9


def test_summary_counts_free_gpus() -> None:
    assert view.summary("gpu-node-0", DGX1, usage_two_jobs()) == (
        "Node gpu-node-0: dgx1-v100, 8 GPUs, NVLink gen 2, PCIe gen 3; 3 free"
    )


def colour_pixels(png: Path, colour: str) -> int:
    """How many pixels of the picture have exactly this colour."""
    pixels = image.imread(png)[:, :, :3]
    target = np.array(to_rgb(colour))
    return int(np.all(np.abs(pixels - target) < 1 / 255, axis=-1).sum())


def test_png_marks_each_jobs_gpus_in_its_colour(tmp_path: Path) -> None:
    usage = usage_two_jobs()
    path = tmp_path / "node.png"
    plot.write_png(path, DGX1, usage, node="gpu-node-0")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    vgg, resnet = (plot.job_colour(job, usage) for job in view.jobs_of(usage))
    unused = plot.JOB_COLOURS[2]
    # Four GPU discs plus a legend patch outweigh one disc plus a patch, and both show.
    assert colour_pixels(path, vgg) > colour_pixels(path, resnet) > 1000
    assert colour_pixels(path, plot.FREE_COLOUR) > 1000
    assert colour_pixels(path, unused) == 0


def test_picture_draws_only_nvlink_edges_with_their_codes() -> None:
    fig = plot.draw(DGX1, {}, "t")
    labels = [t.get_text() for t in fig.axes[0].texts]
    # The DGX-1's hybrid cube-mesh: 16 NVLinked pairs, 8 with two links.
    assert sorted(label for label in labels if label.startswith("NV")) == ["NV1"] * 8 + ["NV2"] * 8
    assert not set(labels) & {"SYS", "PHB", "PIX"}
    assert {f"GPU{i}" for i in range(8)} <= set(labels)


def test_a_node_without_nvlink_shows_its_pcie_pairs() -> None:
    pcie = topologies.load("pcie-8gpu-2socket")
    texts = {t.get_text() for t in plot.draw(pcie, {}, "t").axes[0].texts}
    assert texts & {"PIX", "PXB", "PHB", "NODE", "SYS"}


def test_annotation_round_trip_feeds_the_view() -> None:
    """The console reads the same annotation text the local cluster writes on its nodes."""
    decoded = codec.loads(codec.dumps(DGX1))
    assert [view.link_code(decoded, 0, b) for b in range(8)] == [
        view.link_code(DGX1, 0, b) for b in range(8)
    ]


def share_node(binpack: bool = True) -> dict[str, object]:
    labels = {keys.NODE_GPU_SCHEDULE_LABEL: keys.NODE_GPU_SCHEDULE_CORE_MEM}
    if binpack:
        labels[keys.NODE_GPU_PLACEMENT_LABEL] = keys.NODE_GPU_PLACEMENT_BINPACK
    allocatable = {keys.GPU_COUNT_RESOURCE: "2", keys.GPU_MEM_RESOURCE: "30"}
    return {"metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}}


def share_pod(
    name: str, gpu: int, memory: int, core: int | None, phase: str = "Running"
) -> dict[str, object]:
    share = Placed("n", gpu, f"GPU-{gpu}", Share(memory, core), claim=f"ns/{name}")
    annotations = {keys.GPU_SHARE: share.dumps()}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "status": {"phase": phase},
    }


def test_shares_table_sums_each_gpus_shares_and_names_their_pods() -> None:
    usage = view.share_usage(
        [
            share_pod("b", 0, 2, 30),
            share_pod("a", 0, 4, 25),
            share_pod("done", 0, 8, 40, phase="Succeeded"),
            share_pod("mem", 1, 3, None),
        ]
    )
    assert [s.pod for s in usage[0]] == ["ns/a", "ns/b"]
    table = view.shares_table(share_node(), usage)
    assert table is not None
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    lines = out.getvalue().splitlines()
    assert "binpack" in lines[0]
    gpu0 = next(line for line in lines if line.startswith("GPU0")).split()
    assert gpu0[1:3] == ["6/15", "55/100"]
    assert "ns/a (4 GiB, 25%), ns/b (2 GiB, 30%)" in " ".join(gpu0)
    gpu1 = next(line for line in lines if line.startswith("GPU1"))
    assert "ns/mem (3 GiB, memory only)" in gpu1


def test_shares_table_is_none_for_a_node_that_shares_no_gpu() -> None:
    node = share_node()
    node["metadata"] = {"name": "n", "labels": {keys.NODE_GPU_SCHEDULE_LABEL: "topology"}}
    assert view.shares_table(node, {}) is None

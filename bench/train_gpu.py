#!/usr/bin/env python3
"""GPU training benchmark: img/s of the training program over NCCL at 1, 2 and 4 ranks, a GPU each.

``make bench-train`` measures examples/pytorch-cpu.yaml on the real nodes (CPU, gloo). This is its
GPU counterpart, for a machine with NVIDIA GPUs and no cluster: the same program
(hack/pytorch/pytorch_synthetic_benchmark.py) started by ``mpirun`` on this host, one rank per
GPU, so torch.distributed runs NCCL (the program picks NCCL whenever CUDA is available). Three
runs per size; the median is reported with the scaling efficiency against one rank. Sizes larger
than the host's GPU count are skipped and said so: NCCL refuses two ranks on one device. Each
run's log must show one ``(GPU)`` rank per rank, NCCL's own ``NCCL INFO`` lines (when more than
one rank), and equal parameter checksums on every rank (the all-reduce ran), or the run fails.

Needs, on the host: ``mpirun`` (Open MPI 4 or 5), and a Python (``--python``, default the one
running this script) with PyTorch built for CUDA and mpi4py; torchvision for the seeds' models
(``vgg16``, ``resnet50``), else ``--model resnet18``. Everything missing is named before any
run. Writes .bench/train_gpu.json. A benchmark, not a test: it asserts nothing about speed.

    python3 bench/train_gpu.py                       # vgg16, batch 64, 224 px, as the seeds
    python3 bench/train_gpu.py --model resnet18 --ranks 1 2 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "hack" / "pytorch" / "pytorch_synthetic_benchmark.py"
TOTAL = re.compile(r"^Total img/sec on (\d+) GPU\(s\): ([\d.]+)", re.M)
RANK = re.compile(r"^Rank (\d+) of (\d+) on \S+ \(GPU\)$", re.M)
CHECKSUM = re.compile(r"^Rank (\d+) parameter checksum: ([0-9a-f]{16})$", re.M)
#: One run of a large model on one GPU takes well under a minute; the rest is first-time CUDA
#: and NCCL initialisation and slack.
TIMEOUT = 600

PROBE = """
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count(),
       "nccl": torch.distributed.is_nccl_available(),
       "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
try:
    import mpi4py
    out["mpi4py"] = mpi4py.__version__
except ImportError:
    out["mpi4py"] = None
try:
    import torchvision
    out["torchvision"] = torchvision.__version__
except ImportError:
    out["torchvision"] = None
print(json.dumps(out))
"""


def preflight(python: str, model: str) -> dict[str, Any]:
    """What the host has; exits naming everything missing."""
    problems = []
    if shutil.which("mpirun") is None:
        problems.append("no mpirun on PATH: install Open MPI (Debian: openmpi-bin)")
    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        problems.append(f"{python} cannot import torch:\n{probe.stderr.strip()}")
        raise SystemExit("\n".join(f"bench/train_gpu.py: {p}" for p in problems))
    facts: dict[str, Any] = json.loads(probe.stdout)
    if not facts["gpus"]:
        problems.append(f"torch {facts['torch']} sees no GPU (CUDA build: {facts['cuda']})")
    if not facts["nccl"]:
        problems.append(f"torch {facts['torch']} was built without NCCL")
    if facts["mpi4py"] is None:
        problems.append(f"{python} has no mpi4py (pip install mpi4py, against this mpirun)")
    if model not in ("convnet", "mlp", "resnet18") and facts["torchvision"] is None:
        problems.append(f"--model {model} needs torchvision; or use --model resnet18")
    if problems:
        raise SystemExit("\n".join(f"bench/train_gpu.py: {p}" for p in problems))
    mpirun = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, check=False)
    facts["mpirun"] = (mpirun.stdout or mpirun.stderr).splitlines()[0].strip()
    return facts


def command(args: argparse.Namespace, ranks: int) -> list[str]:
    """mpirun on this host, one rank per GPU (each rank takes GPU <local rank>)."""
    argv = ["mpirun", "-np", str(ranks), "--host", f"localhost:{ranks}"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["--bind-to", "none", "--map-by", "slot"]
    for name in ("NCCL_DEBUG=INFO", "PATH", "LD_LIBRARY_PATH"):
        argv += ["-x", name]
    return [
        *argv,
        args.python,
        str(PROGRAM),
        f"--model={args.model}",
        f"--batch-size={args.batch_size}",
        f"--image-size={args.image_size}",
        f"--num-classes={args.num_classes}",
        f"--num-iters={args.num_iters}",
    ]


def one_run(args: argparse.Namespace, ranks: int) -> float:
    argv = command(args, ranks)
    env = {**os.environ, "NCCL_DEBUG": "INFO"}
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False
    )
    log = done.stdout + done.stderr
    totals = TOTAL.findall(log)
    seen = sorted(int(r) for r, size in RANK.findall(log) if int(size) == ranks)
    sums = dict(CHECKSUM.findall(log))
    problems = []
    if done.returncode != 0:
        problems.append(f"mpirun exited {done.returncode}")
    if seen != list(range(ranks)):
        problems.append(f"ranks on a GPU: {seen}, wanted 0..{ranks - 1}")
    if ranks > 1 and "NCCL INFO" not in log:
        problems.append("no NCCL INFO line: the ranks did not communicate over NCCL")
    if sorted(sums) != [str(r) for r in range(ranks)] or len(set(sums.values())) != 1:
        problems.append(f"parameter checksums differ or are missing: {sums}")
    if len(totals) != 1 or int(totals[0][0]) != ranks:
        problems.append(f"no 'Total img/sec on {ranks} GPU(s)' line")
    if problems:
        tail = "\n".join(log.splitlines()[-60:])
        raise SystemExit(f"{' '.join(argv)}:\n  " + "\n  ".join(problems) + f"\n{tail}")
    return float(totals[0][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="vgg16", help="the seeds': vgg16 (default), resnet50")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--python", default=sys.executable, help="Python with torch and mpi4py")
    args = parser.parse_args()
    facts = preflight(args.python, args.model)
    print(
        f"{facts['gpus']} GPU(s): {', '.join(facts['names'])}; torch {facts['torch']} "
        f"(CUDA {facts['cuda']}), {facts['mpirun']}",
        flush=True,
    )
    results: dict[str, Any] = {
        "host": facts,
        "runs": args.runs,
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "skipped": [],
    }
    single = None
    for ranks in args.ranks:
        if ranks > facts["gpus"]:
            print(f"{ranks} ranks: skipped, {facts['gpus']} GPU(s) here", flush=True)
            results["skipped"].append(ranks)
            continue
        samples = [one_run(args, ranks) for _ in range(args.runs)]
        median = statistics.median(samples)
        single = median if ranks == 1 else single
        eff = f", {100 * median / (ranks * single):.0f}% of linear" if single else ""
        results[str(ranks)] = {"img_per_sec": samples, "median": median}
        print(
            f"{ranks} rank(s), NCCL: {', '.join(f'{s:.1f}' for s in samples)} img/s "
            f"(median {median:.1f}{eff})",
            flush=True,
        )
    out = ROOT / ".bench" / "train_gpu.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

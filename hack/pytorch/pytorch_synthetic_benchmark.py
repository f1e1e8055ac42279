#!/usr/bin/env python3
"""Data-parallel PyTorch training on synthetic data, one process per MPI rank.

Started by ``mpirun`` (the MPIJob's launcher), each rank reads its place from the MPI
environment: its rank, the world's size and its local rank come from MPI itself (mpi4py), and
rank 0's address and a free port are broadcast over MPI, so ``torch.distributed`` needs no
MASTER_ADDR set by hand, whatever host rank 0 was mapped to. The gradients are averaged by
DistributedDataParallel over gloo on CPU, NCCL on GPUs.

Printed as Horovod's pytorch_synthetic_benchmark.py prints it (``Iter #0: 12.3 img/sec per CPU``,
``Total img/sec on 2 CPU(s): ...``), plus one line per rank naming its host, and after training
one line per rank with a checksum of its model's parameters. Each rank trains on data of its
own, so the checksums agree only if the all-reduce ran.

Models: ``convnet`` (the default, a small CNN sized for a CPU), ``mlp``, ``resnet18``, and
torchvision's models (``vgg16``, ``resnet50``, ...) where torchvision is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import timeit
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="convnet", help="convnet, mlp, resnet18, torchvision's")
    p.add_argument("--batch-size", type=int, default=16, help="images per rank per step")
    p.add_argument("--image-size", type=int, default=32, help="side of the square input images")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--num-warmup-batches", type=int, default=2)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even with a GPU")
    p.add_argument("--fp16-allreduce", action="store_true", help="(accepted for Horovod's flags)")
    p.add_argument("--use-adasum", action="store_true", help="(accepted for Horovod's flags)")
    return p.parse_args()


class ConvNet(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + self.short(x))


class ResNet18(nn.Module):
    """ResNet-18's shape (2 blocks per stage, 64 to 512 channels), written out so the image
    needs no torchvision."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model(name: str, classes: int, image_size: int) -> nn.Module:
    if name == "convnet":
        return ConvNet(classes)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(3 * image_size * image_size, 256), nn.ReLU(),
            nn.Linear(256, classes),
        )  # fmt: skip
    if name == "resnet18":
        return ResNet18(classes)
    try:
        from torchvision import models
    except ImportError:
        sys.exit(f"model {name!r} needs torchvision, which this image lacks; try convnet")
    return getattr(models, name)(num_classes=classes)


def rendezvous(comm: MPI.Comm) -> dist.TCPStore:
    """torch.distributed's key-value store, served by rank 0 on a port the kernel picks; its
    address and port reach the other ranks over MPI. Rank 0's pod name resolves to its pod's
    address (the kubelet writes it into /etc/hosts). Debian's torch has no libuv: the store
    runs on its own sockets."""
    rank, size = comm.Get_rank(), comm.Get_size()
    store = None
    where = None
    if rank == 0:
        store = dist.TCPStore(
            "0.0.0.0", 0, size, is_master=True, wait_for_workers=False, use_libuv=False
        )
        where = (socket.gethostbyname(socket.gethostname()), store.port)
    addr, port = comm.bcast(where, root=0)
    if store is None:
        store = dist.TCPStore(addr, port, size, is_master=False, use_libuv=False)
    return store


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().to("cpu", torch.float64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def benchmark(
    args: argparse.Namespace, step: Callable[[], None], rank: int, size: int, kind: str
) -> None:
    """Horovod's benchmark loop and lines, printed by rank 0."""

    def log(s: str) -> None:
        if rank == 0:
            print(s, flush=True)

    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {kind}s: {size}")
    log("Running warmup...")
    timeit.timeit(step, number=args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{i}: {rate:.1f} img/sec per {kind}")
        rates.append(rate)
    mean = sum(rates) / len(rates)
    conf = 1.96 * (sum((r - mean) ** 2 for r in rates) / len(rates)) ** 0.5
    log(f"Img/sec per {kind}: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} {kind}(s): {size * mean:.1f} +-{size * conf:.1f}")


def main() -> None:
    args = parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local_rank = int(
        os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK")
        or os.environ.get("MPI_LOCALRANKID")
        or os.environ.get("PMI_LOCAL_RANK")
        or 0
    )
    cuda = torch.cuda.is_available() and not args.no_cuda
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=rendezvous(comm), rank=rank, world_size=size
    )
    kind = "GPU" if cuda else "CPU"
    # One line per rank, in rank order, so the log shows where each rank ran.
    for r in range(size):
        if r == rank:
            print(f"Rank {rank} of {size} on {socket.gethostname()} ({kind})", flush=True)
        comm.Barrier()

    # Same initial weights on every rank (DDP also broadcasts rank 0's), different data per rank.
    torch.manual_seed(0)
    model = make_model(args.model, args.num_classes, args.image_size).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01 * size, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen)
    target = torch.randint(0, args.num_classes, (args.batch_size,), generator=gen)
    data, target = data.to(device), target.to(device)

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(ddp(data), target).backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()

    benchmark(args, step, rank, size, kind)

    for r in range(size):
        if r == rank:
            print(f"Rank {rank} parameter checksum: {checksum(model)}", flush=True)
        comm.Barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        # A rank that fails must end the job: exiting alone (mpi4py finalizes at exit) would
        # leave the other ranks waiting for it in their next collective, for ever.
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

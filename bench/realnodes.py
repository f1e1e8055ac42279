"""What the benchmarks on the local cluster's real nodes share (``make bench-train``,
``make bench-launch``): an operator of ours watching the benchmark's own namespace, and the
results written where every benchmark writes them."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from bench import ours_env
from hack import cluster

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def operator(core: client.CoreV1Api, namespace: str, *flags: str) -> Iterator[None]:
    """The namespace (made if missing) and our operator watching it, with ``flags``, its log
    in the cluster's logs; stopped on the way out."""
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as e:
        if e.status != 409:
            raise
    kubeconfig = cluster.state_dir() / "kubeconfig"
    log = (cluster.state_dir() / "logs" / f"operator-{namespace}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpijob", "run", "-n", namespace, "--no-leader-elect",
         "--monitoring-port", "0", "--health-port", "0", "--kubeconfig", str(kubeconfig),
         *flags],
        stdout=log, stderr=subprocess.STDOUT, env=ours_env(),
    )  # fmt: skip
    try:
        time.sleep(3)  # its caches are filled (it lists before it watches)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def write(name: str, results: dict[str, Any]) -> None:
    """``.bench/<name>.json``, said where."""
    out = ROOT / ".bench" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out.relative_to(ROOT)}")

"""How many PlacementDecisions, and how many live worker pods, hold each GPU: sampled every
0.25 s from a thread, the most of each ever seen kept (the leader-election tests and
``bench/failover.py``). Plain ``kubernetes`` client calls, so the benchmarks import it too."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Any

from kubernetes import client

from mpijob import keys


class GpuSampler(threading.Thread):
    """Per node and GPU: the PlacementDecisions of ``namespace`` naming it, and its live worker
    pods (``mpijob.io/gpu-ids``, not Succeeded or Failed); the most of each ever seen."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.halt = threading.Event()
        self.samples = 0
        self.most_decisions = 0
        self.most_pods = 0
        self.worst: list[str] = []

    def sample(self) -> None:
        found: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            keys.DECISION_GROUP,
            keys.DECISION_VERSION,
            self.namespace,
            keys.DECISION_PLURAL,
            _request_timeout=5,
        )["items"]
        pods = self.core.list_namespaced_pod(self.namespace, _request_timeout=5).items
        by_decision: Counter[tuple[str, int]] = Counter()
        for d in found:
            for worker in (d.get("spec") or {}).get("workers") or []:
                for gpu in worker.get("gpus") or []:
                    by_decision[(worker["node"], int(gpu))] += 1
        by_pod: Counter[tuple[str, int]] = Counter()
        for p in pods:
            ids = (p.metadata.annotations or {}).get(keys.GPU_IDS)
            if not ids or not p.spec.node_name or p.status.phase in ("Succeeded", "Failed"):
                continue
            for gpu in ids.split(","):
                by_pod[(p.spec.node_name, int(gpu))] += 1
        self.samples += 1
        for counter, most in ((by_decision, "most_decisions"), (by_pod, "most_pods")):
            if counter:
                where, count = counter.most_common(1)[0]
                if count > getattr(self, most):
                    setattr(self, most, count)
                    self.worst.append(f"{most}: {count} on {where}")

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(Exception):  # the API server away: no sample
                self.sample()
            time.sleep(0.25)

    def __enter__(self) -> GpuSampler:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.halt.set()
        self.join(timeout=10)

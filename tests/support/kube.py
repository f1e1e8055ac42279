"""Cluster access for the integration tests: the real API server through the official client."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, dynamic

from support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    """A running cluster the suite talks to."""

    kubeconfig: Path
    local: bool

    @cached_property
    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @cached_property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @cached_property
    def dyn(self) -> dynamic.DynamicClient:
        return dynamic.DynamicClient(self.api)

    def as_user(self, user: str) -> client.CoreV1Api:
        """The core API as ``user``, impersonated: RBAC and admission see ``user`` (in group
        ``system:authenticated`` only), as for a tenant's own credentials."""
        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        return client.CoreV1Api(api)

    def delete_namespace(self, name: str) -> None:
        """Delete a test's namespace without waiting, and its pods and ResourceClaims at once.

        The namespace controller alone removes a namespace's pods about 5 s after the
        namespace is deleted, and the next GPU test waits that long for their GPUs
        (``idle_gpus``). Deleted here, with their own grace periods as the controller would,
        they go at once on the simulated nodes. The namespace goes first: once it terminates,
        no controller (a launcher's Job) can create a pod in it again."""
        self.core.delete_namespace(name, propagation_policy="Background")
        self.core.delete_collection_namespaced_pod(name)
        try:
            client.CustomObjectsApi(self.api).delete_collection_namespaced_custom_object(
                "resource.k8s.io", "v1", name, "resourceclaims"
            )
        except client.ApiException as e:
            if e.status != 404:  # 404: DRA not served, so no claim exists
                raise

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run kubectl (the cluster's own build when local, else the one on PATH)."""
        out = subprocess.run(
            [kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr}")
        return out.stdout + out.stderr

    def apply(self, manifest: dict[str, Any] | str, namespace: str | None = None) -> str:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        ns = ["-n", namespace] if namespace else []
        return self.kubectl("apply", "--server-side", *ns, "-f", "-", input=text)


def wait_all_refused(list_pods: Any, count: int, what: str, timeout: float = 60) -> None:
    """Wait until the scheduler has tried each of ``count`` pods and refused it
    (``PodScheduled=False``, reason ``Unschedulable``), failing as soon as any is bound: "none
    bound" proven by the scheduler's verdict on every pod, not by a pause."""

    def refused(pod: Any) -> bool:
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in (pod.status.conditions or [])
        )

    def probe() -> dict[str, list[str]] | None:
        pods = list_pods()
        bound = [p.metadata.name for p in pods if p.spec.node_name]
        if bound:
            return {"bound": bound}
        done = len(pods) == count and all(refused(p) for p in pods)
        return {"refused": [p.metadata.name for p in pods]} if done else None

    verdict = wait_until(probe, timeout=timeout, what=f"{what}: each of {count} pods refused")
    assert "bound" not in verdict, f"{what}: {verdict}"


def kubectl_binary() -> str:
    from hack import cluster as local

    path = local.binaries()["kubectl"]
    return str(path) if path.exists() else "kubectl"


def start_cluster() -> Cluster:
    """The cluster named by MPIJOB_TEST_KUBECONFIG, else the local one (started on demand, once
    per test run however many pytest-xdist workers ask)."""
    if os.environ.get("MPIJOB_TEST_KUBECONFIG"):
        return Cluster(Path(os.environ["MPIJOB_TEST_KUBECONFIG"]), local=False)
    logs = ROOT / ".test-logs"
    logs.mkdir(exist_ok=True)
    # xdist gives every worker of one run the same id: the first worker starts (or checks) the
    # cluster, the others wait for it and use it. A second `up` while tests run would be
    # harmless at best; under load it could take a slow API server for a stale one.
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
    started = logs / "cluster-started-by"
    with (logs / "cluster.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not run or not started.exists() or started.read_text() != run:
            _up()
            started.write_text(run)
    return Cluster(ROOT / ".cluster" / "kubeconfig", local=True)


def _up() -> None:
    # The audit log says which replica wrote what (tests/support/audit.py); Volcano's real
    # scheduler runs for the gang tests and upstream's Volcano spec.
    up = [sys.executable, "-m", "hack.cluster", "up", "--audit-log", "--volcano"]
    result = subprocess.run(up, cwd=ROOT, check=False)
    # 3: the control plane is up but a real node is not; only the tests that need one fail
    # (the real_node fixture reports why).
    if result.returncode not in (0, 3):
        raise RuntimeError(
            "the local cluster did not start (see the [cluster] lines above and .cluster/logs/). "
            "Integration tests need a real API server: fix the cluster, or point "
            "MPIJOB_TEST_KUBECONFIG at one."
        )

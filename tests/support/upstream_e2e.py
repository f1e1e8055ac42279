"""Upstream's own end-to-end suite (kubeflow/mpi-operator ``test/e2e``) run against this operator.

The suite is compiled unmodified from the Go module proxy (``hack/build-bins.sh e2e``) and run
with ``USE_EXISTING_CLUSTER``, ``USE_EXISTING_OPERATOR``, ``USE_EXISTING_SCHEDULER_PLUGINS`` and
``USE_EXISTING_VOLCANO_SCHEDULER`` set, so it installs nothing itself. What it expects to find,
and what stands in for each here:

- **The operator as the Deployment ``mpi-operator/mpi-operator``**, which the gang-scheduling and
  cluster-domain specs scale to 0 and back to 1 with a flag appended to the container's args,
  waiting on ``status.availableReplicas``: the operator from its own image, installed as users
  install it with upstream's Deployment name (hack/incluster.py ``deploy --upstream-names``), so
  the kubelet of the real node runs each of those edits. The test module installs it.
- **scheduler-plugins' scheduler**, installed by upstream's suite as a second scheduler named
  ``scheduler-plugins-scheduler``: the same scheduler-plugins build the local cluster runs, started
  under that name with the Coscheduling profile of ``hack/cluster.py``.
- **Volcano's scheduler**: the real one, built from the Go module proxy and run by the test
  cluster with Volcano's own CRDs, scheduler configuration and queue controller
  (hack/volcano.py).
- **An update of the Deployment that cannot lose a race**: the suite reads the Deployment and
  updates it without retrying, right after the previous spec edited it, so the Deployment
  controller's status writes fail that update with 409 Conflict now and then.
  :class:`UnconditionalSpecUpdates` makes the suite's updates of it unconditional while it runs.
- **Real containers**: upstream's pi images on the real node (hack/realnode.py). The suite's pods
  select no node, so while it runs the simulated nodes are cordoned and the real node's taint is
  lifted (:func:`real_node_only`), and put back afterwards.

Results come from ginkgo's JUnit report (``-ginkgo.reportFile``): one line per spec.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import ssl
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from support.kube import ROOT, Cluster
from support.operator import free_port
from support.wait import wait_until

NAMESPACE = "mpi-operator"
DEPLOYMENT = "mpi-operator"
SCHED_PLUGINS_SCHEDULER = "scheduler-plugins-scheduler"
VOLCANO_SCHEDULER = "volcano"
REAL_NODE_ROLE = "mpijob.io/real-node"
IMAGE_REPO = "docker.io/mpioperator/mpi-pi"
# The images the suite's specs run (its defaults), by the words of the spec names that use them.
SPEC_IMAGES = {"Intel": "intel", "MPICH": "mpich"}
DEFAULT_IMAGE = "openmpi"


def _hack() -> Any:
    from hack import cluster as local

    return local


def suite_binary() -> Path:
    """The compiled suite, built by ``hack/build-bins.sh e2e`` when missing."""
    local = _hack()
    version = local.versions()["MPI_OPERATOR_VERSION"]
    path = local.cache_dir() / "bin" / f"mpi-operator-e2e-v{version}" / "e2e.test"
    if not path.exists():
        subprocess.run([str(ROOT / "hack" / "build-bins.sh"), "e2e"], check=True)
    return path


def _new_api(cluster: Cluster) -> client.ApiClient:
    """An API client of the thread's own (the suite's shared one is not made for threads)."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


# --- the suite's updates of the Deployment ----------------------------------------------------

WEBHOOK = "mpijob-e2e-unconditional-deployment-update"
WEBHOOK_PATH = "/unconditional"
# The Deployment as the webhook's objectSelector sees it: a label only the harness puts there.
WEBHOOK_LABEL = "mpijob.io/e2e-unconditional-update"
UNCONDITIONAL_PATCH = [{"op": "remove", "path": "/metadata/resourceVersion"}]


def unconditional_patch(request: dict[str, Any]) -> list[dict[str, str]] | None:
    """The JSONPatch that makes an update of the suite's Deployment unconditional, or None.

    Only the main resource of ``mpi-operator/mpi-operator``, only UPDATE, and only when the user
    is not one of the cluster's own (``system:``: the Deployment, ReplicaSet and garbage
    collector controllers), so the suite's spec edits are written whatever the Deployment's
    resourceVersion is now and every controller write stays conditional. A main-resource update
    never writes status, so what the suite waits on (``status.availableReplicas``) is still the
    controllers' alone. Metadata a controller wrote through status meanwhile (the revision
    annotation) goes back to what the suite read, and the Deployment controller sets it again at
    its next sync, as after any update without a resourceVersion.
    """
    user = (request.get("userInfo") or {}).get("username") or ""
    metadata = (request.get("object") or {}).get("metadata") or {}
    if (
        request.get("operation") == "UPDATE"
        and (request.get("kind") or {}).get("kind") == "Deployment"
        and not request.get("subResource")
        and request.get("namespace") == NAMESPACE
        and request.get("name") == DEPLOYMENT
        and not user.startswith("system:")
        and metadata.get("resourceVersion")
    ):
        return UNCONDITIONAL_PATCH
    return None


class _ReviewHandler(BaseHTTPRequestHandler):
    server: _WebhookServer

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        request = review.get("request") or {}
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
        patch = unconditional_patch(request)
        if patch is not None:
            response |= {
                "patchType": "JSONPatch",
                "patch": base64.b64encode(json.dumps(patch).encode()).decode("ascii"),
            }
            if not request.get("dryRun"):
                self.server.owner.unconditional += 1
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request on stderr would bury the test's output


class _WebhookServer(ThreadingHTTPServer):
    owner: UnconditionalSpecUpdates


class UnconditionalSpecUpdates:
    """The suite's own updates of the Deployment, made unconditional by a mutating webhook.

    The gang-scheduling and cluster-domain specs read the Deployment and update it without
    retrying (upstream's ``setupMPIOperator`` and their ``AfterEach``), right after the previous
    spec edited its args: the Deployment controller's status writes for that rollout, landing
    between the read and the update, fail the update with 409 Conflict now and then. Served here
    over HTTPS on loopback (the local cluster's API server runs on this machine) with a
    throwaway certificate, registered for UPDATE of that Deployment only, the webhook removes
    ``metadata.resourceVersion`` from the suite's updates (:func:`unconditional_patch`), which a
    Deployment allows: the update is then written over whatever the controllers wrote. Nothing
    about the operator changes. ``failurePolicy: Ignore``, so a configuration left behind by a
    killed test turns into no webhook at all instead of failing Deployment updates.
    """

    def __init__(self, cluster: Cluster, log_dir: Path) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.unconditional = 0
        self.server = _WebhookServer(("127.0.0.1", 0), _ReviewHandler)
        self.server.owner = self
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="unconditional-updates", daemon=True
        )

    def __enter__(self) -> UnconditionalSpecUpdates:
        from mpijob.platform.tls import serving_certificate

        cert_dir = self.log_dir / "unconditional-updates-certs"
        cert_dir.mkdir(exist_ok=True)
        url = f"https://127.0.0.1:{self.port}{WEBHOOK_PATH}"
        cert = serving_certificate(NAMESPACE, WEBHOOK, cert_dir, url=url)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert.certfile), str(cert.keyfile))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self._thread.start()
        try:
            self.cluster.kubectl(
                "label", "deployment", DEPLOYMENT, "-n", NAMESPACE, f"{WEBHOOK_LABEL}=true"
            )
            self.cluster.apply(self.configuration(url, cert.ca_bundle))
            wait_until(self.live, timeout=60, what=f"webhook {WEBHOOK} in the API server's path")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.cluster.kubectl(
                "delete", "mutatingwebhookconfiguration", WEBHOOK, "--ignore-not-found"
            )
            self.cluster.kubectl(
                "label", "deployment", DEPLOYMENT, "-n", NAMESPACE, f"{WEBHOOK_LABEL}-", check=False
            )
        finally:
            self.server.shutdown()
            self.server.server_close()

    @staticmethod
    def configuration(url: str, ca_bundle: str) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK},
            "webhooks": [
                {
                    "name": f"{WEBHOOK}.mpijob.io",
                    "clientConfig": {"url": url, "caBundle": ca_bundle},
                    "rules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["deployments"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
                    },
                    "objectSelector": {"matchLabels": {WEBHOOK_LABEL: "true"}},
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }

    def live(self) -> bool:
        """Whether the API server calls the webhook: an update (dry run) of the Deployment with a
        resourceVersion long gone is a 409 Conflict without it and is accepted with it."""
        apps = client.AppsV1Api(self.cluster.api)
        deployment = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
        assert deployment.metadata is not None
        deployment.metadata.resource_version = "1"
        try:
            apps.replace_namespaced_deployment(DEPLOYMENT, NAMESPACE, deployment, dry_run="All")
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True


# --- scheduler-plugins' scheduler ---------------------------------------------------------------


@contextlib.contextmanager
def sched_plugins_scheduler(cluster: Cluster, log_dir: Path) -> Iterator[None]:
    """The local cluster's scheduler-plugins build, as the second scheduler upstream's suite
    installs (``scheduler-plugins-scheduler``), with the cluster's Coscheduling profile."""
    local = _hack()
    config = yaml.safe_load(local.scheduler_config(cluster.kubeconfig))
    config["profiles"][0]["schedulerName"] = SCHED_PLUGINS_SCHEDULER
    path = log_dir / "scheduler-plugins-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [
        str(local.binaries()["kube-scheduler"]),
        f"--config={path}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={free_port()}",
        "--pod-max-in-unschedulable-pods-duration=10s",
    ]
    with (log_dir / "scheduler-plugins-scheduler.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- the real node ------------------------------------------------------------------------------


@contextlib.contextmanager
def real_node_only(cluster: Cluster, node: str) -> Iterator[None]:
    """While the suite runs, its pods (which select no node) can only land on the real node."""
    cluster.kubectl("cordon", "-l", "type=kwok")
    cluster.kubectl("taint", "node", node, f"{REAL_NODE_ROLE}:NoSchedule-")
    try:
        yield
    finally:
        cluster.kubectl("taint", "node", node, f"{REAL_NODE_ROLE}=true:NoSchedule", "--overwrite")
        cluster.kubectl("uncordon", "-l", "type=kwok")


def node_images(cluster: Cluster, node: str) -> set[str]:
    found = set()
    for image in cluster.core.read_node(node).status.images or []:
        found.update(image.names or [])
    return found


def missing_image(spec: str, images: set[str]) -> str | None:
    """The image a spec runs that the real node does not hold, if any."""
    flavour = next((f for word, f in SPEC_IMAGES.items() if f"with {word} " in spec), DEFAULT_IMAGE)
    image = f"{IMAGE_REPO}:{flavour}"
    return None if image in images else image


# --- running the suite and reading its report ----------------------------------------------------


@dataclass
class Spec:
    name: str
    outcome: str  # PASS, FAIL or SKIP
    seconds: float
    message: str = ""


def specs(binary: Path) -> list[str]:
    """The suite's spec names, from a dry run."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        subprocess.run(
            [str(binary), "-ginkgo.dryRun", f"-ginkgo.reportFile={report}", "-ginkgo.noColor"],
            capture_output=True,
            check=False,
            cwd=tmp,
        )
        return [s.name for s in read_report(report)]


def run_suite(
    binary: Path, cluster: Cluster, log_dir: Path, skip: list[str], timeout: float
) -> tuple[list[Spec], int, str]:
    """Run the suite; its specs from the JUnit report, its exit status and its log's path."""
    report = log_dir / "upstream-e2e.xml"
    log_path = log_dir / "upstream-e2e.log"
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "USE_EXISTING_CLUSTER": "true",
        "USE_EXISTING_OPERATOR": "true",
        "USE_EXISTING_SCHEDULER_PLUGINS": "true",
        "USE_EXISTING_VOLCANO_SCHEDULER": "true",
    }
    # No flake retries: every spec must pass on its first attempt.
    argv = [
        str(binary), "-test.v", "-ginkgo.v", "-ginkgo.noColor", f"-ginkgo.reportFile={report}",
    ]  # fmt: skip
    if skip:
        argv.append("-ginkgo.skip=" + "|".join(re.escape(s) for s in skip))
    with log_path.open("wb") as log:
        result = subprocess.run(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_dir,
            timeout=timeout,
            check=False,
        )
    return read_report(report), result.returncode, str(log_path)


def read_report(path: Path) -> list[Spec]:
    if not path.exists():
        return []
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name") or ""
        seconds = float(case.get("time") or 0)
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            text = (failure.get("message") or "") + "\n" + (failure.text or "")
            out.append(Spec(name, "FAIL", seconds, text.strip()))
        elif case.find("skipped") is not None:
            out.append(Spec(name, "SKIP", seconds))
        else:
            out.append(Spec(name, "PASS", seconds))
    return out  # a failed BeforeSuite or AfterSuite is a case of that name


def replica_sets(cluster: Cluster) -> list[str]:
    """The operator Deployment's ReplicaSets: one per pod template it has had."""
    apps = client.AppsV1Api(cluster.api)
    found = apps.list_namespaced_replica_set(NAMESPACE).items
    return sorted(
        rs.metadata.name
        for rs in found
        if any(
            o.kind == "Deployment" and o.name == DEPLOYMENT
            for o in rs.metadata.owner_references or []
        )
    )


def wait_available(cluster: Cluster, timeout: float = 120) -> None:
    apps = client.AppsV1Api(cluster.api)

    def available() -> bool:
        d = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
        return bool(d.status.available_replicas)

    wait_until(available, timeout=timeout, what=f"Deployment {NAMESPACE}/{DEPLOYMENT} available")


def elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.0f}s"

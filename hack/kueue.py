#!/usr/bin/env python3
"""Kueue beside the local control plane, on request (``KUEUE=1 make cluster``, the Kueue tests).

The Kueue manager (``hack/build-bins.sh kueue``, version pinned in ``hack/versions.env``) runs as
a plain process like the rest of ``hack/cluster.py``'s cluster, with what a Kueue install in a
cluster would have, arranged for loopback:

- its CRDs from the downloaded Go module, the conversion webhook of those served in two versions
  pointing at ``https://127.0.0.1:<port>/convert``;
- its mutating and validating webhooks for its own kinds and the enabled frameworks only
  (``batch/job``, ``kubeflow.org/mpijob``), by URL on the same port: no Service, no Secret;
- a CA and a serving certificate (127.0.0.1) made here, since its internal certificate
  management needs a Secret mounted into a pod; with it off, Kueue also insists on a metrics
  certificate at the fixed path ``/etc/kueue/metrics/certs`` (no flag or setting moves it), so
  Kueue runs in a mount namespace of its own whose ``/etc`` is the host's with an overlay from
  the cluster's folder holding that certificate: nothing is written to the host's ``/etc``;
- a ResourceFlavor per GPU model of the simulated nodes (its ``nodeLabels`` become the node
  selector Kueue puts into admitted jobs) and a ClusterQueue ``gpu`` whose GPU quota is every
  simulated GPU. A LocalQueue per namespace is the user's (or the test's) to create.

``stop`` takes it away again (the process and its webhook configurations; the CRDs stay), so a
cluster that ran Kueue for a while goes on as one without it.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from hack import common as local
from hack import tls

NAME = "kueue"
NAMESPACE = "kueue-system"
MODULE = "sigs.k8s.io/kueue"
FRAMEWORKS = {"batch/job": ("batch", "jobs"), "kubeflow.org/mpijob": ("kubeflow.org", "mpijobs")}
WEBHOOK_CONFIGS = (
    ("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration"),
    ("ValidatingWebhookConfiguration", "kueue-validating-webhook-configuration"),
)
# Where Kueue reads its metrics certificate when its own certificate management is off.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
CLUSTER_QUEUE = "gpu"
GPU = "nvidia.com/gpu"
MODEL_LABEL = "mpijob.io/gpu-model"


def version() -> str:
    return local.versions()["KUEUE_VERSION"]


def binary() -> Path:
    return local.cache_dir() / "bin" / f"kueue-v{version()}" / "kueue"


def home() -> Path:
    return local.state_dir() / "kueue"


def module_dir() -> Path:
    return local.go_module_dir(
        f"{MODULE}@v{version()}", "its CRDs and webhook manifests", who="kueue"
    )


# --- certificates ---------------------------------------------------------------------------------


def write_certs() -> bytes:
    """The webhook CA and serving pair under ``.cluster/kueue/certs``, and the metrics pair in
    the overlay of ``/etc`` Kueue runs with (:func:`command`); returns the CA in PEM."""
    ca = tls.certificate("mpijob-local-kueue-ca", usage="ca", days=3650)
    serving = tls.certificate("127.0.0.1", issuer=ca, usage="server", names=tls.LOOPBACK)
    certs = home() / "certs"
    serving.write(certs / "tls.crt", certs / "tls.key")
    (certs / "ca.crt").write_bytes(ca.cert_pem)
    # Nothing scrapes it here: self-signed does.
    metrics = tls.certificate("kueue-metrics", usage="server", names=tls.LOOPBACK, days=3650)
    folder = etc_overlay() / "upper" / METRICS_CERTS.relative_to("/etc")
    metrics.write(folder / "tls.crt", folder / "tls.key")
    return ca.cert_pem


def etc_overlay() -> Path:
    return home() / "etc"


def command(argv: list[str]) -> list[str]:
    """``argv`` in a private mount namespace whose ``/etc`` is the host's with the overlay's
    files (the metrics certificate) on top; the overlay's writes stay in the cluster's folder.
    As root a mount namespace; otherwise a user namespace maps this user to root inside it."""
    overlay = etc_overlay()
    (overlay / "work").mkdir(parents=True, exist_ok=True)
    options = f"lowerdir=/etc,upperdir={overlay / 'upper'},workdir={overlay / 'work'}"
    namespaces = ["--mount"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount"]
    mount = f'mount -t overlay overlay -o {options} /etc && exec "$@"'
    return ["unshare", *namespaces, "--propagation", "private", "sh", "-c", mount, "kueue", *argv]


# --- manifests ------------------------------------------------------------------------------------


def crds(mod: Path, port: int, ca: bytes) -> list[dict[str, Any]]:
    out = []
    for path in sorted((mod / "config/components/crd/bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        # A kind served in two versions (v1beta1 and v1beta2 from Kueue v0.15 on) is converted
        # by the API server through Kueue's webhook.
        if len(crd["spec"]["versions"]) > 1:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/convert",
                        "caBundle": base64.b64encode(ca).decode(),
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def _wanted(webhook: dict[str, Any]) -> bool:
    """Kueue's own kinds, and the frameworks it is told to manage; no other kind is held up
    by a Kueue that is slow or stopped."""
    targets = {
        (g, r) for rule in webhook["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    return any(g == "kueue.x-k8s.io" for g, _ in targets) or bool(
        targets & set(FRAMEWORKS.values())
    )


def webhook_configs(mod: Path, port: int, ca: bytes) -> list[dict[str, Any]]:
    docs = [
        d
        for d in yaml.safe_load_all((mod / "config/components/webhook/manifests.yaml").read_text())
        if d
    ]
    out = []
    for doc in docs:
        kind = doc["kind"]
        name = dict(WEBHOOK_CONFIGS)[kind]
        hooks = []
        for hook in doc["webhooks"]:
            if not _wanted(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            hook["timeoutSeconds"] = 10
            hooks.append(hook)
        out.append({**doc, "metadata": {"name": name}, "webhooks": hooks})
    return out


def config(state: local.State) -> dict[str, Any]:
    p = state.ports
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {
            "host": "127.0.0.1",
            "port": p["kueue-webhook"],
            "certDir": str(home() / "certs"),
        },
        "metrics": {"bindAddress": f"127.0.0.1:{p['kueue-metrics']}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue-health']}"},
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        # The on-demand visibility API server (pending workloads) reads its certificate from the
        # fixed path /visibility when Kueue's own certificate management is off; nothing here
        # uses it.
        "featureGates": {"VisibilityOnDemand": False},
    }


def flavors_and_queue(state: local.State) -> list[dict[str, Any]]:
    """A ResourceFlavor per GPU model among the simulated nodes, and the ClusterQueue ``gpu``
    lending every simulated GPU (CPU and memory are not what this cluster rations)."""
    nodes = json.loads(local.kubectl(state, "get", "nodes", "-o", "json"))["items"]
    gpus: dict[str, int] = {}
    for node in nodes:
        model = node["metadata"].get("labels", {}).get(MODEL_LABEL)
        if model:
            gpus[model] = gpus.get(model, 0) + int(node["status"]["allocatable"].get(GPU, "0"))
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": model},
            "spec": {"nodeLabels": {MODEL_LABEL: model}},
        }
        for model in sorted(gpus)
    ]
    docs.append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [
                            {
                                "name": model,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100000"},
                                    {"name": "memory", "nominalQuota": "100000Ti"},
                                    {"name": GPU, "nominalQuota": str(count)},
                                ],
                            }
                            for model, count in sorted(gpus.items())
                        ],
                    }
                ],
            },
        }
    )
    return docs


# --- process --------------------------------------------------------------------------------------


def _ready(state: local.State) -> bool:
    url = f"http://127.0.0.1:{state.ports['kueue-health']}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def running(state: local.State) -> bool:
    return local.alive(state.pids.get(NAME, -1)) and _ready(state)


def ensure(state: local.State) -> None:
    """Kueue running against the cluster of ``state``; harmless when it already is."""
    if running(state):
        local.say(f"kueue {version()} already running")
        _apply(state, flavors_and_queue(state))
        return
    t0 = time.monotonic()
    stop(state, quiet=True)
    if not binary().exists():
        local.say(f"kueue {version()} missing; building it (hack/build-bins.sh kueue)")
        subprocess.run([str(local.HACK / "build-bins.sh"), "kueue"], check=True)
    mod = module_dir()
    home().mkdir(parents=True, exist_ok=True)
    ca = write_certs()
    for port in ("kueue-webhook", "kueue-metrics", "kueue-health"):
        state.ports[port] = local.free_port()
    state.save()
    port = state.ports["kueue-webhook"]

    _apply(state, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    definitions = crds(mod, port, ca)
    _apply(state, definitions)
    local.wait_established(state, [f"crd/{c['metadata']['name']}" for c in definitions])
    (home() / "config.yaml").write_text(yaml.safe_dump(config(state)))
    local.start(
        NAME,
        command(
            [
                str(binary()),
                f"--config={home() / 'config.yaml'}",
                f"--kubeconfig={local.state_dir() / 'kubeconfig'}",
                "--zap-log-level=info",
            ]
        ),
        state,
    )

    def ready() -> bool:
        if not local.alive(state.pids[NAME]):
            local.wait_for(f"kueue (exited; {home() / 'config.yaml'})", lambda: False, 0, NAME)
        return _ready(state)

    local.wait_for("kueue /readyz", ready, 120, NAME)
    # Registered once Kueue serves them: a webhook nobody answers would fail every request.
    _apply(state, webhook_configs(mod, port, ca))
    _apply(state, flavors_and_queue(state))
    local.say(f"kueue {version()} up in {time.monotonic() - t0:.1f}s (logs/{NAME}.log)")


def _apply(state: local.State, docs: list[dict[str, Any]]) -> None:
    local.kubectl(
        state,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=mpijob-local-cluster",
        "-f",
        "-",
        input=yaml.safe_dump_all(docs),
    )


def stop(state: local.State, quiet: bool = False) -> None:
    """Stop the Kueue process and remove its webhook configurations (its CRDs and objects stay)."""
    pid = state.pids.pop(NAME, None)
    if pid and local.alive(pid):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and local.alive(pid):
            time.sleep(0.1)
        if local.alive(pid):
            os.killpg(pid, signal.SIGKILL)
    for port in ("kueue-webhook", "kueue-metrics", "kueue-health"):
        state.ports.pop(port, None)
    state.save()
    if (local.state_dir() / "kubeconfig").exists() and local.healthy(state):
        for kind, name in WEBHOOK_CONFIGS:
            local.kubectl(state, "delete", kind.lower(), name, "--ignore-not-found")
    if not quiet:
        local.say("kueue stopped")


def main() -> int:
    usage = "usage: python -m hack.kueue up|down  (the local cluster must be running: make cluster)"
    if len(sys.argv) != 2 or sys.argv[1] not in ("up", "down"):
        print(usage, file=sys.stderr)
        return 2
    state = local.State.load()
    if state is None or not local.healthy(state):
        raise SystemExit("[kueue] error: no local cluster running; start it with `make cluster`")
    if sys.argv[1] == "up":
        ensure(state)
    else:
        stop(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The operator installed in the local cluster as users install it: its image on the real nodes.

``deploy`` applies one of manifests/overlays (``standalone``, ``monitoring``, ``fractional-gpus``
...), or the single-file install ``deploy/mpi-operator.yaml``, with
``kubectl apply --server-side -k``, through a kustomization generated under
``.cluster/install/`` that adds, on top of the overlay:

- the component ``manifests/components/local-cluster``: the operator and the agent on the real
  nodes (hack/realnode.py), the ServiceAccount token volume (the local API server runs without
  the admission plugin that adds it), the agent on its simulated NVML;
- the image hack/operator_image.py built, under its recipe's tag (``mpijob.local/
  mpijob-operator:<digest>``), imported into every real node's containerd first;
- what only the running cluster knows: a host alias that sends ``kubernetes.default.svc`` to the
  bridge's address, where hack/relay.py passes port 443 on to the API server (there is no
  kube-proxy: the ``kubernetes`` Service's IP leads nowhere); the agent's pod-resources folder,
  the real kubelet's;
- optionally: replicas, ``--namespace`` flags (tests keep the operator to their namespaces), and
  the component ``manifests/components/upstream-names``, which names the Deployment
  ``mpi-operator`` as upstream's install does (upstream's e2e suite waits for
  Deployment ``mpi-operator/mpi-operator``).

The API server reaches the GPU-share webhooks through their Service: it runs with
``--enable-aggregator-routing``, which makes it call a Service's endpoint (the pod's address on
the bridge) rather than its cluster IP.

The Helm chart (charts/mpijob-operator) installs the same way: :func:`helm` runs ``helm install``
or ``upgrade`` with the image's name as values and ``hack/helm-post-render`` as Helm's post
renderer, which adds the same local-cluster parts to what the chart renders (:func:`post_render`).

Usage:
  hack/incluster.py deploy [--overlay standalone] [--replicas N] [--upstream-names]
                           [--namespace NS ...]
  hack/incluster.py undeploy
  hack/incluster.py render [same flags as deploy]    # the manifests, without applying them
  hack/incluster.py post-render < manifests          # Helm's post renderer (hack/helm-post-render)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack import cluster, operator_image, realnode, tls

HACK = Path(__file__).resolve().parent
ROOT = HACK.parent
OVERLAYS = ROOT / "manifests" / "overlays"
COMPONENTS = ROOT / "manifests" / "components"
NAMESPACE = "mpi-operator"
#: The fractional-gpus overlay's webhook Service; its Secret and ConfigMap are named after it.
WEBHOOK_SERVICE = "mpijob-operator-webhook"
OPERATOR = "mpijob-operator"
UPSTREAM_NAME = "mpi-operator"
GPU_PRESENT = "nvidia.com/gpu.present"
TOPOLOGY_ANNOTATION = "mpijob.io/gpu-topology"
WEBHOOK_CONFIGURATION = "mpijob-gpu-share"
SINGLE_FILE = ROOT / "deploy" / "mpi-operator.yaml"
MONITORING_CRDS = HACK / "crds" / "prometheus-operator-minimal.yaml"
SELECT_OPERATOR = {"kind": "Deployment", "labelSelector": "app.kubernetes.io/component=operator"}
SELECT_AGENT = {"kind": "DaemonSet", "name": "mpijob-agent"}


def say(msg: str) -> None:
    print(f"[incluster] {msg}", file=sys.stderr, flush=True)


@dataclass
class Install:
    """What ``deploy`` applied: where to find the operator."""

    overlay: str
    namespace: str
    deployment: str
    image: str
    kustomization: Path


def kubectl(*args: str, input: str | None = None, check: bool = True) -> str:
    argv = [str(cluster.binaries()["kubectl"]), "--kubeconfig", str(kubeconfig()), *args]
    out = subprocess.run(argv, capture_output=True, text=True, input=input, check=False)
    if check and out.returncode != 0:
        raise SystemExit(f"[incluster] error: kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def kubeconfig() -> Path:
    return Path(os.environ.get("KUBECONFIG") or cluster.state_dir() / "kubeconfig")


def nodes() -> realnode.NodeState:
    st = realnode.NodeState.load(cluster.state_dir())
    if st is None or not realnode.healthy(st):
        raise SystemExit(
            "[incluster] error: the local cluster has no running real node; start it with "
            "`make cluster` (REAL_NODES=1, the default)"
        )
    return st


def json_patch(ops: list[dict[str, Any]]) -> str:
    return yaml.safe_dump(ops, default_flow_style=None, width=200)


def kustomization(
    resource: str,
    st: realnode.NodeState,
    dest: Path,
    *,
    image: str,
    replicas: int | None,
    upstream_names: bool,
    namespaces: tuple[str, ...],
) -> dict[str, Any]:
    """The generated kustomization (``dest`` is its folder, for the relative paths)."""
    name, tag = image.rsplit(":", 1)
    alias = {"ip": st.gateway, "hostnames": ["kubernetes.default.svc"]}
    # The official client (the agent) reads these; Kopf (the operator) connects to
    # https://kubernetes.default.svc whatever they say.
    api_env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "kubernetes.default.svc"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(realnode.APISERVER_PORT)},
    ]
    operator_ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/template/spec/hostAliases", "value": [alias]},
        *({"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": e}
          for e in api_env),
        *({"op": "add", "path": "/spec/template/spec/containers/0/args/-",
           "value": f"--namespace={ns}"} for ns in namespaces),
    ]  # fmt: skip
    agent_ops: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/template/spec/hostAliases", "value": [alias]},
        *({"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": e}
          for e in api_env),
    ]  # fmt: skip
    if st.count == 1:
        # The kubelet's --root-dir is the real node's own folder, its socket there.
        folder = cluster.state_dir() / "realnode" / "node-0" / "kubelet" / "pod-resources"
        agent_ops.append(
            {"op": "replace", "path": "/spec/template/spec/volumes/0/hostPath/path",
             "value": str(folder)}
        )  # fmt: skip
    else:
        # One DaemonSet cannot mount each node's own folder: no check on several real nodes.
        agent_ops.append(
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": "--no-check-pods"}
        )  # fmt: skip
    components = [COMPONENTS / "local-cluster"]
    if upstream_names:
        components.append(COMPONENTS / "upstream-names")
    out: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [resource],
        "components": [os.path.relpath(c, dest) for c in components],
        "images": [{"name": OPERATOR, "newName": name, "newTag": tag}],
        "patches": [
            {"target": SELECT_OPERATOR, "patch": json_patch(operator_ops)},
            {"target": SELECT_AGENT, "patch": json_patch(agent_ops)},
        ],
    }
    if replicas is not None:
        deployment = UPSTREAM_NAME if upstream_names else OPERATOR
        out["replicas"] = [{"name": deployment, "count": replicas}]
    return out


def write(
    overlay: str,
    *,
    image: str,
    replicas: int | None = None,
    upstream_names: bool = False,
    namespaces: tuple[str, ...] = (),
) -> Path:
    dest = cluster.state_dir() / "install" / (overlay + ("-upstream" if upstream_names else ""))
    dest.mkdir(parents=True, exist_ok=True)
    if overlay == SINGLE_FILE.name:
        # kustomize reads files only below the kustomization: a copy, named as the original.
        shutil.copy2(SINGLE_FILE, dest / SINGLE_FILE.name)
        resource = SINGLE_FILE.name
    elif (OVERLAYS / overlay / "kustomization.yaml").exists():
        resource = os.path.relpath(OVERLAYS / overlay, dest)
    else:
        known = sorted(p.name for p in OVERLAYS.iterdir())
        raise SystemExit(
            f"[incluster] error: no overlay {overlay!r}; choose from {known} or "
            f"{SINGLE_FILE.name} (the single-file install)"
        )
    body = kustomization(
        resource,
        nodes(),
        dest,
        image=image,
        replicas=replicas,
        upstream_names=upstream_names,
        namespaces=namespaces,
    )
    header = "# Generated by hack/incluster.py for this cluster; not for editing.\n"
    (dest / "kustomization.yaml").write_text(header + yaml.safe_dump(body, sort_keys=False))
    return dest


def load_image(st: realnode.NodeState) -> str:
    """Builds the image if its recipe changed and imports it into every real node; its name."""
    archive = operator_image.ensure()
    for i in range(st.count):
        sock = cluster.state_dir() / "realnode" / f"node-{i}" / "containerd.sock"
        ctr = ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
        operator_image.import_into(ctr, archive)
    return operator_image.reference(operator_image.digest_of(archive))


def retag(image: str, tag: str) -> str:
    """The image under another tag on every real node (a new release of the same bits)."""
    st = nodes()
    new = f"{image.rsplit(':', 1)[0]}:{tag}"
    for i in range(st.count):
        sock = cluster.state_dir() / "realnode" / f"node-{i}" / "containerd.sock"
        subprocess.run(
            ["ctr", "--address", str(sock), "--namespace", "k8s.io",
             "images", "tag", "--force", image, new],
            check=True, capture_output=True,
        )  # fmt: skip
    return new


def webhook_keys() -> None:
    """What the fractional-gpus overlay asks of a cluster admin: the webhooks' serving certificate
    (a Secret every replica mounts) and the CA of the API server's webhook client certificate
    (a ConfigMap; hack/cluster.py made both the CA and the API server's admission configuration).
    The operator's pods wait for them (ContainerCreating) and start once they exist."""
    names = tls.service_names(NAMESPACE, WEBHOOK_SERVICE)
    serving = tls.certificate(names[-1], usage="server", names=names)
    with tempfile.TemporaryDirectory() as folder:
        certfile, keyfile = Path(folder) / "tls.crt", Path(folder) / "tls.key"
        serving.write(certfile, keyfile)
        secret = kubectl(
            "create", "secret", "tls", f"{WEBHOOK_SERVICE}-tls", "-n", NAMESPACE,
            f"--cert={certfile}", f"--key={keyfile}", "--dry-run=client", "-o", "yaml",
        )  # fmt: skip
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=secret)
    ca = cluster.state_dir() / "pki" / cluster.WEBHOOK_CLIENT_CA
    config_map = kubectl(
        "create", "configmap", f"{WEBHOOK_SERVICE}-client-ca", "-n", NAMESPACE,
        f"--from-file=ca.crt={ca}", "--dry-run=client", "-o", "yaml",
    )  # fmt: skip
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=config_map)


def deploy(
    overlay: str = "standalone",
    *,
    replicas: int | None = None,
    upstream_names: bool = False,
    namespaces: tuple[str, ...] = (),
    image: str | None = None,
    wait: bool = True,
    timeout: float = 300,
) -> Install:
    """Applies the overlay on the local cluster and (``wait``) waits for the operator's rollout
    and the agent's. ``image`` (a reference the real nodes hold) replaces the built one."""
    st = nodes()
    image = image or load_image(st)
    for i in range(st.count):
        kubectl("label", "node", realnode.node_name(i), f"{GPU_PRESENT}=true", "--overwrite")
    if overlay == "monitoring":
        kubectl("apply", "--server-side", "-f", str(MONITORING_CRDS))
        kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        )
    dest = write(
        overlay,
        image=image,
        replicas=replicas,
        upstream_names=upstream_names,
        namespaces=namespaces,
    )
    kubectl("apply", "--server-side", "--force-conflicts", "-k", str(dest))
    if overlay == "fractional-gpus":
        webhook_keys()
    install = Install(
        overlay=overlay,
        namespace=NAMESPACE,
        deployment=UPSTREAM_NAME if upstream_names else OPERATOR,
        image=image,
        kustomization=dest,
    )
    if wait:
        t0 = time.monotonic()
        for what in (f"deployment/{install.deployment}", "daemonset/mpijob-agent"):
            kubectl("rollout", "status", what, "-n", NAMESPACE, f"--timeout={int(timeout)}s")
        say(
            f"{overlay}: deployment/{install.deployment} ({image}) and daemonset/mpijob-agent "
            f"rolled out in {time.monotonic() - t0:.1f}s"
        )
    return install


def undeploy() -> None:
    """Removes what runs (the operator under either name, the agents, the webhook
    configurations the operator applied and their RBAC, its Lease); the CRDs, the base's RBAC
    and the namespace stay, and so does every MPIJob."""
    kubectl(
        "delete", "deployment,daemonset", "-n", NAMESPACE,
        "-l", "app.kubernetes.io/part-of=mpijob-operator", "--ignore-not-found", "--wait=true",
    )  # fmt: skip
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        kubectl("delete", kind, WEBHOOK_CONFIGURATION, "--ignore-not-found")
    # The fractional-gpus overlay's grant: the account keeps exactly the base's rights (which
    # tests/integration/test_install.py compares with the RBAC file).
    kubectl(
        "delete", "clusterrolebinding,clusterrole", "mpijob-operator-webhooks", "--ignore-not-found"
    )
    # Its share-records policy too: later tests see the cluster without it.
    kubectl(
        "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
        "mpijob-gpu-share-records", "--ignore-not-found",
    )  # fmt: skip
    # The pods carry only their workload's labels; none left is not an error.
    kubectl(
        "wait", "--for=delete", "pod", "-n", NAMESPACE, "--timeout=120s",
        "-l", "app.kubernetes.io/name in (mpijob-operator,mpijob-agent)", check=False,
    )  # fmt: skip
    kubectl("delete", "lease", OPERATOR, "-n", NAMESPACE, "--ignore-not-found")
    kubectl(
        "delete", "-n", NAMESPACE, f"secret/{WEBHOOK_SERVICE}-tls",
        f"configmap/{WEBHOOK_SERVICE}-client-ca", "--ignore-not-found",
    )  # fmt: skip
    # The real nodes as they were: no GPU label, no topology from the simulated agent.
    st = realnode.NodeState.load(cluster.state_dir())
    for i in range(st.count if st else 0):
        node = realnode.node_name(i)
        kubectl("label", "node", node, f"{GPU_PRESENT}-", check=False)
        kubectl("annotate", "node", node, f"{TOPOLOGY_ANNOTATION}-", check=False)


CHART = ROOT / "charts" / "mpijob-operator"
POST_RENDERER = HACK / "helm-post-render"
RELEASE = "mpijob-operator"


def post_render(manifests: str) -> str:
    """What the chart rendered, with this cluster's parts added as :func:`deploy` adds them to an
    overlay (the image is the chart's values' already)."""
    dest = cluster.state_dir() / "install" / "helm"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "chart.yaml").write_text(manifests)
    body = kustomization(
        "chart.yaml",
        nodes(),
        dest,
        image=operator_image.reference(),
        replicas=None,
        upstream_names=False,
        namespaces=(),
    )
    (dest / "kustomization.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return kubectl("kustomize", str(dest))


def helm(*args: str, check: bool = True) -> str:
    """The pinned helm against this cluster; its output."""
    from hack import gen_chart

    argv = [gen_chart.helm(), "--kubeconfig", str(kubeconfig()), *args]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
    if check and out.returncode != 0:
        raise SystemExit(f"[incluster] error: helm {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout + out.stderr


def helm_install(
    *values: str, verb: str = "install", image: str | None = None, timeout: float = 300
) -> str:
    """``helm install`` (or ``upgrade``) of the chart as release ``mpijob-operator`` in
    ``mpi-operator``, the image on the real nodes, ``values`` as ``--set`` pairs; waits for the
    rollout. Helm's output (the chart's NOTES)."""
    st = nodes()
    image = image or load_image(st)
    for i in range(st.count):
        kubectl("label", "node", realnode.node_name(i), f"{GPU_PRESENT}=true", "--overwrite")
    name, tag = image.rsplit(":", 1)
    sets = [f"image.repository={name}", f"image.tag={tag}", *values]
    t0 = time.monotonic()
    out = helm(
        verb, RELEASE, str(CHART), "--namespace", NAMESPACE,
        *(["--create-namespace"] if verb == "install" else []),
        *(a for pair in sets for a in ("--set", pair)),
        "--post-renderer", str(POST_RENDERER),
        "--wait", f"--timeout={int(timeout)}s",
    )  # fmt: skip
    say(f"helm {verb}: {image} rolled out in {time.monotonic() - t0:.1f}s")
    return out


def render(overlay: str, **kw: Any) -> str:
    dest = write(overlay, image=operator_image.reference(), **kw)
    return kubectl("kustomize", str(dest))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("deploy", "render"):
        p = sub.add_parser(name)
        p.add_argument("--overlay", default="standalone")
        p.add_argument("--replicas", type=int)
        p.add_argument("--upstream-names", action="store_true")
        p.add_argument("--namespace", dest="namespaces", action="append", default=[])
    sub.add_parser("undeploy")
    sub.add_parser("post-render")
    args = parser.parse_args()
    if args.cmd == "undeploy":
        undeploy()
        return 0
    if args.cmd == "post-render":
        sys.stdout.write(post_render(sys.stdin.read()))
        return 0
    kw = {
        "replicas": args.replicas,
        "upstream_names": args.upstream_names,
        "namespaces": tuple(args.namespaces),
    }
    if args.cmd == "render":
        print(render(args.overlay, **kw))
    else:
        install = deploy(args.overlay, **kw)
        print(json.dumps({k: str(v) for k, v in vars(install).items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A real local Kubernetes control plane with simulated GPU nodes, bound to 127.0.0.1 only.

Runs etcd, kube-apiserver, kube-controller-manager, the scheduler-plugins scheduler (Coscheduling
as the default scheduler), the scheduler-plugins PodGroup controller and the kwok controller as
plain processes, from binaries that ``hack/build-bins.sh`` builds into a cache outside the repo,
plus ``--real-nodes`` (env ``REAL_NODES``, default 2) real nodes that run real containers
(hack/realnode.py). State lives in ``.cluster/`` (kubeconfig, logs, pids); ``up`` twice is
harmless, ``down`` leaves no process, mount, veth or cgroup behind.

Used by ``make cluster``/``make cluster-down``/``make demo`` and by the test fixtures. With
``--kueue`` (``KUEUE=1 make cluster``) Kueue runs beside it (``hack/kueue.py``), with ``--volcano``
(``VOLCANO=1``) Volcano's scheduler and controllers (``hack/volcano.py``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack import dra, images, realnode, tls, volcano
from hack import kueue as queueing
from hack.common import (
    COMPONENTS,
    HACK,
    TOKEN,
    State,
    alive,
    binaries,
    cache_dir,
    free_port,
    get,
    go_module_dir,
    healthy,
    kubectl,
    say,
    server_url,
    stages_digest,
    start,
    state_dir,
    versions,
    wait_established,
    wait_for,
)

# The shared names (hack/common.py) are here too: the tests, benchmarks and other tools read the
# cluster through this module.
__all__ = [
    "DEFAULT_TOPOLOGY",
    "HACK",
    "NODE_PREFIX",
    "OPT_IN_LABEL",
    "TOKEN",
    "TOPOLOGY_ANNOTATION",
    "WEBHOOK_CLIENT_CA",
    "Components",
    "State",
    "alive",
    "audit_args",
    "audit_policy",
    "binaries",
    "cache_dir",
    "default_real_nodes",
    "down",
    "ensure_binaries",
    "ensure_control_plane",
    "ensure_dra",
    "ensure_kueue",
    "ensure_nodes",
    "ensure_real_nodes",
    "get",
    "healthy",
    "install_crds",
    "kubeconfig_text",
    "kubectl",
    "main",
    "new_state",
    "node_manifest",
    "restart_reason",
    "rss_mb",
    "running_cluster",
    "scheduler_config",
    "server_url",
    "start",
    "start_apiserver",
    "start_controllers",
    "start_etcd",
    "start_kwok",
    "state_dir",
    "status",
    "stop_demo_operator",
    "third_party_crds",
    "topology_annotation",
    "up",
    "user_token",
    "versions",
    "wait_for",
    "write_kubeconfigs",
    "write_pki",
    "write_user_kubeconfigs",
    "write_webhook_client",
]

DEFAULT_TOPOLOGY = "dgx1-v100"
NODE_PREFIX = "gpu-node-"
OPT_IN_LABEL = "ack.node.gpu.schedule"
TOPOLOGY_ANNOTATION = "mpijob.io/gpu-topology"


def user_token(user: str) -> str:
    return f"{TOKEN}-{user}"


def write_pki(pki: Path, users: Sequence[str] = ()) -> None:
    tls.write_signing_key(pki / "sa.key", pki / "sa.pub")
    # Extra users are admins too, with their own names, so audit events tell their clients apart.
    lines = [f'{TOKEN},admin,admin,"system:masters"']
    lines += [f'{user_token(u)},{u},{u},"system:masters"' for u in users]
    (pki / "tokens.csv").write_text("\n".join(lines) + "\n")


#: Files of the API server's webhook client identity (under pki/): the CA an operator is given
#: (``--webhook-client-ca``) and the certificate the API server presents to admission webhooks.
WEBHOOK_CLIENT_CA = "webhook-client-ca.crt"


def write_webhook_client(pki: Path) -> list[str]:
    """A CA of its own and the API server's client certificate for admission webhooks, presented
    through its admission configuration; the kube-apiserver flags that load it.

    The GPU-share webhooks answer only a client whose certificate this CA signed
    (docs/trust-gpu-shares.md), so a pod that POSTs an AdmissionReview to them is refused at TLS.
    Every webhook gets the certificate (``*``); one that asks for none ignores it.
    """
    ca = tls.certificate("mpijob-local-webhook-client-ca", usage="ca")
    client = tls.certificate("kube-apiserver", issuer=ca, usage="client")
    (pki / WEBHOOK_CLIENT_CA).write_bytes(ca.cert_pem)
    client.write(pki / "webhook-client.crt", pki / "webhook-client.key")
    (pki / "admission-kubeconfig.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [
                    {
                        "name": "*",
                        "user": {
                            "client-certificate": str(pki / "webhook-client.crt"),
                            "client-key": str(pki / "webhook-client.key"),
                        },
                    }
                ],
            }
        )
    )
    webhook = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(pki / "admission-kubeconfig.yaml"),
    }
    (pki / "admission-config.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": name, "configuration": webhook}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
                ],
            }
        )
    )
    return [f"--admission-control-config-file={pki / 'admission-config.yaml'}"]


def audit_policy() -> str:
    """Every request once, at Metadata level (who, verb, resource; no bodies)."""
    return yaml.safe_dump(
        {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata"}],
        }
    )


def audit_args(audit_log: bool) -> list[str]:
    """kube-apiserver flags for the audit log (none without it); a fresh log per start."""
    sd = state_dir()
    (sd / "logs" / "audit.log").unlink(missing_ok=True)
    if not audit_log:
        (sd / "audit-policy.yaml").unlink(missing_ok=True)
        return []
    (sd / "logs").mkdir(parents=True, exist_ok=True)
    (sd / "audit-policy.yaml").write_text(audit_policy())
    return [
        f"--audit-policy-file={sd / 'audit-policy.yaml'}",
        f"--audit-log-path={sd / 'logs' / 'audit.log'}",
        "--audit-log-format=json",
        # Written before the response returns, so a count read afterwards is complete.
        "--audit-log-mode=blocking",
    ]


def write_user_kubeconfigs(state: State, users: Sequence[str]) -> None:
    for user in users:
        path = state_dir() / f"kubeconfig-{user}"
        path.write_text(kubeconfig_text(state, user_token(user), user))
        path.chmod(0o600)


def kubeconfig_text(state: State, token: str = TOKEN, user: str = "admin") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "mpijob-local",
                    "cluster": {
                        "server": server_url(state),
                        # The apiserver's self-signed serving certificate is its own CA.
                        "certificate-authority-data": base64.b64encode(
                            (state_dir() / "pki" / "apiserver.crt").read_bytes()
                        ).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "mpijob-local", "context": {"cluster": "mpijob-local", "user": user}}
            ],
            "current-context": "mpijob-local",
        }
    )


def scheduler_config(kubeconfig: Path) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 200, "burst": 400},
            "profiles": [
                {
                    "schedulerName": "default-scheduler",
                    "plugins": {
                        "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                        "queueSort": {
                            "enabled": [{"name": "Coscheduling"}],
                            "disabled": [{"name": "*"}],
                        },
                    },
                    "pluginConfig": [
                        {
                            "name": "Coscheduling",
                            "args": {"permitWaitingTimeSeconds": 10, "podGroupBackoffSeconds": 1},
                        }
                    ],
                }
            ],
        }
    )


def third_party_crds() -> list[Path]:
    """CRD manifests shipped inside the upstream Go modules (downloaded, never copied in-repo)."""
    v = versions()
    sp = go_module_dir(f"sigs.k8s.io/scheduler-plugins@v{v['SCHED_PLUGINS_VERSION']}", "its CRDs")
    return [
        # PodGroup (manifests/crds/ holds symlinks, which a module zip leaves out).
        sp / "manifests/coscheduling/crd.yaml",
        # ElasticQuota, which the PodGroup controller also watches.
        sp / "manifests/capacityscheduling/crd.yaml",
        # Volcano's PodGroup, so --gang-scheduling volcano finds its kind with or without
        # Volcano's scheduler running (hack/volcano.py applies the rest of its CRDs).
        *volcano.crd_files((volcano.PODGROUP_CRD,)),
    ]


def topology_annotation(name: str, node: str) -> str:
    """The node's GPU topology as the agent would publish it (with stable made-up UUIDs)."""
    from mpijob.placement import codec, topologies

    return codec.dumps(topologies.for_node(name, node))


def node_manifest(index: int, topology: str, gpus: int) -> dict[str, Any]:
    name = f"{NODE_PREFIX}{index}"
    resources = {
        "cpu": "96",
        "memory": "768Gi",
        "pods": "110",
        "nvidia.com/gpu": str(gpus),
        "ephemeral-storage": "1Ti",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                OPT_IN_LABEL: "topology",
                "mpijob.io/gpu-model": topology,
            },
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
                TOPOLOGY_ANNOTATION: topology_annotation(topology, name),
            },
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": resources},
    }


def ensure_nodes(state: State, count: int, topology: str, gpus: int) -> None:
    existing = set(kubectl(state, "get", "nodes", "-o", "name").split())
    wanted = [node_manifest(i, topology, gpus) for i in range(count)]
    missing = [n for n in wanted if f"node/{n['metadata']['name']}" not in existing]
    if missing:
        say(f"creating {len(missing)} simulated {topology} nodes ({gpus} GPUs each)")
        for chunk in range(0, len(missing), 50):
            kubectl(
                state, "create", "-f", "-", input=yaml.safe_dump_all(missing[chunk : chunk + 50])
            )

    def ready() -> bool:
        out = kubectl(
            state,
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
        )
        return out.split().count("True") >= count

    wait_for(f"{count} nodes Ready", ready, 120, "kwok")


def default_real_nodes() -> int:
    return int(os.environ.get("REAL_NODES") or "2")


@dataclass(frozen=True)
class Components:
    """What runs beside the control plane and the simulated nodes; each one optional.

    ``dra``: the simulated NVIDIA DRA driver's DeviceClass and ResourceSlices (hack/dra.py);
    ``kueue``: the Kueue manager (hack/kueue.py); ``volcano``: Volcano's scheduler and
    controllers (hack/volcano.py); ``real_nodes``: that many kubelet + containerd
    nodes running real containers (hack/realnode.py), holding ``images`` (hack/images.py).
    """

    dra: bool = True
    kueue: bool = False
    real_nodes: int = 0
    images: tuple[str, ...] = images.ALL
    volcano: bool = False


def up(
    nodes: int,
    topology: str,
    gpus: int,
    audit_log: bool = False,
    users: Sequence[str] = (),
    kueue: bool = False,
    real_nodes: int = 0,
    *,
    dra_driver: bool = True,
    node_images: Sequence[str] = images.ALL,
    volcano_scheduler: bool = False,
) -> State:
    """The cluster running with ``nodes`` simulated nodes and the components asked for."""
    unknown = sorted(set(node_images) - set(images.ALL))
    if unknown:
        raise SystemExit(f"[cluster] error: unknown image(s) {unknown}; any of {images.ALL}")
    parts = Components(dra_driver, kueue, real_nodes, tuple(node_images), volcano_scheduler)
    # The real nodes' images build while the binaries build and the control plane starts: an
    # image's build waits on Debian's archive as much as on the CPU.
    builder = images.start_building(parts.images) if parts.real_nodes > 0 else None
    try:
        state = ensure_control_plane(audit_log, users)
        ensure_nodes(state, nodes, topology, gpus)
        if parts.dra:
            ensure_dra(state)
    except BaseException:
        say("start failed; stopping what was started (logs stay in .cluster/logs)")
        if builder:
            builder.terminate()
        down(quiet=True)
        raise
    if parts.kueue:
        ensure_kueue(state)
    if parts.volcano:
        volcano.ensure(state)
    # Last: its failure leaves everything else up. A failed background build is built again,
    # in the foreground, where its error stops the real nodes only.
    if builder:
        builder.wait()
    ensure_real_nodes(state, parts.real_nodes, parts.images)
    return state


def ensure_dra(state: State) -> None:
    slices = dra.publish(lambda *args, input=None: kubectl(state, *args, input=input))
    say(f"simulated DRA driver {dra.DRIVER}: DeviceClass and {slices} ResourceSlices")


def ensure_kueue(state: State) -> None:
    try:
        queueing.ensure(state)
    except BaseException:
        say("Kueue did not start; the cluster stays up without it (see logs/kueue.log)")
        queueing.stop(state, quiet=True)
        raise


def ensure_real_nodes(state: State, count: int, node_images: Sequence[str] = images.ALL) -> None:
    """Starts (or restarts) the real nodes; their failure stops them, never the control plane."""
    api = lambda *a, input=None: kubectl(state, *a, input=input)  # noqa: E731
    if count <= 0:
        if realnode.NodeState.load(state_dir()):
            say("stopping the real node(s) (REAL_NODES=0)")
            realnode.down(state_dir(), api)
        return
    bins = binaries()
    if not (bins["kubelet"].exists() and bins["coredns"].exists()):
        say("real-node binaries missing; building them (hack/build-bins.sh kubelet coredns)")
        subprocess.run([str(HACK / "build-bins.sh"), "kubelet", "coredns"], check=True)
    realnode.up(state_dir(), count, bins, state_dir() / "kubeconfig", api, node_images)


def restart_reason(state: State) -> str:
    """Why a running cluster must restart to be what this file starts; empty: it need not."""
    if state.stages != stages_digest():
        return "hack/kwok/stages.yaml changed since the cluster started"
    wanted = versions()["KUBE_VERSION"]
    if state.kube_version != wanted:
        return (
            f"the cluster runs Kubernetes v{state.kube_version or 'of an older make'}, and "
            f"K8S_VERSION={versions()['K8S_VERSION']} asks for v{wanted}"
        )
    if state.feature_gates != versions()["FEATURE_GATES"]:
        return (
            f"the cluster runs with feature gates {state.feature_gates or 'none'!r}, and "
            f"hack/versions.env asks for {versions()['FEATURE_GATES'] or 'none'!r}"
        )
    if not (state_dir() / "pki" / WEBHOOK_CLIENT_CA).exists():
        return "the cluster's API server presents no webhook client certificate"
    return ""


# --- the control plane, step by step ----------------------------------------------------------


def ensure_control_plane(audit_log: bool, users: Sequence[str]) -> State:
    """etcd, the API server, the controllers, the scheduler and kwok running, started unless a
    healthy cluster of the same make already runs."""
    t0 = time.monotonic()
    state = running_cluster(audit_log, users)
    if state:
        return state
    ensure_binaries()
    state = new_state(audit_log, users)
    start_etcd(state)
    start_apiserver(state, audit_args(audit_log))
    wait_for(
        "kube-apiserver", lambda: get(server_url(state) + "/readyz")[0] == 200, 90, "kube-apiserver"
    )
    say(f"kube-apiserver ready at {server_url(state)} ({time.monotonic() - t0:.1f}s)")
    write_kubeconfigs(state, users)
    install_crds(state)
    start_controllers(state)
    start_kwok(state)
    for comp in COMPONENTS:
        if not alive(state.pids[comp]):
            wait_for(comp, lambda: False, 0, comp)
    kubeconfig = state_dir() / "kubeconfig"
    say(f"control plane up in {time.monotonic() - t0:.1f}s; KUBECONFIG={kubeconfig}")
    return state


def running_cluster(audit_log: bool, users: Sequence[str]) -> State | None:
    """The running cluster when it is healthy and what this file starts; stops a stale one."""
    state = State.load()
    up = state is not None and healthy(state, patience=30)
    if state and up and (why := restart_reason(state)):
        say(f"{why}; restarting it")
        down(quiet=True)
        return None
    if state and up:
        say(f"already running at {server_url(state)}")
        tokens = (state_dir() / "pki" / "tokens.csv").read_text() if users else ""
        if any(f"{user_token(u)}," not in tokens for u in users) or (
            audit_log and not (state_dir() / "audit-policy.yaml").exists()
        ):
            raise SystemExit(
                "[cluster] error: the running cluster was started without the requested "
                "--user/--audit-log; run `down` first"
            )
        write_user_kubeconfigs(state, users)
        return state
    if state:
        say("found a stale cluster; cleaning it up")
        down(quiet=True)
    return None


def ensure_binaries() -> None:
    optional = ("kubelet", "coredns", "helm")  # the real nodes' (ensure_real_nodes); the chart's
    missing = [str(p) for c, p in binaries().items() if not p.exists() and c not in optional]
    if missing:
        say("control-plane binaries missing; building them (hack/build-bins.sh)")
        subprocess.run([str(HACK / "build-bins.sh")], check=True)


def new_state(audit_log: bool, users: Sequence[str]) -> State:
    """The state folder with fresh keys, and a port for every listener."""
    sd = state_dir()
    sd.mkdir(parents=True, exist_ok=True)
    write_pki(sd / "pki", users)
    ports = (
        "etcd",
        "etcd-peer",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "sched-plugins-metrics",
        "sched-plugins-probe",
        "kwok",
    )
    state = State(
        ports={c: free_port() for c in ports},
        started_at=time.time(),
        stages=stages_digest(),
        kube_version=versions()["KUBE_VERSION"],
        feature_gates=versions()["FEATURE_GATES"],
    )
    state.save()
    return state


def start_etcd(state: State) -> None:
    p = state.ports
    etcd_url = f"http://127.0.0.1:{p['etcd']}"
    start(
        "etcd",
        [
            str(binaries()["etcd"]),
            "--name=local",
            f"--data-dir={state_dir() / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
            f"--initial-cluster=local=http://127.0.0.1:{p['etcd-peer']}",
            "--unsafe-no-fsync",
            "--quota-backend-bytes=8589934592",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1m",
            "--log-level=warn",
        ],
        state,
    )


def feature_gate_args() -> list[str]:
    """The minor's ``--feature-gates`` (hack/versions.env ``FEATURE_GATES``), the same for every
    control-plane component, as kubeadm's featureGates gives them; none when it names none."""
    gates = versions()["FEATURE_GATES"]
    return [f"--feature-gates={gates}"] if gates else []


def start_apiserver(state: State, audit: list[str]) -> None:
    pki = state_dir() / "pki"
    start(
        "kube-apiserver",
        [
            str(binaries()["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{state.ports['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={state.ports['kube-apiserver']}",
            f"--cert-dir={pki}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # No kubelet mounts tokens here, and no race between namespace and default SA creation.
            "--disable-admission-plugins=ServiceAccount",
            # A benchmark cluster: no client throttling on the server side.
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            "--enable-priority-and-fairness=false",
            # Loopback cannot be a Service endpoint; nothing here reaches it through a Service.
            "--endpoint-reconciler-type=none",
            # No kube-proxy routes Service IPs here: the API server calls a webhook (or an
            # aggregated API) behind a Service at one of its endpoints' pod addresses instead,
            # which the real nodes' bridge makes reachable (the GPU-share webhooks installed
            # in-cluster, hack/incluster.py).
            "--enable-aggregator-routing=true",
            # A real node's name resolves nowhere; its address is where its kubelet listens.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            "--profiling=false",
            "--v=1",
            *feature_gate_args(),
            *(
                [f"--runtime-config={versions()['RUNTIME_CONFIG']}"]
                if versions()["RUNTIME_CONFIG"]
                else []
            ),
            *write_webhook_client(pki),
            *audit,
        ],
        state,
    )


def write_kubeconfigs(state: State, users: Sequence[str]) -> None:
    kubeconfig = state_dir() / "kubeconfig"
    kubeconfig.write_text(kubeconfig_text(state))  # carries the CA the apiserver just made
    kubeconfig.chmod(0o600)
    write_user_kubeconfigs(state, users)


def install_crds(state: State) -> None:
    """The PodGroup kinds the scheduler and its controller watch, Established before they start."""
    crds = third_party_crds()
    kubectl(state, "apply", "--server-side", *[a for c in crds for a in ("-f", str(c))])
    wait_established(
        state,
        [
            "crd/podgroups.scheduling.x-k8s.io",
            "crd/elasticquotas.scheduling.x-k8s.io",
            "crd/podgroups.scheduling.volcano.sh",
        ],
    )


def start_controllers(state: State) -> None:
    """kube-controller-manager, the scheduler and the PodGroup controller, each restarted when
    it exits (as a kubelet restarts a control-plane static pod)."""
    sd, p, bins = state_dir(), state.ports, binaries()
    kubeconfig = sd / "kubeconfig"
    (sd / "scheduler-config.yaml").write_text(scheduler_config(kubeconfig))
    start(
        "kube-controller-manager",
        [
            str(bins["kube-controller-manager"]),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-controller-manager']}",
            f"--service-account-private-key-file={sd / 'pki' / 'sa.key'}",
            f"--root-ca-file={sd / 'pki' / 'apiserver.crt'}",
            "--kube-api-qps=500",
            "--kube-api-burst=1000",
            "--concurrent-job-syncs=20",
            "--concurrent-gc-syncs=40",
            "--v=1",
            *feature_gate_args(),
        ],
        state,
        restart=True,
    )
    start(
        "kube-scheduler",
        [
            str(bins["kube-scheduler"]),
            f"--config={sd / 'scheduler-config.yaml'}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-scheduler']}",
            # Coscheduling requeues a rejected gang only on pod or PodGroup events, not when
            # capacity frees; the scheduler's periodic flush does that (5 min by default).
            # A simulation cluster retries sooner so tests see capacity freed within seconds.
            "--pod-max-in-unschedulable-pods-duration=10s",
            "--v=1",
            *feature_gate_args(),
        ],
        state,
        restart=True,
    )
    start(
        "sched-plugins-controller",
        [
            str(bins["sched-plugins-controller"]),
            f"--kubeconfig={kubeconfig}",
            f"--metricsAddr=127.0.0.1:{p['sched-plugins-metrics']}",
            f"--probeAddr=127.0.0.1:{p['sched-plugins-probe']}",
            "--qps=200",
            "--burst=400",
            "--workers=4",
        ],
        state,
        restart=True,
    )


def start_kwok(state: State) -> None:
    """kwok, keeping the simulated nodes (annotated ``kwok.x-k8s.io/node=fake``) and their pods."""
    start(
        "kwok",
        [
            str(binaries()["kwok"]),
            f"--kubeconfig={state_dir() / 'kubeconfig'}",
            f"--config={HACK / 'kwok/stages.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{state.ports['kwok']}",
            "--node-lease-duration-seconds=40",
            "--cidr=10.240.0.1/16",
            "--node-ip=10.241.0.1",
        ],
        state,
    )


def stop_demo_operator() -> None:
    """The operator ``make demo`` left running, if any."""
    pid_file = state_dir() / "operator.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text() or 0)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        pid_file.unlink()


def down(quiet: bool = False) -> None:
    stop_demo_operator()
    state = State.load()
    # The real nodes first, while the API server can still tell their kubelets to stop pods.
    live = state if state and healthy(state) else None
    realnode.down(
        state_dir(), (lambda *a, input=None: kubectl(live, *a, input=input)) if live else None
    )
    if state is None:
        if not quiet:
            say("no cluster running")
        return
    # Stop clients first (components started on request, then the core), etcd last, so nothing
    # logs a storm of connection errors.
    extras = [c for c in state.pids if c not in COMPONENTS]
    for comp in [*extras, *reversed(COMPONENTS)]:
        pid = state.pids.get(comp)
        if pid and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in state.pids.values()):
        time.sleep(0.1)
    for pid in state.pids.values():
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    sd = state_dir()
    subprocess.run(
        ["rm", "-rf", str(sd / "etcd"), str(sd / "pki"), str(sd / "state.json")], check=False
    )
    if not quiet:
        say("cluster stopped")


def rss_mb(pid: int) -> float:
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total = int(line.split()[1])
    return total / 1024


def status() -> int:
    state = State.load()
    if state is None:
        print("no cluster")
        return 1
    total = 0.0
    for comp in [*COMPONENTS, *(c for c in state.pids if c not in COMPONENTS)]:
        pid = state.pids.get(comp, -1)
        mb = rss_mb(pid) if alive(pid) else 0.0
        total += mb
        print(f"{comp:26} pid {pid:>7}  {'up' if alive(pid) else 'DOWN':4}  rss {mb:8.1f} MiB")
    for comp, pid in realnode.status(state_dir()):
        mb = rss_mb(pid) if alive(pid) else 0.0
        total += mb
        print(f"{comp:26} pid {pid:>7}  {'up' if alive(pid) else 'DOWN':4}  rss {mb:8.1f} MiB")
    print(f"{'total':26} {'':16} rss {total:8.1f} MiB")
    print(f"server {server_url(state)}  kubeconfig {state_dir() / 'kubeconfig'}")
    return 0 if healthy(state) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start the cluster (or ensure the running one has the nodes)")
    p_up.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("NODES", "4")),
        help="number of simulated GPU nodes (default 4, env NODES)",
    )
    p_up.add_argument(
        "--topology",
        default=os.environ.get("TOPOLOGY", DEFAULT_TOPOLOGY),
        help=f"GPU topology fixture of every node (default {DEFAULT_TOPOLOGY})",
    )
    p_up.add_argument("--gpus", type=int, default=8, help="allocatable nvidia.com/gpu per node")
    p_up.add_argument(
        "--real-nodes",
        type=int,
        default=default_real_nodes(),
        help="real nodes (kubelet + containerd) beside the simulated ones (default 2, env "
        "REAL_NODES; 0 for none)",
    )
    p_up.add_argument(
        "--audit-log",
        action="store_true",
        help="write a Metadata-level audit log of every API request to logs/audit.log",
    )
    p_up.add_argument(
        "--user",
        dest="users",
        action="append",
        default=[],
        metavar="NAME",
        help="add a token user NAME in system:masters with its own kubeconfig-NAME (repeatable)",
    )
    p_up.add_argument(
        "--kueue",
        action="store_true",
        default=os.environ.get("KUEUE", "") == "1",
        help="also run Kueue (hack/kueue.py), with a ClusterQueue for the GPUs (env KUEUE=1)",
    )
    p_up.add_argument(
        "--volcano",
        action="store_true",
        default=os.environ.get("VOLCANO", "") == "1",
        help="also run Volcano's scheduler and controllers (hack/volcano.py; env VOLCANO=1)",
    )
    p_up.add_argument(
        "--dra",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("DRA", "1") != "0",
        help="publish the simulated NVIDIA DRA driver's DeviceClass and ResourceSlices (default "
        "on; env DRA=0 for off)",
    )
    p_up.add_argument(
        "--images",
        type=lambda text: [n for n in text.split(",") if n],
        default=list(images.ALL),
        metavar="NAME,...",
        help=f"the images the real nodes hold (default all: {','.join(images.ALL)})",
    )
    p_nodes = sub.add_parser(
        "node-manifests", help="print the simulated GPU nodes as YAML (for any kwok cluster)"
    )
    p_nodes.add_argument("--nodes", type=int, default=4)
    p_nodes.add_argument("--topology", default=DEFAULT_TOPOLOGY)
    p_nodes.add_argument("--gpus", type=int, default=8)
    sub.add_parser("down", help="stop every process and delete the cluster's data")
    sub.add_parser("status", help="show each component's pid, state and memory")
    p_kc = sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    p_kc.add_argument("--print", action="store_true", help="print the file's content instead")
    args = parser.parse_args()
    if args.cmd == "up":
        try:
            up(
                args.nodes,
                args.topology,
                args.gpus,
                args.audit_log,
                args.users,
                kueue=args.kueue,
                real_nodes=args.real_nodes,
                dra_driver=args.dra,
                node_images=args.images,
                volcano_scheduler=args.volcano,
            )
        except realnode.NodeError as e:
            # The control plane and the kwok nodes are up: only what needs a real node fails.
            print(e.code, file=sys.stderr)
            return realnode.FAILED
    elif args.cmd == "node-manifests":
        nodes = [node_manifest(i, args.topology, args.gpus) for i in range(args.nodes)]
        print(yaml.safe_dump_all(nodes))
    elif args.cmd == "down":
        down()
    elif args.cmd == "status":
        return status()
    elif args.cmd == "kubeconfig":
        path = state_dir() / "kubeconfig"
        print(path.read_text() if args.print else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

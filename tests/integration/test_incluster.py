"""The operator installed as users install it: its own image, run as a pod on the real node.

hack/operator_image.py builds the image from the Dockerfile's recipe and hack/incluster.py applies
an overlay with ``kubectl apply -k`` (the real-node component and this cluster's addresses added,
manifests/components/local-cluster), so what runs is the Deployment, ServiceAccount, probes,
metrics Service, agent DaemonSet and webhook Service a user gets. Each test keeps the installed
operator to its own namespace (``--namespace``), so it never touches another module's jobs; at
the end the Deployment, DaemonSets, webhook configurations and Lease go (CRDs, RBAC and the
namespace stay, as other modules expect them).

Jobs whose processes matter (upstream's pi) run on the real node; the fail-over and upgrade
tests run simulated jobs on the kwok nodes, whose launcher finishes when told to, so that the
job is sure to be running while the operator's pods are killed or replaced.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack import incluster
from mpijob import keys
from support.jobs import mpijob
from support.kube import ROOT, Cluster, kubectl_binary
from support.mpijobs import MPIJobs
from support.realnode import (
    exit_codes,
    kill_pod_processes,
    launcher_log,
    on_real_node,
    pods,
    ready_real_node,
)
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

NS = incluster.NAMESPACE
OPERATOR = incluster.OPERATOR
TIMEOUT = 180
LEASE = "mpijob-operator"
PERCENTAGE = keys.GPU_CORE_PERCENTAGE_RESOURCE


def say(msg: str) -> None:
    """Figures the tests see (rollout and fail-over times): printed, never asserted."""
    print(f"[incluster] {msg}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def installing(crds: Cluster) -> Cluster:
    ready_real_node(crds)
    return crds


@pytest.fixture
def real_cluster(installing: Cluster) -> Iterator[Cluster]:
    """The cluster; whatever the test installed is removed afterwards, so that each test
    applies onto nothing (an upgrade test's `kubectl set image` and strategy patch would
    otherwise own fields the next apply sets)."""
    yield installing
    incluster.undeploy()


def operator_pods(cluster: Cluster, deployment: str = OPERATOR) -> list[client.V1Pod]:
    """The Deployment's live pods (not those being deleted)."""
    selector = "app.kubernetes.io/name=mpijob-operator,app.kubernetes.io/component=operator"
    found = cluster.core.list_namespaced_pod(NS, label_selector=selector).items
    return [p for p in found if p.metadata.deletion_timestamp is None]


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def metrics(pod: client.V1Pod) -> str:
    """The pod's /metrics, read at its address on the real nodes' bridge."""
    with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/metrics", timeout=5) as r:
        return str(r.read().decode())


def metric(pod: client.V1Pod, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics(pod).splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{")
    )


def lease_holder(cluster: Cluster) -> str:
    """The pod name of the Lease's holder (identities are ``<pod>_<uuid>``), or ''."""
    lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(LEASE, NS)
    return str(lease.spec.holder_identity or "").rsplit("_", 1)[0]


def children(cluster: Cluster, namespace: str) -> dict[str, set[tuple[str, str]]]:
    """Every object the operator made in ``namespace`` (and the launcher Job's pod), as
    (name, uid) per kind."""
    batch = client.BatchV1Api(cluster.api)
    core = cluster.core
    listed = {
        "pods": core.list_namespaced_pod(namespace).items,
        "jobs": batch.list_namespaced_job(namespace).items,
        "services": core.list_namespaced_service(namespace).items,
        "configmaps": core.list_namespaced_config_map(namespace).items,
        "secrets": core.list_namespaced_secret(namespace).items,
    }
    return {
        kind: {
            (o.metadata.name, o.metadata.uid)
            for o in items
            if o.metadata.name != "kube-root-ca.crt"  # the controller-manager's, every namespace
        }
        for kind, items in listed.items()
    }


def sim_job(name: str, seconds: int | None, workers: int = 2) -> dict[str, Any]:
    """A job on the kwok nodes whose launcher succeeds ``seconds`` after it starts (None: once
    told, :func:`finish`); its children stay (cleanPodPolicy None) so they can be counted
    afterwards."""
    succeed = {} if seconds is None else {keys.SIM_SUCCEED_AFTER: f"{seconds}s"}
    return mpijob(
        name,
        workers=workers,
        launcher_annotations=succeed or None,
        run_policy={"cleanPodPolicy": "None"},
    )


def finish(cluster: Cluster, namespace: str, name: str) -> None:
    """Tell the launcher of a job made by ``sim_job(name, None)`` to succeed now."""
    (launcher,) = pods(cluster, namespace, name, keys.ROLE_LAUNCHER)
    cluster.core.patch_namespaced_pod(
        launcher.metadata.name,
        namespace,
        {"metadata": {"annotations": {keys.SIM_SUCCEED_AFTER: "1s"}}},
    )


def wait_running(mpijobs: MPIJobs, cluster: Cluster, namespace: str, name: str) -> None:
    mpijobs.wait_condition(name, keys.COND_RUNNING, timeout=TIMEOUT)
    wait_until(
        lambda: len(pods(cluster, namespace, name, keys.ROLE_WORKER)) > 0,
        timeout=30,
        what=f"{name}'s workers",
    )


def seconds_between(earlier: datetime, later: datetime) -> float:
    return (later - earlier).total_seconds()


# --- 6. the README's install commands -------------------------------------------------------


def readme_install_commands() -> list[str]:
    """The ``kubectl`` lines of the README's install section's code blocks."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Install on a cluster\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    return [
        line.split("#", 1)[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith("kubectl ")
    ]


def test_readme_install_commands_are_accepted_by_the_api_server(real_cluster: Cluster) -> None:
    """What the README tells a user to run, as written, run against the cluster with
    ``--dry-run=server``: the server checks every object (CRDs, RBAC, Deployment) and applies
    nothing. First in this module, before anything is installed, and with nothing running."""
    incluster.undeploy()
    commands = readme_install_commands()
    assert any("-k manifests/overlays/standalone" in c for c in commands), commands
    assert any("-f deploy/mpi-operator.yaml" in c for c in commands), commands
    # A dry run creates nothing, so every object of the install would be checked against a
    # namespace that does not exist yet on a fresh cluster; the real apply creates it first.
    try:
        real_cluster.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=incluster.NAMESPACE))
        )
    except ApiException as e:
        if e.status != 409:
            raise
    for command in commands:
        argv = [kubectl_binary(), "--kubeconfig", str(real_cluster.kubeconfig),
                *command.split()[1:], "--dry-run=server"]  # fmt: skip
        result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        assert "deployment.apps/mpijob-operator" in result.stdout, result.stdout


# --- 2. the install runs, on the real node --------------------------------------------------


def test_incluster_standalone_runs_upstream_pi_on_the_real_node(
    real_cluster: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    t0 = time.monotonic()
    install = incluster.deploy("standalone", replicas=1, namespaces=(namespace,))
    say(f"standalone: apply to rolled out in {time.monotonic() - t0:.1f}s")
    (pod,) = operator_pods(real_cluster)
    # The pod as the Deployment describes it, on the real node, under its ServiceAccount.
    assert pod.spec.node_name.startswith("real-node-")
    assert pod.spec.service_account_name == OPERATOR
    (container,) = pod.spec.containers
    assert container.image == install.image
    assert ready(pod)
    started = pod.status.start_time
    ready_at = next(c.last_transition_time for c in pod.status.conditions if c.type == "Ready")
    say(f"operator pod start to Ready: {seconds_between(started, ready_at):.0f}s (1 s resolution)")
    (status,) = pod.status.container_statuses
    assert status.restart_count == 0, real_cluster.kubectl("logs", pod.metadata.name, "-n", NS)
    # The metrics Service leads to the pod, and the pod leads.
    endpoints = real_cluster.core.read_namespaced_endpoints("mpijob-operator-metrics", NS)
    addresses = [a.ip for s in endpoints.subsets or [] for a in s.addresses or []]
    assert addresses == [pod.status.pod_ip]
    wait_until(lambda: metric(pod, "mpi_operator_is_leader") == 1, timeout=30, what="leadership")
    assert lease_holder(real_cluster) == pod.metadata.name

    # The agent runs on every real node from the same image and publishes its topology.
    agents = real_cluster.core.list_namespaced_pod(
        NS, label_selector="app.kubernetes.io/name=mpijob-agent"
    ).items
    nodes = {
        n.metadata.name
        for n in real_cluster.core.list_node(label_selector="mpijob.io/real-node=true").items
    }
    assert {a.spec.node_name for a in agents} == nodes  # fmt: skip
    assert all(a.spec.containers[0].image == install.image for a in agents)
    for node in nodes:
        topology = wait_until(
            lambda node=node: (real_cluster.core.read_node(node).metadata.annotations or {}).get(
                keys.GPU_TOPOLOGY
            ),
            timeout=60,
            what=f"the agent's topology on {node}",
        )
        assert len(json.loads(topology)["gpus"]) == 8  # dgx1-v100

    # Upstream's pi example, run by the installed operator, on the real node.
    body = on_real_node(yaml.safe_load((ROOT / "examples" / "pi.yaml").read_text()))
    real_cluster.apply(body, namespace=namespace)
    mpijobs.wait_condition("pi", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    launchers = pods(real_cluster, namespace, "pi", keys.ROLE_LAUNCHER)
    assert all(0 in exit_codes(p) for p in launchers), [exit_codes(p) for p in launchers]
    log = launcher_log(real_cluster, namespace, "pi")
    assert "pi is approximately" in log, log
    # Launched without sshd: the installed operator found its own image and gives the jobs
    # its launch agent from it, with no flag.
    body = on_real_node(yaml.safe_load((ROOT / "examples" / "pi-no-sshd.yaml").read_text()))
    real_cluster.apply(body, namespace=namespace)
    mpijobs.wait_condition("pi-no-sshd", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    (launcher,) = pods(real_cluster, namespace, "pi-no-sshd", keys.ROLE_LAUNCHER)
    assert [c.image for c in launcher.spec.init_containers] == [install.image]
    assert "pi is approximately" in launcher_log(real_cluster, namespace, "pi-no-sshd")
    logs = real_cluster.kubectl("logs", pod.metadata.name, "-n", NS)
    assert "Forbidden" not in logs, logs[-3000:]


def test_incluster_monitoring_overlay_installs_beside_the_operator(
    real_cluster: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    incluster.deploy("monitoring", replicas=1, namespaces=(namespace,))
    monitors = real_cluster.kubectl("get", "servicemonitor,prometheusrule", "-n", NS, "-o", "name")
    assert set(monitors.split()) == {
        "servicemonitor.monitoring.coreos.com/mpijob-operator",
        "prometheusrule.monitoring.coreos.com/mpijob-operator",
    }
    dashboard = real_cluster.core.read_namespaced_config_map("mpijob-operator-dashboard", NS)
    assert dashboard.metadata.labels["grafana_dashboard"] == "1"
    mpijobs.create(sim_job("watched", 2))
    mpijobs.wait_condition("watched", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    (pod,) = operator_pods(real_cluster)
    # What the ServiceMonitor scrapes: the metrics port of the Service's endpoint.
    assert metric(pod, "mpi_operator_jobs_successful_total") >= 1


def test_incluster_fractional_gpus_webhooks_are_reached_through_their_service(
    real_cluster: Cluster, namespace: str
) -> None:
    incluster.deploy("fractional-gpus", replicas=1, namespaces=(namespace,))
    config = json.loads(
        real_cluster.kubectl(
            "get", "mutatingwebhookconfiguration", "mpijob-gpu-share", "-o", "json"
        )
    )
    for hook in config["webhooks"]:
        assert hook["clientConfig"]["service"] == {
            "name": "mpijob-operator-webhook",
            "namespace": NS,
            "port": 443,
            "path": hook["clientConfig"]["service"]["path"],
        }
        assert "url" not in hook["clientConfig"]
    share = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "share"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda-sample",
                    "resources": {
                        "limits": {
                            keys.GPU_MEM_RESOURCE: "1",
                            keys.GPU_CORE_PERCENTAGE_RESOURCE: "5",
                        }
                    },
                }
            ]
        },
    }

    # The API server calls our webhook through the Service: no core_mem GPU exists here, so the
    # placing (mutating) webhook refuses the share with its own reason. Until the Service's
    # endpoint is known to the API server, the call itself fails instead.
    def refusal() -> str | None:
        try:
            real_cluster.core.create_namespaced_pod(namespace, share, dry_run="All")
        except ApiException as e:
            body = e.body or ""
            return body if "denied the request" in body else None
        raise AssertionError("a share with no GPU to take it was admitted")

    message = json.loads(wait_until(refusal, timeout=60, what="the webhook's answer"))["message"]
    assert 'admission webhook "place.gpu-share.mpijob.io" denied' in message, message
    assert "no opted-in GPU" in message, message


# --- 3. fail-over, 4. upgrade ---------------------------------------------------------------


def two_ready_pods(cluster: Cluster, image: str) -> list[client.V1Pod]:
    def probe() -> list[client.V1Pod] | None:
        found = operator_pods(cluster)
        good = [p for p in found if ready(p) and p.spec.containers[0].image == image]
        return good if len(good) == 2 and len(found) == 2 else None

    return wait_until(probe, timeout=TIMEOUT, what=f"two Ready operator pods of {image}")


def leader_among(cluster: Cluster, names: set[str]) -> str:
    return wait_until(
        lambda: (h := lease_holder(cluster)) in names and h,
        timeout=60,
        what=f"one of {sorted(names)} holding the Lease",
    )


def test_incluster_leader_killed_while_a_job_runs_the_standby_finishes_it(
    real_cluster: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    install = incluster.deploy("standalone", replicas=2, namespaces=(namespace,))
    names = {p.metadata.name for p in two_ready_pods(real_cluster, install.image)}
    leader = leader_among(real_cluster, names)
    (standby,) = names - {leader}
    mpijobs.create(sim_job("survivor", None))  # runs until told, after the fail-over
    wait_running(mpijobs, real_cluster, namespace, "survivor")
    before = children(real_cluster, namespace)

    t0 = time.monotonic()
    # Killed, as a crash or the OOM killer kills: no graceful stop, so the Lease is not released
    # and a new leader waits for it to expire; then the pod is gone for good.
    assert kill_pod_processes(leader) >= 1, f"no process of {leader} found on this machine"
    real_cluster.kubectl("delete", "pod", leader, "-n", NS, "--grace-period=0", "--force")
    holder = wait_until(
        lambda: (h := lease_holder(real_cluster)) != leader and h,
        timeout=60,
        what="a new leader",
    )
    took = time.monotonic() - t0
    say(f"fail-over: leader pod deleted to the standby holding the Lease: {took:.1f}s")
    # The standby, whose watches were warm, took over; not the pod that replaced the leader.
    assert holder == standby
    assert mpijobs.condition("survivor", keys.COND_SUCCEEDED) is None  # still running
    finish(real_cluster, namespace, "survivor")
    mpijobs.wait_condition("survivor", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    # Nothing made twice, nothing lost: the same children, by uid, as before the kill.
    assert children(real_cluster, namespace) == before
    standby_pod = real_cluster.core.read_namespaced_pod(standby, NS)
    assert metric(standby_pod, "mpi_operator_is_leader") == 1


@pytest.mark.parametrize("strategy", ["Recreate", "RollingUpdate"])
def test_incluster_upgrade_to_a_new_image_tag_while_jobs_run(
    real_cluster: Cluster, namespace: str, mpijobs: MPIJobs, strategy: str
) -> None:
    """``kubectl set image`` of a new tag on the two-replica Deployment, with the shipped
    strategy (Recreate) and with a rolling update, while three jobs run."""
    install = incluster.deploy("standalone", replicas=2, namespaces=(namespace,))
    patch = {"spec": {"strategy": {"type": strategy}}}
    if strategy == "RollingUpdate":
        patch["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
    real_cluster.kubectl(
        "patch", "deployment", OPERATOR, "-n", NS, "--type=merge", "-p", json.dumps(patch)
    )
    old = {p.metadata.name for p in two_ready_pods(real_cluster, install.image)}
    leader_among(real_cluster, old)
    jobs = [f"upgraded-{i}" for i in range(3)]
    for name in jobs:
        mpijobs.create(sim_job(name, None))  # they run until told, after the upgrade
    for name in jobs:
        wait_running(mpijobs, real_cluster, namespace, name)
    before = children(real_cluster, namespace)

    new_image = incluster.retag(install.image, f"{install.image.rsplit(':', 1)[1]}-next")
    t0 = time.monotonic()
    real_cluster.kubectl(
        "set", "image", f"deployment/{OPERATOR}", f"operator={new_image}", "-n", NS
    )
    real_cluster.kubectl("set", "image", "daemonset/mpijob-agent", f"agent={new_image}", "-n", NS)
    real_cluster.kubectl("rollout", "status", f"deployment/{OPERATOR}", "-n", NS, "--timeout=180s")
    new = {p.metadata.name for p in two_ready_pods(real_cluster, new_image)}
    assert not new & old
    leader_among(real_cluster, new)
    say(f"upgrade ({strategy}): set image to a new pod leading: {time.monotonic() - t0:.1f}s")
    for name in jobs:
        assert mpijobs.condition(name, keys.COND_SUCCEEDED) is None  # still running
        finish(real_cluster, namespace, name)
    for name in jobs:
        mpijobs.wait_condition(name, keys.COND_SUCCEEDED, timeout=TIMEOUT)
    assert children(real_cluster, namespace) == before
    # The new release runs new jobs too.
    mpijobs.create(sim_job("after-upgrade", 2))
    mpijobs.wait_condition("after-upgrade", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    real_cluster.kubectl("rollout", "status", "daemonset/mpijob-agent", "-n", NS, "--timeout=120s")


# --- 5. the single-file install ------------------------------------------------------------


def test_single_file_install_is_the_standalone_overlay_and_runs_a_job(
    real_cluster: Cluster, namespace: str, mpijobs: MPIJobs
) -> None:
    check = subprocess.run(
        [sys.executable, "-m", "hack.gen_install", "--check"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    incluster.deploy(incluster.SINGLE_FILE.name, replicas=1, namespaces=(namespace,))
    (pod,) = operator_pods(real_cluster)
    assert pod.spec.node_name.startswith("real-node-")
    replay_kubeflow_guide(real_cluster, namespace, mpijobs)


def guide_example() -> dict[str, Any]:
    """The guide's example, examples/tensorflow-benchmarks.yaml (upstream's shape: its name, a
    launcher running mpirun, two workers), with the containers of examples/pytorch-cpu.yaml: the
    training image has no TensorFlow, and the real nodes no GPU."""
    from hack import pytorch_image

    guide = yaml.safe_load((ROOT / "examples" / "tensorflow-benchmarks.yaml").read_text())
    cpu = yaml.safe_load((ROOT / "examples" / "pytorch-cpu.yaml").read_text())
    guide["spec"]["sshAuthMountPath"] = cpu["spec"]["sshAuthMountPath"]
    for role, spec in guide["spec"]["mpiReplicaSpecs"].items():
        (container,) = spec["template"]["spec"]["containers"]
        ours = cpu["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]["containers"][0]
        spec["template"]["spec"]["containers"] = [{**ours, "name": container["name"]}]
    job: dict[str, Any] = pytorch_image.on_real_nodes(guide, workers=2)
    return job


def replay_kubeflow_guide(cluster: Cluster, namespace: str, mpijobs: MPIJobs) -> None:
    """Seed 004: Kubeflow's MPI guide after `kubectl apply -f deploy/mpi-operator.yaml`, as the
    README's "Running a job as Kubeflow's MPI guide does" spells it: `kubectl get crd`, create
    the example, `kubectl get -o yaml mpijobs ...`, then the launcher pod found by the README's
    label selector and its log read."""
    crds = cluster.kubectl("get", "crd").splitlines()
    assert any(line.split()[:1] == ["mpijobs.kubeflow.org"] for line in crds), crds
    name = "tensorflow-benchmarks"
    out = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", input=yaml.safe_dump(guide_example())
    )
    assert out.strip() == f"mpijob.kubeflow.org/{name} created"
    mpijobs.wait_condition(name, keys.COND_SUCCEEDED, timeout=TIMEOUT)
    shown = yaml.safe_load(cluster.kubectl("get", "-n", namespace, "-o", "yaml", "mpijobs", name))
    assert shown["status"]["replicaStatuses"]["Launcher"]["succeeded"] == 1, shown["status"]

    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Running a job as Kubeflow's MPI guide does\n", 1)[1]
    (line,) = [ln for ln in section.splitlines() if ln.startswith("PODNAME=$(kubectl get pods")]
    argv = line.split("$(", 1)[1].rsplit(")", 1)[0].split()[1:]
    found = cluster.kubectl("-n", namespace, *argv).split()
    launchers = [p.metadata.name for p in pods(cluster, namespace, name, keys.ROLE_LAUNCHER)]
    assert found == [f"pod/{p}" for p in launchers], found
    log = cluster.kubectl("logs", "-n", namespace, found[0])
    assert re.search(r"^Total img/sec on 2 CPU\(s\): [\d.]+ \+-[\d.]+$", log, re.M), log
    sums = dict(re.findall(r"^Rank (\d) parameter checksum: ([0-9a-f]{16})$", log, re.M))
    assert sorted(sums) == ["0", "1"], log
    assert len(set(sums.values())) == 1, sums

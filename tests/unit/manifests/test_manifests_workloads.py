"""The operator Deployment, the agent DaemonSet, the image and the overlays' wiring."""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

import pytest
import yaml
from manifests_files import BASE, ROOT, one

from mpijob import cli, keys
from mpijob.agent import main as agent_main

pytestmark = pytest.mark.unit

DEPLOYMENT = one(BASE / "deployment.yaml", "Deployment")
DAEMONSET = one(BASE / "agent-daemonset.yaml", "DaemonSet")
MPS_DAEMONSET = one(BASE / "agent-mps-daemonset.yaml", "DaemonSet")
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def container(workload: dict[str, Any], name: str = "") -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    if name:
        (found,) = [c for c in containers if c["name"] == name]
        return dict(found)
    assert len(containers) == 1
    return dict(containers[0])


def field_env(c: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in c.get("env", [])
        if "valueFrom" in e
    }


NON_ROOT = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532}
#: The kubelet's pod-resources socket accepts only its owner, root; the agent holds no capability.
ROOT_WITHOUT_CAPABILITIES = {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}


@pytest.mark.parametrize(
    ("workload", "user"),
    [(DEPLOYMENT, NON_ROOT), (DAEMONSET, ROOT_WITHOUT_CAPABILITIES)],
    ids=["operator", "agent"],
)
def test_runs_hardened(workload: dict[str, Any], user: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"] == {**user, "seccompProfile": {"type": "RuntimeDefault"}}
    c = container(workload)
    assert c["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    resources = c["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert c["image"] == "mpijob-operator"
    selector = workload["spec"]["selector"]["matchLabels"]
    assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_operator_deployment() -> None:
    spec = DEPLOYMENT["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert spec["template"]["spec"]["serviceAccountName"] == "mpijob-operator"
    c = container(DEPLOYMENT)
    assert "command" not in c  # the image's entrypoint: mpijob-operator
    assert c["args"] == [
        "run",
        "--lock-namespace=mpi-operator",
        "--monitoring-port=8080",
        "--health-port=8081",
    ]
    assert field_env(c) == {"POD_NAME": "metadata.name"}
    assert c["ports"] == [
        {"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
        {"name": "health", "containerPort": 8081, "protocol": "TCP"},
    ]
    # Liveness is Kopf's probe server's; readiness stays on our metrics server.
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_operator_liveness_outlasts_a_loop_held_by_an_admission_pass() -> None:
    """Kopf answers on the event loop, which a pass may hold for a second or two: the probe
    waits longer than the kubelet's default second for the answer."""
    probe = container(DEPLOYMENT)["livenessProbe"]
    assert probe["timeoutSeconds"] == 5
    assert probe["failureThreshold"] == 3


def test_operator_args_are_flags_the_operator_accepts() -> None:
    """The Deployment's args parse with the operator's own CLI (no typo survives)."""
    args = container(DEPLOYMENT)["args"]
    assert args[0] == "run"
    ctx = cli.run.make_context("run", args[1:])
    assert ctx.params["lock_namespace"] == "mpi-operator"
    assert ctx.params["monitoring_port"] == 8080
    assert ctx.params["health_port"] == 8081
    ports = {p["name"]: p["containerPort"] for p in container(DEPLOYMENT)["ports"]}
    assert ports == {"metrics": ctx.params["monitoring_port"], "health": ctx.params["health_port"]}


def test_metrics_service_selects_the_operator_port() -> None:
    service = one(BASE / "service.yaml", "Service")
    assert service["spec"]["selector"] == DEPLOYMENT["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_agent_daemonset() -> None:
    pod = DAEMONSET["spec"]["template"]["spec"]
    c = container(DAEMONSET)
    assert c["command"] == ["mpijob-agent"]
    assert field_env(c) == {"NODE_NAME": "spec.nodeName"}
    plain = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert plain["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert pod["serviceAccountName"] == "mpijob-agent"
    assert pod["runtimeClassName"] == "nvidia"
    # The agent asks for no GPU: it must never take one from a job.
    assert "nvidia.com/gpu" not in str(c["resources"])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
        # core_mem nodes run the MPS agent instead: one agent per node.
        {"key": keys.NODE_GPU_SCHEDULE_LABEL, "operator": "NotIn", "values": ["core_mem"]},
    ]


def test_mps_agent_daemonset_runs_on_core_mem_nodes_only_and_shares_their_gpus() -> None:
    pod = MPS_DAEMONSET["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["agent", "csi"]
    c = container(MPS_DAEMONSET, "agent")
    assert c["command"] == ["mpijob-agent"]
    args = agent_main.main.make_context("mpijob-agent", list(c["args"])).params
    assert args["share_gpus"]
    assert args["mps"]
    assert args["mps_root"] == keys.MPS_ROOT
    # No topology-placed pod runs here, and no pod-resources socket is mounted.
    assert not args["check_pods"]
    assert "pod-resources" not in str(pod["volumes"])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": keys.NODE_GPU_SCHEDULE_LABEL, "operator": "In", "values": ["core_mem"]} in terms[
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    # The daemons' pipe directories are what the CSI container bind-mounts into client pods.
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["mps"]
    volume = {v["name"]: v for v in pod["volumes"]}["mps"]
    assert mount == volume["hostPath"]["path"] == keys.MPS_ROOT
    assert pod["hostPID"] is True
    assert "hostIPC" not in pod
    assert MPS_DAEMONSET["spec"]["updateStrategy"] == {"type": "OnDelete"}
    plain = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert set(plain["NVIDIA_DRIVER_CAPABILITIES"].split(",")) == {"compute", "utility"}
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert "agent-mps-daemonset.yaml" in (BASE / "kustomization.yaml").read_text()


def test_the_mps_agent_serves_its_csi_driver_to_the_kubelet() -> None:
    """The csi container: privileged (bind mounts propagated into the kubelet's pod folders),
    its sockets where the kubelet's plugin watcher and the CSIDriver's name put them."""
    from mpijob.agent import csi_server

    pod = MPS_DAEMONSET["spec"]["template"]["spec"]
    c = container(MPS_DAEMONSET, "csi")
    assert c["command"] == ["mpijob-agent-csi"]
    assert SCRIPTS["mpijob-agent-csi"] == "mpijob.agent.csi_server:main"
    assert field_env(c) == {"NODE_NAME": "spec.nodeName"}
    assert c["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}
    params = csi_server.main.make_context("mpijob-agent-csi", ["--node-name", "n"]).params
    kubelet = params["kubelet_dir"]
    assert params["mps_root"] == keys.MPS_ROOT
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    csi_socket, registration = csi_server.sockets(kubelet)
    for path in (
        keys.MPS_ROOT,
        f"{kubelet}/pods",
        *map(os.path.dirname, (csi_socket, registration)),
    ):
        assert volumes[mounts[path]["name"]] == path
    assert mounts[keys.MPS_ROOT]["readOnly"] is True
    assert mounts[f"{kubelet}/pods"]["mountPropagation"] == "Bidirectional"
    driver = one(BASE / "csi-driver.yaml", "CSIDriver")
    assert driver["metadata"]["name"] == keys.MPS_CSI_DRIVER
    assert driver["spec"]["podInfoOnMount"] is True
    assert driver["spec"]["volumeLifecycleModes"] == ["Ephemeral"]
    assert driver["spec"]["attachRequired"] is False
    assert "csi-driver.yaml" in (BASE / "kustomization.yaml").read_text()


def test_agent_mounts_the_kubelets_pod_resources_folder_read_only() -> None:
    pod = DAEMONSET["spec"]["template"]["spec"]
    c = container(DAEMONSET)
    assert c["volumeMounts"] == [
        {
            "name": "pod-resources",
            "mountPath": "/var/lib/kubelet/pod-resources",
            "readOnly": True,
        }
    ]
    assert pod["volumes"] == [
        {
            "name": "pod-resources",
            "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"},
        }
    ]
    # The mount is where the agent's check looks by default.
    ctx = agent_main.main.make_context("mpijob-agent", list(c["args"]))
    assert ctx.params["pod_resources_socket"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert ctx.params["check_pods"] is True


def test_entry_points_used_by_the_manifests_and_the_image_exist() -> None:
    assert SCRIPTS["mpijob-operator"] == "mpijob.cli:main"
    assert SCRIPTS["mpijob-agent"] == "mpijob.agent.main:main"
    assert SCRIPTS["mpijob"] == SCRIPTS["kubectl-mpijob"] == "mpijob.console.main:main"


def test_dockerfile_builds_a_slim_non_root_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [
        line.split(maxsplit=1)
        for line in re.sub(r"\\\n", " ", text).splitlines()
        if line.strip() and not line.startswith("#")
    ]
    bases = [rest for op, rest in instructions if op == "FROM"]
    # Debian's python3 in both stages, as hack/operator_image.py builds it for the real nodes.
    assert bases == [
        "golang:1.26-bookworm AS launch",  # mpijob-launch, a static Go binary
        "debian:bookworm-slim AS build",
        "debian:bookworm-slim",
    ]
    assert [rest for op, rest in instructions if op == "USER"] == ["65532:65532"]
    assert [rest for op, rest in instructions if op == "ENTRYPOINT"] == ['["mpijob-operator"]']
    assert [rest for op, rest in instructions if op == "CMD"] == ['["--help"]']
    installs = [rest for op, rest in instructions if op == "RUN" and "pip install" in rest]
    assert installs == ["/opt/mpijob/bin/pip install /src"]  # no editable install, no extras


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies() -> None:
    text = (ROOT / "Dockerfile").read_text()
    copied = {
        source
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for source in line.split()[1:-1]
    }
    assert copied == {"pyproject.toml", "README.md", "operator", "launch"}
    for source in copied:
        assert (ROOT / source).exists()
    patterns = (ROOT / ".dockerignore").read_text().split()
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    assert "*" in patterns
    assert allowed == copied


def test_every_overlay_is_a_kustomization_over_the_base() -> None:
    overlays = ROOT / "manifests" / "overlays"
    names = sorted(p.name for p in overlays.iterdir() if p.is_dir())
    assert names == [
        "fractional-gpus",
        "kubeflow",
        "monitoring",
        "scheduler-plugins",
        "standalone",
        "volcano",
    ]
    for name in names:
        kustomization = yaml.safe_load((overlays / name / "kustomization.yaml").read_text())
        resources = kustomization["resources"]
        assert "../../base" in resources or "../standalone" in resources


def test_agent_daemonset_probes_its_health_endpoint() -> None:
    c = container(one(BASE / "agent-daemonset.yaml", "DaemonSet"))
    assert "--health-port=8081" in c["args"]
    assert c["ports"] == [{"name": "health", "containerPort": 8081, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_fractional_gpus_overlay_serves_the_webhooks_its_configurations_name() -> None:
    from mpijob.settings import OperatorSettings
    from mpijob.shares.pod_edits import WEBHOOK_CONFIGURATION

    overlay = ROOT / "manifests" / "overlays" / "fractional-gpus"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    ops = yaml.safe_load(kustomization["patches"][0]["patch"])
    values = [op["value"] for op in ops]
    assert "--fractional-gpus" in values
    port = next(v for v in values if isinstance(v, dict))
    flags = [v for v in values if isinstance(v, str)]
    args = [*container(DEPLOYMENT)["args"], *flags]
    params = cli.run.make_context("run", args[1:]).params
    assert params["fractional_gpus"]
    # The RuntimeClass the base's agent DaemonSets run under is the one share pods get.
    agent = one(ROOT / "manifests" / "base" / "agent-mps-daemonset.yaml", "DaemonSet")
    runtime_class = agent["spec"]["template"]["spec"]["runtimeClassName"]
    assert params["gpu_share_runtime_class"] == runtime_class
    assert port["containerPort"] == params["webhook_port"] == OperatorSettings().webhook_port
    service = one(overlay / "webhook-service.yaml", "Service")
    assert service["metadata"]["name"] == params["webhook_service"]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]
    assert service["spec"]["selector"] == DEPLOYMENT["spec"]["selector"]["matchLabels"]
    role = one(overlay / "webhook-rbac.yaml", "ClusterRole")
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named[0]["resourceNames"] == [WEBHOOK_CONFIGURATION]
    # Placing a pod that waited is one patch of it (the base role cannot patch pods).
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]} in role["rules"]

"""Every file of examples/ applied to the local cluster with our operator, to its end state.

The files are applied as users apply them, with one addition: the Launcher's pod template gets
``mpijob.io/sim-succeed-after``, because the simulated cluster ends a pod only when told to
(examples/README.md). A job created suspended must report Suspended and start no pod; every
other job must succeed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import keys
from support import lanes
from support.kube import ROOT, Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = pytest.mark.integration

#: Examples holding GPU shares need --fractional-gpus and core_mem nodes: test_fractional.py runs
#: them.
EXAMPLES = sorted(
    p for p in (ROOT / "examples").glob("*.yaml") if keys.GPU_MEM_RESOURCE not in p.read_text()
)
#: Namespace labels an example is meant to run under (the Pod Security level it claims).
NAMESPACE_LABELS = {
    "pi-restricted.yaml": {"pod-security.kubernetes.io/enforce": "restricted"},
    "pi-no-sshd.yaml": {"pod-security.kubernetes.io/enforce": "restricted"},
}
#: The launch agent's image, for the examples launched without sshd: the simulated nodes run
#: no container, so any name does (test_launch_agent.py runs them on the real nodes).
LAUNCH_IMAGE = "mpijob.local/mpijob-operator:examples"


def simulated(body: dict[str, Any]) -> dict[str, Any]:
    """The job as written, with the launcher told to succeed 2 s after it starts."""
    job = copy.deepcopy(body)
    template = job["spec"]["mpiReplicaSpecs"][keys.REPLICA_LAUNCHER]["template"]
    metadata = template.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[keys.SIM_SUCCEED_AFTER] = "2s"
    return job


def expected_condition(body: dict[str, Any]) -> str:
    return keys.COND_SUSPENDED if body["spec"].get("runPolicy", {}).get("suspend") else "Succeeded"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_reaches_its_end_state(
    crds: Cluster,
    namespace: str,
    mpijobs: MPIJobs,
    path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if keys.GPU_RESOURCE in path.read_text():
        # Only the GPU lane waits for idle GPUs; the examples that ask for none run beside it.
        assert lanes.lane(request.node.nodeid) == lanes.GPUS, "GPUs asked: lanes.TESTS is stale"
        request.getfixturevalue("idle_gpus")
    body = yaml.safe_load(path.read_text())
    operator: OperatorProcess
    if body["metadata"].get("annotations", {}).get(keys.LAUNCH) == keys.LAUNCH_AGENT:
        operator = request.getfixturevalue("start_operator")("--launch-image", LAUNCH_IMAGE)
    else:
        operator = request.getfixturevalue("operator")
    if labels := NAMESPACE_LABELS.get(path.name):
        crds.core.patch_namespace(namespace, {"metadata": {"labels": labels}})
    crds.apply(simulated(body), namespace=namespace)
    name = body["metadata"]["name"]
    condition = expected_condition(body)
    mpijobs.wait_condition(name, condition, timeout=180)
    pods = crds.core.list_namespaced_pod(
        namespace, label_selector=f"{keys.LABEL_JOB_NAME}={name}"
    ).items
    if condition == keys.COND_SUSPENDED:
        assert pods == []
        running = mpijobs.condition(name, "Running") or {}
        assert running.get("status") != "True"
    else:
        launchers = [p for p in pods if p.metadata.labels[keys.LABEL_JOB_ROLE] == "launcher"]
        assert [p.status.phase for p in launchers] == ["Succeeded"]
        assert operator.alive()


def test_suspended_example_runs_once_resumed(
    crds: Cluster, namespace: str, operator: OperatorProcess, mpijobs: MPIJobs
) -> None:
    """The suspended example's own instructions (resume with a patch) lead to Succeeded."""
    body = yaml.safe_load((ROOT / "examples" / "pi-suspended.yaml").read_text())
    crds.apply(simulated(body), namespace=namespace)
    mpijobs.wait_condition("pi-suspended", keys.COND_SUSPENDED, timeout=60)
    mpijobs.patch("pi-suspended", {"spec": {"runPolicy": {"suspend": False}}})
    mpijobs.wait_condition("pi-suspended", "Succeeded", timeout=120)
    wait_until(
        lambda: mpijobs.condition("pi-suspended", keys.COND_SUSPENDED)["status"] == "False",
        what="Suspended=False",
    )

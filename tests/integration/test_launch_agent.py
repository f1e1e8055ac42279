"""Launch without sshd (``mpijob.io/launch: agent``) on the real nodes, and who cannot use it.

Every job here runs in a namespace that enforces the ``restricted`` Pod Security Standard, as
uid 1000, from images that have no sshd (hack/images.py's ``-nosshd`` images: their base with
sshd deleted), with the operator's launch agent copied in from the operator's own image
(hack/operator_image.py, imported into the real nodes). What is checked is what MPI made of it:
every rank on a worker, none on the launcher, and no SSH Secret anywhere.

The hostile tests put the agent in the hands of those who must not get through: a pod of the
job's namespace with keys of its own (and the workers' public key, as if it had learnt it), a
tenant's pod in another namespace, and the launcher of another job. Each is refused and runs
nothing in the worker, while the job's own launcher, asked the same, gets through (so the refusals
are not a channel that works for no one). Replaying a captured connection is tested against the
binary itself (tests/unit/launch).
"""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack import incluster, realnode
from mpijob import keys
from mpijob.desired import launch
from support import realnode as realnode_support
from support.kube import ROOT, Cluster, kubectl_binary
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.realnode import launcher_log, on_real_node, pods, ready_real_node, with_image
from support.tenants import TenantJobs, bind_tenant
from support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

TIMEOUT = 300
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
TENANT = "launch-tenant@example.com"
OUTSIDER = "launch-outsider@example.com"
#: What a hostile run would leave in the worker, were it let through.
MARK = "/tmp/launched-by-a-stranger"


@pytest.fixture(scope="module")
def launch_image(cluster: Cluster) -> str:
    """The operator's image (with the launch agent), built if its recipe changed and imported
    into every real node: what an installed operator would give its jobs."""
    ready_real_node(cluster)
    return incluster.load_image(incluster.nodes())


@pytest.fixture
def agent_operator(start_operator: Any, launch_image: str) -> OperatorProcess:
    op: OperatorProcess = start_operator("--launch-image", launch_image)
    return op


@pytest.fixture
def restricted(crds: Cluster, namespace: str) -> str:
    crds.core.patch_namespace(namespace, {"metadata": {"labels": RESTRICTED}})
    return namespace


def example(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
    return body


def no_sshd(body: dict[str, Any], flavour: str, name: str) -> dict[str, Any]:
    """``body`` (an example launched by the agent) under ``name``, every container on the
    no-sshd image of ``flavour`` (:func:`with_image`), and its workers kept after the end
    (``cleanPodPolicy: None``) so the test can look inside them."""
    image = realnode.images.reference(f"{flavour}{realnode.images.NOSSHD_SUFFIX}")
    body = with_image(body, image, name)
    body["spec"]["runPolicy"]["cleanPodPolicy"] = "None"
    return on_real_node(body)


def run_to_success(crds: Cluster, mpijobs: MPIJobs, namespace: str, body: dict[str, Any]) -> str:
    return realnode_support.run_to_success(crds, mpijobs, namespace, body, TIMEOUT)


def in_pod(
    crds: Cluster, namespace: str, pod: str, script: str
) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` in the pod's first container, as the cluster's admin would look."""
    return subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(crds.kubeconfig), "exec", pod,
         "-n", namespace, "--", "sh", "-c", script],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def assert_workers_have_no_sshd_and_serve_as_uid_1000(
    crds: Cluster, namespace: str, workers: list[str]
) -> None:
    for worker in workers:
        out = in_pod(
            crds,
            namespace,
            worker,
            "for f in /usr/sbin/sshd /usr/lib/openssh/sshd-session; do test ! -e $f || echo $f; "
            "done; command -v sshd; grep '^Uid:' /proc/1/status; tr '\\0' ' ' </proc/1/cmdline",
        )
        assert out.returncode != 0 or "sshd" not in out.stdout.split("Uid:")[0], out.stdout
        lines = out.stdout.splitlines()
        uid = next(line for line in lines if line.startswith("Uid:")).split()[1:]
        assert set(uid) == {"1000"}, out.stdout
        assert lines[-1].split() == [launch.BINARY, "serve"], out.stdout


def assert_no_ssh_secret(crds: Cluster, namespace: str, job: str) -> None:
    secrets = crds.core.list_namespaced_secret(namespace).items
    assert not [s.metadata.name for s in secrets if s.type == "kubernetes.io/ssh-auth"]
    (keys_secret,) = [s for s in secrets if s.metadata.name == f"{job}-launch"]
    assert keys_secret.type == launch.SECRET_TYPE


def assert_ranks_on_workers(log: str, hosts: list[str]) -> None:
    """pi's output: one rank on each worker, rank 0's estimate from all of them."""
    assert f"Workers: {len(hosts)}" in log, log
    ranks = [line.split() for line in log.splitlines() if line.startswith("Rank ")]
    assert sorted(r[-1] for r in ranks) == sorted(hosts), log
    estimate = [line for line in log.splitlines() if line.startswith("pi is approximately")]
    assert len(estimate) == 1, log
    assert abs(float(estimate[0].split()[-1]) - 3.14159) < 0.01, log


# --- every implementation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flavour", "implementation", "version"),
    [
        ("openmpi", keys.IMPL_OPENMPI, "mpirun (Open MPI) 5."),
        ("openmpi4", keys.IMPL_OPENMPI, "mpirun (Open MPI) 4.1."),
        ("mpich", keys.IMPL_MPICH, "HYDRA build details"),
        ("intel", keys.IMPL_INTEL, "Intel(R) MPI Library"),
    ],
    ids=["openmpi5", "openmpi4", "mpich", "intel"],
)
@pytest.mark.usefixtures("agent_operator")
def test_pi_runs_on_the_workers_with_no_sshd_as_uid_1000_under_restricted(
    crds: Cluster,
    restricted: str,
    mpijobs: MPIJobs,
    flavour: str,
    implementation: str,
    version: str,
) -> None:
    namespace = restricted
    name = f"pi-{flavour}"
    body = no_sshd(example("pi-no-sshd.yaml"), flavour, name)
    body["spec"]["mpiImplementation"] = implementation
    log = run_to_success(crds, mpijobs, namespace, body)
    assert version in log, log
    workers = [f"{name}-worker-0", f"{name}-worker-1"]
    assert_ranks_on_workers(log, workers)
    assert_no_ssh_secret(crds, namespace, name)
    assert_workers_have_no_sshd_and_serve_as_uid_1000(crds, namespace, workers)


@pytest.mark.usefixtures("agent_operator")
def test_the_pytorch_example_trains_on_both_workers_with_no_sshd(
    crds: Cluster, restricted: str, mpijobs: MPIJobs
) -> None:
    namespace = restricted
    body = example("pytorch-cpu.yaml")
    body["metadata"]["annotations"] = {keys.LAUNCH: keys.LAUNCH_AGENT}
    for spec in body["spec"]["mpiReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        pod["securityContext"] = {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for c in pod["containers"]:
            c["securityContext"] = {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
    body = no_sshd(body, "pytorch", "pytorch-no-sshd")
    log = run_to_success(crds, mpijobs, namespace, body)
    checksums = [line for line in log.splitlines() if "checksum" in line.lower()]
    assert len(checksums) == 2, log
    assert len({line.split()[-1] for line in checksums}) == 1, log
    workers = ["pytorch-no-sshd-worker-0", "pytorch-no-sshd-worker-1"]
    assert_no_ssh_secret(crds, namespace, "pytorch-no-sshd")
    assert_workers_have_no_sshd_and_serve_as_uid_1000(crds, namespace, workers)


@pytest.mark.usefixtures("agent_operator")
def test_a_worker_added_while_running_is_in_discover_hosts_and_runs_a_rank(
    crds: Cluster, restricted: str, mpijobs: MPIJobs
) -> None:
    """Elastic jobs (Horovod's discover_hosts.sh) launch into a worker added later as well."""
    namespace = restricted
    body = no_sshd(example("pi-no-sshd.yaml"), "openmpi", "pi-grow")
    launcher = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    # Wait (up to 3 min) for a third host in discover_hosts.sh, then run pi on all three.
    launcher["args"] = [
        "sh",
        "-c",
        "for i in $(seq 360); do"
        "  if [ $(/etc/mpi/discover_hosts.sh | wc -l) -ge 3 ]; then"
        "    echo discovered:; /etc/mpi/discover_hosts.sh; exec mpirun -n 3 /home/mpiuser/pi;"
        "  fi; sleep 0.5; done; echo never saw 3 hosts; exit 1",
    ]
    crds.apply(body, namespace=namespace)
    wait_until(
        lambda: (
            [p.status.phase for p in pods(crds, namespace, "pi-grow", keys.ROLE_LAUNCHER)]
            == ["Running"]
        ),
        timeout=TIMEOUT,
        what="the launcher running",
    )
    mpijobs.patch("pi-grow", {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 3}}}})
    mpijobs.wait_condition("pi-grow", keys.COND_SUCCEEDED, timeout=TIMEOUT)
    log = launcher_log(crds, namespace, "pi-grow")
    discovered = log.split("discovered:", 1)[1].split("Workers:", 1)[0]
    assert f"pi-grow-worker-2.pi-grow.{namespace}.svc" in discovered, log
    assert_ranks_on_workers(log, ["pi-grow-worker-0", "pi-grow-worker-1", "pi-grow-worker-2"])


# --- who cannot get through ---------------------------------------------------------------------


def waiting_job(name: str) -> dict[str, Any]:
    """A job launched by the agent whose launcher only waits: its workers serve, and stay."""
    body = no_sshd(example("pi-no-sshd.yaml"), "openmpi", name)
    launcher = body["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["args"] = ["sleep", "600"]
    return body


def attacker_pod(name: str, image: str, secret: str, target: str) -> dict[str, Any]:
    """A restricted pod that runs the agent, with the launcher's key files from ``secret``,
    against ``target``: it prints the agent's exit status."""
    script = f"{launch.IMAGE_BINARY} {target} touch {MARK}; echo exit=$?"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {realnode.ROLE: "true"},
            "tolerations": [{"key": realnode.ROLE, "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sh", "-c", script],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "keys", "mountPath": launch.KEYS_DIR}],
                }
            ],
            "volumes": [
                {
                    "name": "keys",
                    "secret": {
                        "secretName": secret,
                        "items": [
                            {"key": launch.LAUNCHER_KEY, "path": launch.CLIENT_KEY_FILE},
                            {
                                "key": launch.WORKER_PUBLIC_KEY,
                                "path": launch.KNOWN_HOST_KEY_FILE,
                            },
                        ],
                    },
                }
            ],
        },
    }


def forged_keys(crds: Cluster, namespace: str, job: str) -> dict[str, str]:
    """Keys of the attacker's own, with the job's real worker public key: the server, not the
    agent's host check, must be what refuses it."""
    real = crds.core.read_namespaced_secret(f"{job}-launch", namespace).data
    own = {k: base64.b64encode(v).decode() for k, v in launch.generate_keys().items()}
    return {**own, launch.WORKER_PUBLIC_KEY: real[launch.WORKER_PUBLIC_KEY]}


def finished_log(crds: Cluster, namespace: str, pod: str) -> str:
    wait_until(
        lambda: (
            crds.core.read_namespaced_pod(pod, namespace).status.phase in ("Succeeded", "Failed")
        ),
        timeout=TIMEOUT,
        what=f"pod {pod} to finish",
    )
    return str(crds.core.read_namespaced_pod_log(pod, namespace))


def assert_nothing_ran(crds: Cluster, namespace: str, worker: str) -> None:
    out = in_pod(crds, namespace, worker, f"test ! -e {MARK} && echo clean")
    assert out.stdout.strip() == "clean", (out.stdout, out.stderr)


@pytest.fixture
def running_job(
    crds: Cluster, restricted: str, mpijobs: MPIJobs, agent_operator: OperatorProcess
) -> str:
    """A job whose two workers serve the launch agent, and whose launcher is running."""
    crds.apply(waiting_job("victim"), namespace=restricted)
    wait_until(
        lambda: (
            all(
                p.status.phase == "Running"
                for p in pods(crds, restricted, "victim", keys.ROLE_LAUNCHER)
                + pods(crds, restricted, "victim", keys.ROLE_WORKER)
            )
            and len(pods(crds, restricted, "victim", keys.ROLE_WORKER)) == 2
        ),
        timeout=TIMEOUT,
        what="the victim's launcher and workers to run",
    )
    return "victim"


def victim_worker(namespace: str) -> str:
    return f"victim-worker-0.victim.{namespace}.svc.cluster.local"


def test_the_jobs_own_launcher_gets_through(
    crds: Cluster, restricted: str, running_job: str
) -> None:
    """The control for the refusals below: the same request from the job's launcher runs."""
    (launcher,) = pods(crds, restricted, running_job, keys.ROLE_LAUNCHER)
    out = in_pod(
        crds,
        restricted,
        launcher.metadata.name,
        # ssh's options, as mpirun passes them, are taken and ignored.
        f"{launch.BINARY} -x -o ConnectionAttempts=10 {victim_worker(restricted)} "
        "'id -u; hostname'",
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert out.stdout.split() == ["1000", "victim-worker-0"]


def test_a_pod_of_the_namespace_without_the_jobs_key_runs_nothing(
    crds: Cluster, restricted: str, running_job: str, launch_image: str
) -> None:
    user = bind_tenant(crds, restricted, TENANT)
    tenant = TenantJobs(crds, restricted, user)
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="stolen"),
        data=forged_keys(crds, restricted, running_job),
    )
    tenant.core.create_namespaced_secret(restricted, secret)
    tenant.create_pod(attacker_pod("intruder", launch_image, "stolen", victim_worker(restricted)))
    log = finished_log(crds, restricted, "intruder")
    assert "exit=255" in log, log
    assert "unable to authenticate" in log or "authenticat" in log, log
    assert_nothing_ran(crds, restricted, "victim-worker-0")


def test_a_tenant_of_another_namespace_runs_nothing(
    crds: Cluster,
    restricted: str,
    running_job: str,
    launch_image: str,
    request: pytest.FixtureRequest,
) -> None:
    other = f"{restricted[:50]}-x"
    crds.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=other, labels=RESTRICTED))
    )
    request.addfinalizer(lambda: crds.delete_namespace(other))
    outsider = TenantJobs(crds, other, bind_tenant(crds, other, OUTSIDER))
    # The job's Secret is out of its reach...
    with pytest.raises(ApiException) as refused:
        outsider.core.read_namespaced_secret(f"{running_job}-launch", restricted)
    assert refused.value.status == 403
    # ...and knowing the workers' public key (it is no secret to rely on) gets it nowhere.
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name="own"), data=forged_keys(crds, restricted, running_job)
    )
    outsider.core.create_namespaced_secret(other, secret)
    outsider.create_pod(attacker_pod("outsider", launch_image, "own", victim_worker(restricted)))
    log = finished_log(crds, other, "outsider")
    assert "exit=255" in log, log
    assert_nothing_ran(crds, restricted, "victim-worker-0")


def test_the_launcher_of_another_job_runs_nothing_in_this_jobs_workers(
    crds: Cluster, restricted: str, running_job: str
) -> None:
    crds.apply(waiting_job("other"), namespace=restricted)
    wait_until(
        lambda: (
            [p.status.phase for p in pods(crds, restricted, "other", keys.ROLE_LAUNCHER)]
            == ["Running"]
        ),
        timeout=TIMEOUT,
        what="the other job's launcher to run",
    )
    (launcher,) = pods(crds, restricted, "other", keys.ROLE_LAUNCHER)
    out = in_pod(
        crds,
        restricted,
        launcher.metadata.name,
        f"{launch.BINARY} {victim_worker(restricted)} touch {MARK}",
    )
    assert out.returncode == 255, (out.returncode, out.stdout, out.stderr)
    assert "victim-worker-0" in out.stderr, out.stderr
    assert_nothing_ran(crds, restricted, "victim-worker-0")
    # Its own workers, the same way, let it in.
    own = f"other-worker-0.other.{restricted}.svc.cluster.local"
    assert (
        in_pod(crds, restricted, launcher.metadata.name, f"{launch.BINARY} {own} true").returncode
        == 0
    )

"""The ``mpijob`` command line without a cluster: dry runs, flag handling, errors, plain output."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from mpijob import keys
from mpijob.console import main, submit
from mpijob.console.kube import ConsoleError
from mpijob.placement import codec, topologies
from support.console_objects import condition, job_body, pod_body, topology_job_pods

pytestmark = pytest.mark.unit

ANSI = re.compile(r"\x1b\[")
ARENA_FLAGS = [
    "--name=vgg16",
    "--workers=4",
    "--gpus=1",
    "--gang",
    "--gputopology=true",
    "--image=horovod/horovod:0.28.1",
]
COMMAND = ["python", "pytorch_synthetic_benchmark.py", "--model", "vgg16"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main.main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_prints_the_mpijob_that_submit_would_create() -> None:
    code, out, _ = run("submit", *ARENA_FLAGS, "-n", "team-a", "--dry-run", "--", *COMMAND)
    assert code == 0
    expected = submit.SubmitOptions(
        name="vgg16",
        image="horovod/horovod:0.28.1",
        command=tuple(COMMAND),
        workers=4,
        gpus=1,
        gang=True,
        gputopology=True,
        namespace="team-a",
    )
    assert yaml.safe_load(out) == submit.build_mpijob(expected)
    assert not ANSI.search(out)


def test_command_options_after_the_image_belong_to_the_command() -> None:
    """Arena's style: the command follows the flags, its own options unparsed."""
    code, out, _ = run("submit", "--name=a", "--image=i", "--dry-run", "python", "x.py", "--lr=1")
    assert code == 0
    launcher = yaml.safe_load(out)["spec"]["mpiReplicaSpecs"]["Launcher"]
    assert launcher["template"]["spec"]["containers"][0]["command"][-3:] == [
        "python",
        "x.py",
        "--lr=1",
    ]


@pytest.mark.parametrize(
    ("flag", "expected"), [("--gputopology", True), ("--gputopology=false", False)]
)
def test_gputopology_alone_means_true(flag: str, expected: bool) -> None:
    code, out, _ = run("submit", "--name=a", "--image=i", flag, "--dry-run", "--", "hostname")
    assert code == 0
    annotations = yaml.safe_load(out)["metadata"].get("annotations") or {}
    assert (annotations.get(keys.GPU_TOPOLOGY) == "true") is expected


#: Seed 000's submit, as its user types it (arena's `submit mpijob` form, the command quoted).
SEED_000 = [
    "submit",
    "mpijob",
    "--name=pytorch-topo-4-vgg16",
    "--gpus=1",
    "--workers=4",
    "--gang",
    "--gputopology=true",
    "--image=mpijob.local/pytorch-benchmark:openmpi",
    "mpirun --allow-run-as-root -np 4 -bind-to none -map-by slot -x NCCL_DEBUG=INFO python "
    "/examples/pytorch_synthetic_benchmark.py --model=vgg16 --batch-size=64",
]


@pytest.mark.parametrize("job_type", ["mpijob", "mpi"])
def test_seed_000s_submit_runs_its_quoted_mpirun_command_as_the_launcher(job_type: str) -> None:
    code, out, err = run(*[job_type if a == "mpijob" else a for a in SEED_000], "--dry-run")
    assert code == 0, err
    job = yaml.safe_load(out)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == SEED_000[-1].split()
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 5}
    assert "note:" not in err  # --gputopology: the operator's own admission honours --gang


def test_gang_without_topology_or_a_gang_scheduler_is_explained() -> None:
    code, out, err = run("submit", "--name=a", "--image=i", "--gang", "--dry-run", "--", "ls")
    assert code == 0
    assert yaml.safe_load(out)["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    assert "--gang sets schedulingPolicy.minAvailable=2" in err
    assert "--gang-scheduling" in err


@pytest.mark.parametrize("flag", ["--type", "-T"])
def test_get_accepts_arenas_type_mpijob(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _, err = run("get", "x", flag, "mpijob", "--kubeconfig", str(tmp_path / "missing"))
    # Past the option parsing, to the cluster, which this test has none of.
    assert code == 1
    assert err.startswith("error: no cluster configured")


def test_get_refuses_a_type_other_than_mpijob() -> None:
    code, _, err = run("get", "x", "--type", "tfjob")
    assert code == 2
    assert "MPIJobs only" in err


def test_annotations_must_be_key_value() -> None:
    code, _, err = run("submit", "--name=a", "--image=i", "--annotation=x", "--dry-run", "--", "ls")
    assert code == 2
    assert "'x' is not KEY=VALUE" in err


def test_submit_needs_a_command() -> None:
    code, _, err = run("submit", "--name=a", "--image=i", "--dry-run")
    assert code == 2
    assert "COMMAND" in err


def test_no_cluster_is_one_line_on_stderr_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, out, err = run("get", "vgg16", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 1
    assert out == ""
    assert err.startswith("error: no cluster configured")
    assert len(err.strip().splitlines()) == 1
    assert not ANSI.search(err)


def test_piped_console_has_no_colour_and_no_width_limit() -> None:
    console = main.make_console()
    assert not console.is_terminal
    assert console.color_system is None
    assert console.width == main.PIPED_WIDTH


class FakeApi:
    """Stands in for :class:`mpijob.console.kube.Api`: serves fixed jobs and pods."""

    def __init__(self, jobs: list[dict[str, Any]], pods: list[dict[str, Any]], namespace: str):
        self.jobs, self.pods, self.namespace = jobs, pods, namespace
        self.claims: list[dict[str, Any]] = CLAIMS
        self.nodes: dict[str, dict[str, Any]] = NODES

    def _here(self, body: dict[str, Any], all_namespaces: bool) -> bool:
        return all_namespaces or body["metadata"]["namespace"] == self.namespace

    def list_jobs(self, *, all_namespaces: bool = False) -> list[dict[str, Any]]:
        return [j for j in self.jobs if self._here(j, all_namespaces)]

    def job_pods(
        self, job: str | None = None, *, all_namespaces: bool = False
    ) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods
            if self._here(p, all_namespaces)
            and job in (None, p["metadata"]["labels"][keys.LABEL_JOB_NAME])
        ]

    def get_job(self, name: str) -> dict[str, Any]:
        for job in self.list_jobs():
            if job["metadata"]["name"] == name:
                return job
        raise ConsoleError(f"MPIJob {self.namespace}/{name} not found")

    def get_decision(self, name: str) -> dict[str, Any] | None:
        return None

    def job_claims(self, job: str) -> list[dict[str, Any]]:
        return [
            c
            for c in self.claims
            if c["metadata"]["namespace"] == self.namespace
            and c["metadata"]["labels"][keys.LABEL_JOB_NAME] == job
        ]

    def node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise ConsoleError(f"node {name} not found")
        return self.nodes[name]


#: ResourceClaims and Nodes the fake API serves (tests fill them; emptied between tests).
CLAIMS: list[dict[str, Any]] = []
NODES: dict[str, dict[str, Any]] = {}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Jobs and pods the commands see; namespace team-a unless -n names another."""
    jobs: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    CLAIMS.clear()
    NODES.clear()
    monkeypatch.setattr(
        main, "Api", lambda _kubeconfig, namespace: FakeApi(jobs, pods, namespace or "team-a")
    )
    return jobs, pods


def test_list_all_namespaces_has_a_namespace_column_and_every_namespaces_jobs(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    jobs, pods = cluster
    jobs += [job_body("vgg16"), job_body("resnet", namespace="team-b", workers=2, gpus=2)]
    pods += [*topology_job_pods(), pod_body("resnet-worker-0", job="resnet", namespace="team-b")]
    code, out, _ = run("list", "-A")
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    # DURATION runs to the wall clock's now; every other column is fixed.
    assert [row[:4] + row[5:] for row in rows] == [
        ["NAMESPACE", "NAME", "STATUS", "TRAINER", "GPU(Requested)", "NODE"],
        ["team-a", "vgg16", "PENDING", "MPIJOB", "4", "gpu-node-1"],
        ["team-b", "resnet", "PENDING", "MPIJOB", "4", "N/A"],
    ]
    code, out, _ = run("list", "-n", "team-b")
    assert code == 0
    assert out.split()[0] == "NAME"
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["resnet"]


def test_list_all_namespaces_with_none_says_so(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    code, out, _ = run("list", "--all-namespaces")
    assert (code, out) == (0, "No MPIJobs in any namespace.\n")


def test_list_refuses_a_namespace_together_with_all_namespaces(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    code, out, err = run("list", "-A", "-n", "team-a")
    assert code == 2
    assert out == ""
    assert "--namespace and --all-namespaces cannot be used together" in err


def test_get_of_a_succeeded_job_whose_pods_are_gone_shows_the_gpus_it_requested(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    jobs, _ = cluster
    succeeded = [condition("Running", "False"), condition("Succeeded")]
    jobs.append(job_body(conditions=succeeded, completion="2026-03-01T11:59:30Z", gpus=2))
    code, out, _ = run("get", "vgg16")
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.splitlines()[:7])
    assert (fields["Status"].strip(), fields["GPUs"].strip()) == ("SUCCEEDED", "8")
    assert "Instances: none left" in out


def test_get_shows_what_each_workers_claim_got_and_what_it_really_holds(
    cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
) -> None:
    jobs, pods = cluster
    jobs.append(job_body(workers=2, gpus=2, conditions=[condition("Running")]))
    topology = topologies.for_node("dgx1-v100", "gpu-node-0")
    uuids = [g.uuid for g in topology.gpus]
    for index, gpus, allocated, actual in ((0, [0, 1], [0, 1], None), (1, [2, 3], [2, 3], [2, 7])):
        pod = pod_body(f"vgg16-worker-{index}", gpus=2, gpu_ids=f"{gpus[0]},{gpus[1]}")
        annotations = pod["metadata"]["annotations"]
        annotations[keys.GPU_UUIDS] = ",".join(str(uuids[g]) for g in gpus)
        annotations[keys.GPU_CLAIM] = f"vgg16-worker-{index}-gpus"
        if actual:
            annotations[keys.GPU_ACTUAL] = ",".join(str(uuids[g]) for g in actual)
        pods.append(pod)
        results = [
            {"driver": keys.NVIDIA_GPU_DRIVER, "pool": "gpu-node-0", "device": f"gpu-{g}"}
            for g in allocated
        ]
        CLAIMS.append(
            {
                "metadata": {
                    "name": f"vgg16-worker-{index}-gpus",
                    "namespace": "team-a",
                    "labels": {keys.LABEL_JOB_NAME: "vgg16"},
                },
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )
    NODES["gpu-node-0"] = {"metadata": {"annotations": {keys.GPU_TOPOLOGY: codec.dumps(topology)}}}
    code, out, _ = run("get", "vgg16")
    assert code == 0
    lines = out.splitlines()
    table = [line.split() for line in lines[lines.index("Instances:") + 1 : -1]]
    assert table[0] == [
        "NAME",
        "STATUS",
        "AGE",
        "IS_CHIEF",
        "GPU(Requested)",
        "GPU(IDs)",
        "GPU(Allocated)",
        "GPU(Actual)",
        "NODE",
    ]
    # AGE runs to the wall clock's now; the GPU columns are fixed.
    assert [row[5:] for row in table[1:]] == [
        ["0,1", "0,1", "N/A", "gpu-node-0"],
        ["2,3", "2,3", "2,7!", "gpu-node-0"],
    ]
    assert lines[-1].startswith("! not the GPUs placement chose")

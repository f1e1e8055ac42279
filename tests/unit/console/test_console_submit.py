"""The MPIJob that ``mpijob submit`` builds from arena's flags."""

from __future__ import annotations

import pytest
import yaml

from mpijob import api, keys
from mpijob.console import submit

pytestmark = pytest.mark.unit


def options(**changes: object) -> submit.SubmitOptions:
    base: dict[str, object] = {
        "name": "vgg16",
        "image": "horovod/horovod:0.28.1",
        "command": ("python", "pytorch_synthetic_benchmark.py", "--model", "vgg16"),
        "workers": 4,
        "gpus": 1,
        "namespace": "team-a",
    }
    return submit.SubmitOptions(**{**base, **changes})  # type: ignore[arg-type]


def test_gang_and_gputopology_set_min_available_and_the_annotation() -> None:
    job = submit.build_mpijob(options(gang=True, gputopology=True))
    assert job["metadata"]["annotations"] == {keys.GPU_TOPOLOGY: "true"}
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 5}


def test_ordinary_job_has_neither_annotation_nor_scheduling_policy() -> None:
    job = submit.build_mpijob(options())
    assert "annotations" not in job["metadata"]
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]


def test_workers_get_gpus_and_the_launcher_none() -> None:
    job = submit.build_mpijob(options(gpus=2, cpu="4", memory="16Gi"))
    specs = job["spec"]["mpiReplicaSpecs"]
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    assert specs["Worker"]["replicas"] == 4
    assert worker["resources"] == {"limits": {keys.GPU_RESOURCE: "2", "cpu": "4", "memory": "16Gi"}}
    assert "resources" not in launcher
    assert job["spec"]["slotsPerWorker"] == 2


def test_command_runs_under_mpirun_with_one_rank_per_gpu() -> None:
    command = submit.launcher_command(options(gpus=2))
    assert command[:3] == ["mpirun", "-np", "8"]
    assert command[-4:] == ["python", "pytorch_synthetic_benchmark.py", "--model", "vgg16"]
    assert "--allow-run-as-root" in command


def test_cpu_only_job_runs_one_rank_per_worker() -> None:
    assert submit.launcher_command(options(gpus=0))[:3] == ["mpirun", "-np", "4"]


def test_a_single_quoted_command_runs_through_a_shell() -> None:
    command = submit.launcher_command(options(command=("python train.py --epochs 3",)))
    assert command[-3:] == ["sh", "-c", "python train.py --epochs 3"]


def test_a_command_that_is_already_mpirun_is_kept() -> None:
    given = ("mpirun", "-n", "2", "/home/mpiuser/pi")
    assert submit.launcher_command(options(command=given)) == list(given)


@pytest.mark.parametrize("implementation", [keys.IMPL_INTEL, keys.IMPL_MPICH])
def test_other_implementations_get_no_openmpi_flags(implementation: str) -> None:
    command = submit.launcher_command(options(implementation=implementation))
    assert "--allow-run-as-root" not in command


def test_annotations_go_on_both_pod_templates() -> None:
    job = submit.build_mpijob(options(annotations={"a": "1"}))
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        assert replica["template"]["metadata"]["annotations"] == {"a": "1"}


@pytest.mark.parametrize("gang", [False, True])
def test_built_job_is_a_valid_mpijob(gang: bool) -> None:
    """The operator's own parser, defaulting and validation accept what submit creates."""
    job = api.with_defaults(api.parse(submit.build_mpijob(options(gang=gang))))
    assert api.validate(job) == []
    assert job.spec.worker_replicas == 4


def test_yaml_reads_back_unchanged() -> None:
    job = submit.build_mpijob(options(gang=True, gputopology=True))
    assert yaml.safe_load(submit.to_yaml(job)) == job


def test_parse_pairs() -> None:
    assert submit.parse_pairs(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(ValueError, match="'nokey' is not KEY=VALUE"):
        submit.parse_pairs(["nokey"])

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


#: Seed 000's command, quoted as one argument as arena's users type it.
SEED_COMMAND = (
    "mpirun --allow-run-as-root -np 4 -bind-to none -map-by slot -x NCCL_DEBUG=INFO python "
    "/examples/pytorch_synthetic_benchmark.py --model=vgg16 --batch-size=64"
)


def test_a_quoted_mpirun_command_is_the_launchers_command_not_nested() -> None:
    command = submit.launcher_command(options(command=(SEED_COMMAND,)))
    assert command == SEED_COMMAND.split()
    assert command.count("mpirun") == 1


def test_a_quoted_mpirun_command_with_shell_syntax_runs_through_a_shell_once() -> None:
    given = "mpirun -np 2 python train.py --out $HOME/out"
    assert submit.launcher_command(options(command=(given,))) == ["sh", "-c", given]


def test_mpirun_by_its_path_or_as_mpiexec_is_kept() -> None:
    for given in (("/usr/bin/mpirun", "-n", "2", "pi"), ("mpiexec -n 2 pi",)):
        command = submit.launcher_command(options(command=given))
        assert command[0] in ("/usr/bin/mpirun", "mpiexec"), command
        assert "-np" not in command, command


def test_a_quoted_command_with_unbalanced_quotes_goes_to_the_shell() -> None:
    given = "python train.py --name 'x"
    assert submit.launcher_command(options(command=(given,)))[-3:] == ["sh", "-c", given]


@pytest.mark.parametrize("job_type", ["mpijob", "mpi", "MPIJob"])
def test_arenas_job_type_in_front_of_the_command_is_dropped(job_type: str) -> None:
    assert submit.without_job_type((job_type, SEED_COMMAND)) == (SEED_COMMAND,)


def test_a_command_named_like_a_job_type_alone_is_kept() -> None:
    assert submit.without_job_type(("mpi",)) == ("mpi",)
    assert submit.without_job_type(("python", "mpi")) == ("python", "mpi")


def test_gang_without_topology_says_what_it_depends_on() -> None:
    note = submit.gang_note(options(gang=True))
    assert note is not None
    assert "minAvailable=5" in note
    assert "--gang-scheduling" in note
    assert submit.gang_note(options(gang=True, gputopology=True)) is None
    assert submit.gang_note(options()) is None

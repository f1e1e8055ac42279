"""The ``mpijob`` command line without a cluster: dry runs, flag handling, errors, plain output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mpijob import keys
from mpijob.console import main, submit

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

"""Launch without sshd (``mpijob.io/launch: agent``): what the pods, the launcher's env and the
job's Secret become, and that a job without the annotation is built exactly as before."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from mpijob import api, keys
from mpijob.api.launch import launch_errors
from mpijob.desired import launch, observed, sync
from mpijob.desired.launcher import build_launcher_job
from mpijob.desired.worker import build_worker
from support.desired_jobs import make_job

pytestmark = pytest.mark.unit

NOW = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
IMAGE = "registry.example/mpijob-operator:1"


def agent_job(implementation: str = keys.IMPL_OPENMPI, **kw: Any) -> api.MPIJob:
    job = make_job(implementation=implementation, **kw)
    job.metadata.annotations = {keys.LAUNCH: keys.LAUNCH_AGENT}
    return job


def launcher_spec(job: api.MPIJob) -> dict[str, Any]:
    built, _ = build_launcher_job(job, IMAGE)
    spec: dict[str, Any] = built["spec"]["template"]["spec"]
    return spec


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in spec["containers"][0].get("env") or []}


def key_items(spec: dict[str, Any]) -> dict[str, str]:
    (volume,) = [v for v in spec["volumes"] if v["name"] == launch.KEYS_VOLUME]
    assert volume["secret"]["secretName"] == "foo-launch"
    return {i["key"]: i["path"] for i in volume["secret"]["items"]}


@pytest.mark.parametrize("role", ["launcher", "worker"])
def test_an_agent_pod_gets_the_binary_from_a_restricted_init_container_and_no_ssh_keys(
    role: str,
) -> None:
    job = agent_job()
    spec = launcher_spec(job) if role == "launcher" else build_worker(job, 0, "", IMAGE)["spec"]
    (install, *_) = spec["initContainers"]
    assert install["image"] == IMAGE
    assert install["command"] == [launch.IMAGE_BINARY, "install", launch.BIN_DIR]
    security = install["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(v["name"] == "ssh-auth" for v in spec["volumes"])
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts[launch.BIN_DIR]["readOnly"] is True
    assert mounts[launch.KEYS_DIR]["readOnly"] is True


def test_each_role_mounts_only_its_own_private_key_and_the_other_roles_public_key() -> None:
    job = agent_job()
    assert key_items(launcher_spec(job)) == {
        launch.LAUNCHER_KEY: launch.CLIENT_KEY_FILE,
        launch.WORKER_PUBLIC_KEY: launch.KNOWN_HOST_KEY_FILE,
    }
    assert key_items(build_worker(job, 0, "", IMAGE)["spec"]) == {
        launch.WORKER_KEY: launch.HOST_KEY_FILE,
        launch.LAUNCHER_PUBLIC_KEY: launch.AUTHORIZED_KEY_FILE,
    }


def test_a_worker_serves_the_agent_instead_of_its_command_and_is_ready_when_it_listens() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "w", "image": "img", "command": ["/usr/sbin/sshd"], "args": ["-De"]}
            ]
        }
    }
    container = build_worker(agent_job(worker_template=template), 1, "", IMAGE)["spec"][
        "containers"
    ][0]
    assert container["command"] == [launch.BINARY, "serve"]
    assert "args" not in container
    assert container["readinessProbe"]["tcpSocket"] == {"port": launch.PORT}


def test_a_workers_own_readiness_probe_is_kept() -> None:
    probe = {"exec": {"command": ["true"]}}
    template = {"spec": {"containers": [{"name": "w", "image": "img", "readinessProbe": probe}]}}
    container = build_worker(agent_job(worker_template=template), 0, "", IMAGE)["spec"][
        "containers"
    ][0]
    assert container["readinessProbe"] == probe


@pytest.mark.parametrize(
    ("implementation", "wanted", "gone"),
    [
        (
            keys.IMPL_OPENMPI,
            {
                "OMPI_MCA_plm_rsh_agent": launch.BINARY,
                "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
                "PRTE_MCA_plm_ssh_agent": launch.BINARY,
                "PRTE_MCA_plm_ssh_no_tree_spawn": "1",
            },
            {"OMPI_MCA_plm_rsh_args", "PRTE_MCA_plm_ssh_args"},
        ),
        (
            keys.IMPL_INTEL,
            {"I_MPI_HYDRA_BOOTSTRAP": "ssh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": launch.BINARY},
            {"I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS"},
        ),
        (
            keys.IMPL_MPICH,
            {"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": launch.BINARY},
            {"HYDRA_LAUNCH_EXTRA_ARGS"},
        ),
    ],
)
def test_the_launchers_mpi_is_pointed_at_the_agent(
    implementation: str, wanted: dict[str, str], gone: set[str]
) -> None:
    env = env_of(launcher_spec(agent_job(implementation)))
    assert {k: env.get(k) for k in wanted} == wanted
    assert not gone & env.keys()
    # The hostfile is still the one the operator writes.
    plain = env_of(launcher_spec(make_job(implementation=implementation)))
    assert {k: v for k, v in plain.items() if k not in gone} == {
        k: v for k, v in env.items() if k not in wanted
    }


@pytest.mark.parametrize("implementation", [keys.IMPL_OPENMPI, keys.IMPL_INTEL, keys.IMPL_MPICH])
def test_a_job_without_the_annotation_is_built_as_before(implementation: str) -> None:
    job = make_job(implementation=implementation)
    sshd = make_job(implementation=implementation)
    sshd.metadata.annotations = {keys.LAUNCH: keys.LAUNCH_SSHD}
    for a, b in ((job, sshd),):
        assert build_launcher_job(a, IMAGE) == build_launcher_job(b, IMAGE)
        assert build_worker(a, 0, "", IMAGE) == build_worker(b, 0, "", IMAGE)
    spec = launcher_spec(job)
    assert "initContainers" not in spec
    assert any(v["name"] == "ssh-auth" for v in spec["volumes"])


def test_an_agent_job_gets_launch_keys_and_no_ssh_secret() -> None:
    job = agent_job()
    plan = sync.plan(job, sync.Observed(), NOW, sync.Options(launch_image=IMAGE))
    secrets = [
        a.obj for a in plan.actions if isinstance(a, sync.Create) and a.obj["kind"] == "Secret"
    ]
    (secret,) = secrets
    assert observed.name_of(secret) == "foo-launch"
    assert secret["type"] == launch.SECRET_TYPE
    assert set(secret["data"]) == launch.SECRET_KEYS
    assert not launch.secret_needs_regeneration(secret)
    pods = [a.obj for a in plan.actions if isinstance(a, sync.Create) and a.obj["kind"] == "Pod"]
    assert pods
    assert all(p["spec"]["initContainers"][0]["image"] == IMAGE for p in pods)


def test_an_ssh_secret_left_from_before_the_annotation_does_not_stand_for_the_launch_keys() -> None:
    plain = make_job()
    ssh_secret = next(
        a.obj
        for a in sync.plan(plain, sync.Observed(), NOW).actions
        if isinstance(a, sync.Create) and a.obj["kind"] == "Secret"
    )
    plan = sync.plan(agent_job(), sync.Observed(secret=ssh_secret), NOW, sync.Options())
    creates = [a.obj for a in plan.actions if isinstance(a, sync.Create)]
    assert any(observed.name_of(o) == "foo-launch" for o in creates if o["kind"] == "Secret")


def test_an_incomplete_launch_secret_is_made_again() -> None:
    job = agent_job()
    secret = launch.build_secret(job, launch.generate_keys())
    del secret["data"][launch.WORKER_KEY]
    secret["metadata"]["resourceVersion"] = "7"
    plan = sync.plan(job, sync.Observed(secret=secret), NOW, sync.Options())
    (replace,) = [a for a in plan.actions if isinstance(a, sync.Replace)]
    assert set(replace.obj["data"]) == launch.SECRET_KEYS
    assert replace.obj["metadata"]["resourceVersion"] == "7"


def test_keys_are_fresh_ed25519_pairs_that_match() -> None:
    one, two = launch.generate_keys(), launch.generate_keys()
    assert one[launch.LAUNCHER_KEY] != two[launch.LAUNCHER_KEY]
    for private, public in (
        (launch.LAUNCHER_KEY, launch.LAUNCHER_PUBLIC_KEY),
        (launch.WORKER_KEY, launch.WORKER_PUBLIC_KEY),
    ):
        key = serialization.load_ssh_private_key(one[private], password=None)
        line = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        assert one[public] == line + b"\n"
        assert line.startswith(b"ssh-ed25519 ")
    assert one[launch.LAUNCHER_KEY] != one[launch.WORKER_KEY]
    encoded = launch.build_secret(agent_job(), one)["data"][launch.LAUNCHER_KEY]
    assert base64.b64decode(encoded) == one[launch.LAUNCHER_KEY]


@pytest.mark.parametrize(
    ("value", "image", "fragment"),
    [
        ("ssh", IMAGE, 'Unsupported value: "ssh"'),
        ("", IMAGE, 'Unsupported value: ""'),
        ("agent", "", "--launch-image"),
    ],
)
def test_a_bad_launch_annotation_is_refused_naming_it_and_the_fix(
    value: str, image: str, fragment: str
) -> None:
    (error,) = launch_errors({keys.LAUNCH: value}, image)
    message = api.validation_message([error])
    assert keys.LAUNCH in message
    assert fragment in message


@pytest.mark.parametrize("annotations", [{}, {keys.LAUNCH: "sshd"}, {keys.LAUNCH: "agent"}])
def test_good_launch_annotations_pass(annotations: dict[str, str]) -> None:
    assert launch_errors(annotations, IMAGE) == []

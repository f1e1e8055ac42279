"""Launch without sshd: the operator's launch agent in the pods, and the job's launch keys.

With ``mpijob.io/launch: agent`` on an MPIJob, ``mpirun`` reaches the workers through
``mpijob-launch``, a static binary from the operator's image (its source: ``launch/``), instead
of ``ssh`` and an sshd in the worker image:

- an init container copies the binary into an ``emptyDir`` of every pod of the job, so the
  worker and launcher images need only the MPI library and the program;
- each worker's first container runs ``mpijob-launch serve`` (its own command and args are
  replaced): an SSH-protocol server on :data:`PORT` that runs only what the job's launcher asks,
  as the container's user, with no capability;
- the launcher's MPI is pointed at ``mpijob-launch`` as its remote agent (Open MPI's
  ``plm_rsh_agent``/``plm_ssh_agent`` with no tree spawn, Hydra's launcher exec), which is
  called as ssh is, ``AGENT [options] HOST COMMAND``.

The job's keys are a Secret ``<job>-launch`` of type :data:`SECRET_TYPE`, never an SSH Secret:
one Ed25519 pair the launcher authenticates with, one the workers prove themselves with. The
launcher's pod mounts only its private key and the workers' public key; a worker's pod only its
private key and the launcher's public key, so a worker cannot start anything in another.
docs/launch.md has the threat model.
"""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import names

SECRET_TYPE = "mpijob.io/launch-keys"
#: The Secret's four keys.
LAUNCHER_KEY = "launcher-key"
LAUNCHER_PUBLIC_KEY = "launcher-key.pub"
WORKER_KEY = "worker-key"
WORKER_PUBLIC_KEY = "worker-key.pub"
SECRET_KEYS = frozenset({LAUNCHER_KEY, LAUNCHER_PUBLIC_KEY, WORKER_KEY, WORKER_PUBLIC_KEY})

#: Where the pods hold the binary and the keys; the binary's defaults (launch/main.go).
ROOT = "/mpijob/launch"
BIN_DIR = f"{ROOT}/bin"
BINARY = f"{BIN_DIR}/mpijob-launch"
KEYS_DIR = f"{ROOT}/keys"
#: The file names in KEYS_DIR, per role.
CLIENT_KEY_FILE = "client-key"
KNOWN_HOST_KEY_FILE = "known-host-key"
HOST_KEY_FILE = "host-key"
AUTHORIZED_KEY_FILE = "authorized-key"
#: The workers' server port: above 1023, so it binds with no capability.
PORT = 2222
#: Where the binary lies in the operator's image.
IMAGE_BINARY = "/usr/local/bin/mpijob-launch"

BIN_VOLUME = "mpijob-launch-bin"
KEYS_VOLUME = "mpijob-launch-keys"
INIT_CONTAINER = "mpijob-launch-install"


def generate_keys() -> dict[str, bytes]:
    """A fresh set of the job's launch keys, by Secret key: two Ed25519 pairs, the private
    keys in OpenSSH's format and the public ones as ``ssh-ed25519 ...`` lines."""
    out: dict[str, bytes] = {}
    for private_name, public_name in (
        (LAUNCHER_KEY, LAUNCHER_PUBLIC_KEY),
        (WORKER_KEY, WORKER_PUBLIC_KEY),
    ):
        key = ed25519.Ed25519PrivateKey.generate()
        out[private_name] = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        out[public_name] = (
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
            + b"\n"
        )
    return out


def build_secret(job: MPIJob, material: dict[str, bytes]) -> dict[str, Any]:
    """The desired v1 Secret ``<job>-launch`` holding ``material`` (:func:`generate_keys`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": names.child_metadata(job, names.launch_secret_name(job), names.app_labels(job)),
        "type": SECRET_TYPE,
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(material.items())},
    }


def secret_needs_regeneration(live: dict[str, Any]) -> bool:
    """Whether a live Secret is not a complete set of launch keys."""
    return live.get("type") != SECRET_TYPE or set((live.get("data") or {}).keys()) != SECRET_KEYS


#: The init container's own settings: everything Pod Security ``restricted`` asks of a
#: container, a read-only root, and room enough to copy one static binary.
_INIT_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    # The image's own non-root user, whatever the pod's securityContext says: the binary it
    # copies is executable by every user (0755), and the emptyDir is writable by every user.
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
_INIT_RESOURCES = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"memory": "64Mi"},
}
#: Per role: (Secret key, file name in KEYS_DIR) the pod gets, and no other.
_LAUNCHER_ITEMS = ((LAUNCHER_KEY, CLIENT_KEY_FILE), (WORKER_PUBLIC_KEY, KNOWN_HOST_KEY_FILE))
_WORKER_ITEMS = ((WORKER_KEY, HOST_KEY_FILE), (LAUNCHER_PUBLIC_KEY, AUTHORIZED_KEY_FILE))
#: Readable by the container's user, whoever the image makes it: the files are the job's own.
_KEY_MODE = 0o444


def _add_agent(job: MPIJob, pod_spec: dict[str, Any], image: str, items: Any) -> None:
    """The binary's volume and its install init container, and the role's keys, in
    ``pod_spec``; both mounted read-only on its first container."""
    pod_spec["volumes"] = [
        *(pod_spec.get("volumes") or []),
        {"name": BIN_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        {
            "name": KEYS_VOLUME,
            "secret": {
                "secretName": names.launch_secret_name(job),
                "items": [{"key": k, "path": p} for k, p in items],
                "defaultMode": _KEY_MODE,
            },
        },
    ]
    install = {
        "name": INIT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [IMAGE_BINARY, "install", BIN_DIR],
        "volumeMounts": [{"name": BIN_VOLUME, "mountPath": BIN_DIR}],
        "securityContext": dict(_INIT_SECURITY),
        "resources": dict(_INIT_RESOURCES),
    }
    # First, so that the user's own init containers may use the agent too.
    pod_spec["initContainers"] = [install, *(pod_spec.get("initContainers") or [])]
    container = pod_spec["containers"][0]
    container["volumeMounts"] = [
        *(container.get("volumeMounts") or []),
        {"name": BIN_VOLUME, "mountPath": BIN_DIR, "readOnly": True},
        {"name": KEYS_VOLUME, "mountPath": KEYS_DIR, "readOnly": True},
    ]


def add_to_launcher(job: MPIJob, pod_spec: dict[str, Any], image: str) -> None:
    """The launcher's part: the agent, its private key and the workers' public key."""
    _add_agent(job, pod_spec, image, _LAUNCHER_ITEMS)


def add_to_worker(job: MPIJob, pod_spec: dict[str, Any], image: str) -> None:
    """A worker's part: the agent serving on :data:`PORT` as the first container's command
    (whatever it was: the worker only has to wait for the launcher), its private key and the
    launcher's public key, and, unless the template has one, a readiness probe on the port, so
    that ``launcherCreationPolicy: WaitForWorkersReady`` waits for a worker that can launch."""
    _add_agent(job, pod_spec, image, _WORKER_ITEMS)
    container = pod_spec["containers"][0]
    container["command"] = [BINARY, "serve"]
    container.pop("args", None)
    if "readinessProbe" not in container:
        container["readinessProbe"] = {
            "tcpSocket": {"port": PORT},
            "periodSeconds": 2,
            "failureThreshold": 3,
        }


def implementation_env(implementation: str) -> list[tuple[str, str]]:
    """The launcher's env that makes ``implementation``'s mpirun start its remote daemons
    through the agent, each started by the launcher itself (no tree spawn, which would have
    the workers launch each other and need the launcher's key)."""
    if implementation == keys.IMPL_OPENMPI:
        # Open MPI 4's ORTE reads the OMPI_MCA_plm_rsh_* names; Open MPI 5's PRRTE the
        # PRTE_MCA_plm_ssh_* ones. PRRTE writes the DVM's key to the agent's stdin, which the
        # agent forwards.
        return [
            ("OMPI_MCA_plm_rsh_agent", BINARY),
            ("OMPI_MCA_plm_rsh_no_tree_spawn", "1"),
            ("PRTE_MCA_plm_ssh_agent", BINARY),
            ("PRTE_MCA_plm_ssh_no_tree_spawn", "1"),
        ]
    if implementation == keys.IMPL_INTEL:
        return [("I_MPI_HYDRA_BOOTSTRAP", "ssh"), ("I_MPI_HYDRA_BOOTSTRAP_EXEC", BINARY)]
    if implementation == keys.IMPL_MPICH:
        return [("HYDRA_LAUNCHER", "ssh"), ("HYDRA_LAUNCHER_EXEC", BINARY)]
    return []

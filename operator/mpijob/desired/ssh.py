"""The SSH Secret that lets the launcher reach every worker, and its volume in the pods.

The key is ECDSA P-521 as upstream makes it: the private key as a PEM ``EC PRIVATE KEY`` block
(SEC1 DER) and the public key as an authorized_keys line. Key generation is separate and is
called once by the reconcile loop, which creates the Secret only when it is missing.
"""

from __future__ import annotations

import base64
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import names

SECRET_TYPE = "kubernetes.io/ssh-auth"
PRIVATE_KEY = "ssh-privatekey"
PUBLIC_KEY = "ssh-publickey"
VOLUME_NAME = "ssh-auth"
#: 0600: sshd refuses keys readable by others; only applied at the default path (upstream).
ROOT_SSH_MODE = 0o600


def generate_ssh_key_pair() -> tuple[bytes, bytes]:
    """A fresh ECDSA P-521 key pair: (PEM private key, ``ecdsa-sha2-nistp521 ...\\n`` line)."""
    key = ec.generate_private_key(ec.SECP521R1())
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public_line = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private_pem, public_line + b"\n"


def build_ssh_secret(job: MPIJob, private_pem: bytes, public_line: bytes) -> dict[str, Any]:
    """The desired v1 Secret (type ``kubernetes.io/ssh-auth``) holding the job's key pair."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": names.child_metadata(job, names.ssh_secret_name(job), names.app_labels(job)),
        "type": SECRET_TYPE,
        "data": {
            PRIVATE_KEY: base64.b64encode(private_pem).decode(),
            PUBLIC_KEY: base64.b64encode(public_line).decode(),
        },
    }


def secret_needs_regeneration(live: dict[str, Any]) -> bool:
    """Whether a live Secret's key set differs from the two keys upstream writes."""
    return set((live.get("data") or {}).keys()) != {PRIVATE_KEY, PUBLIC_KEY}


def add_ssh_volume(job: MPIJob, pod_spec: dict[str, Any]) -> None:
    """Append the ``ssh-auth`` volume to ``pod_spec`` and mount it on its first container."""
    secret: dict[str, Any] = {
        "secretName": names.ssh_secret_name(job),
        "items": [
            {"key": PRIVATE_KEY, "path": "id_rsa"},
            {"key": PUBLIC_KEY, "path": "id_rsa.pub"},
            {"key": PUBLIC_KEY, "path": "authorized_keys"},
        ],
    }
    mount_path = job.spec.ssh_auth_mount_path or keys.DEFAULT_SSH_AUTH_MOUNT_PATH
    if mount_path == keys.DEFAULT_SSH_AUTH_MOUNT_PATH:
        secret["defaultMode"] = ROOT_SSH_MODE
    pod_spec["volumes"] = [
        *(pod_spec.get("volumes") or []),
        {"name": VOLUME_NAME, "secret": secret},
    ]
    container = pod_spec["containers"][0]
    container["volumeMounts"] = [
        *(container.get("volumeMounts") or []),
        {"name": VOLUME_NAME, "mountPath": mount_path},
    ]

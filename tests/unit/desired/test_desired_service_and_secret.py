"""The headless Service and the SSH Secret."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mpijob.desired.service import build_service, service_drift
from mpijob.desired.ssh import build_ssh_secret, generate_ssh_key_pair, secret_needs_regeneration
from support.desired_jobs import OWNER, make_job

pytestmark = pytest.mark.unit


def test_service_is_headless_and_selects_launcher_and_workers() -> None:
    service = build_service(make_job())
    assert service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "foo",
            "namespace": "bar",
            "labels": {"app": "foo"},
            "ownerReferences": [OWNER],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {
                "training.kubeflow.org/operator-name": "mpi-operator",
                "training.kubeflow.org/job-name": "foo",
            },
            "publishNotReadyAddresses": False,
        },
    }
    assert build_service(make_job(launcher_as_worker=True))["spec"]["publishNotReadyAddresses"]


def test_service_drift_corrects_only_selector_and_not_ready_addresses() -> None:
    job = make_job(launcher_as_worker=True)
    live = build_service(job)
    live["spec"]["ports"] = [{"port": 22}]
    assert service_drift(job, live) is None
    live["spec"]["selector"] = {"app": "other"}
    live["spec"].pop("publishNotReadyAddresses")
    assert service_drift(job, live) == {
        "selector": build_service(job)["spec"]["selector"],
        "publishNotReadyAddresses": True,
    }


def test_ssh_key_pair_is_ecdsa_p521_in_upstream_formats() -> None:
    private_pem, public_line = generate_ssh_key_pair()
    assert private_pem.startswith(b"-----BEGIN EC PRIVATE KEY-----\n")
    key = serialization.load_pem_private_key(private_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp521r1"
    assert public_line.startswith(b"ecdsa-sha2-nistp521 AAAA")
    assert public_line.endswith(b"\n")
    assert public_line.count(b"\n") == 1
    public = serialization.load_ssh_public_key(public_line.strip())
    assert public.public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    assert generate_ssh_key_pair()[0] != private_pem


def test_ssh_secret_holds_both_keys_base64_encoded() -> None:
    secret = build_ssh_secret(make_job(), b"PRIVATE", b"ecdsa-sha2-nistp521 AAAA\n")
    assert secret == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "foo-ssh",
            "namespace": "bar",
            "labels": {"app": "foo"},
            "ownerReferences": [OWNER],
        },
        "type": "kubernetes.io/ssh-auth",
        "data": {
            "ssh-privatekey": base64.b64encode(b"PRIVATE").decode(),
            "ssh-publickey": base64.b64encode(b"ecdsa-sha2-nistp521 AAAA\n").decode(),
        },
    }
    assert not secret_needs_regeneration(secret)
    assert secret_needs_regeneration({"data": {"ssh-privatekey": "x"}})
    assert secret_needs_regeneration({"data": {**secret["data"], "extra": "y"}})

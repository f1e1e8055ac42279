"""Hostfile and discover_hosts.sh: counterparts of upstream ``TestNewConfigMap`` and
``TestUpdateDiscoverHostsInConfigMap``."""

from __future__ import annotations

import pytest

from mpijob.desired import names
from mpijob.desired.config_map import (
    MAX_DATA_BYTES,
    build_config_map,
    data_bytes,
    discover_hosts,
    hostfile,
    size_errors,
)
from support.desired_jobs import OWNER, make_job

pytestmark = pytest.mark.unit

NEW_CONFIG_MAP_CASES = {
    "OpenMPI without slots, enable launcher as worker": (
        {"launcher_as_worker": True},
        "",
        "foo-launcher.foo.bar.svc slots=1\n"
        "foo-worker-0.foo.bar.svc slots=1\nfoo-worker-1.foo.bar.svc slots=1\n",
    ),
    "OpenMPI with cluster domain, enable launcher as worker": (
        {"launcher_as_worker": True},
        "cluster.local",
        "foo-launcher.foo.bar.svc.cluster.local slots=1\n"
        "foo-worker-0.foo.bar.svc.cluster.local slots=1\n"
        "foo-worker-1.foo.bar.svc.cluster.local slots=1\n",
    ),
    "OpenMPI without slots, zero explicit workers": (
        {"launcher_as_worker": True, "workers": 0},
        "",
        "foo-launcher.foo.bar.svc slots=1\n",
    ),
    "OpenMPI without slots, disable launcher as worker": (
        {"launcher_as_worker": False},
        "",
        "foo-worker-0.foo.bar.svc slots=1\nfoo-worker-1.foo.bar.svc slots=1\n",
    ),
    "OpenMPI with slots": (
        {"slots": 10},
        "",
        "foo-worker-0.foo.bar.svc slots=10\nfoo-worker-1.foo.bar.svc slots=10\n",
    ),
    "OpenMPI with cluster domain": (
        {"slots": 10},
        "cluster.local",
        "foo-worker-0.foo.bar.svc.cluster.local slots=10\n"
        "foo-worker-1.foo.bar.svc.cluster.local slots=10\n",
    ),
    "IntelMPI with slots": (
        {"implementation": "Intel", "slots": 10},
        "",
        "foo-worker-0.foo.bar.svc:10\nfoo-worker-1.foo.bar.svc:10\n",
    ),
    "IntelMPI with cluster domain": (
        {"implementation": "Intel", "slots": 10},
        "cluster.local",
        "foo-worker-0.foo.bar.svc.cluster.local:10\nfoo-worker-1.foo.bar.svc.cluster.local:10\n",
    ),
    "MPICH with slots": (
        {"implementation": "MPICH", "slots": 10},
        "",
        "foo-worker-0.foo.bar.svc:10\nfoo-worker-1.foo.bar.svc:10\n",
    ),
    "MPICH with cluster domain": (
        {"implementation": "MPICH", "slots": 10},
        "cluster.local",
        "foo-worker-0.foo.bar.svc.cluster.local:10\nfoo-worker-1.foo.bar.svc.cluster.local:10\n",
    ),
}


@pytest.mark.parametrize("case", list(NEW_CONFIG_MAP_CASES))
def test_new_config_map(case: str) -> None:
    """Counterpart of upstream TestNewConfigMap (every named case)."""
    options, domain, expected_hostfile = NEW_CONFIG_MAP_CASES[case]
    job = make_job(**options)  # type: ignore[arg-type]
    assert build_config_map(job, [], domain) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "foo-config",
            "namespace": "bar",
            "labels": {"app": "foo"},
            "ownerReferences": [OWNER],
        },
        "data": {
            "hostfile": expected_hostfile,
            "discover_hosts.sh": (
                "#!/bin/sh\necho foo-launcher.foo.bar.svc" + (f".{domain}" if domain else "") + "\n"
                if options.get("launcher_as_worker")
                else "#!/bin/sh\n"
            ),
        },
    }


DISCOVER_HOSTS_CASES = {
    "no cluster domain, launcher as worker disabled, no running pods": (
        False,
        "",
        [],
        "#!/bin/sh\n",
    ),
    "no cluster domain, launcher as worker disabled, with running pods": (
        False,
        "",
        ["foo-worker-0", "foo-worker-1"],
        "#!/bin/sh\necho foo-worker-0.foo.bar.svc\necho foo-worker-1.foo.bar.svc\n",
    ),
    "no cluster domain, launcher as worker enabled, no running pods": (
        True,
        "",
        [],
        "#!/bin/sh\necho foo-launcher.foo.bar.svc\n",
    ),
    "no cluster domain, launcher as worker enabled, with running pods": (
        True,
        "",
        ["foo-worker-0", "foo-worker-1"],
        "#!/bin/sh\necho foo-launcher.foo.bar.svc\n"
        "echo foo-worker-0.foo.bar.svc\necho foo-worker-1.foo.bar.svc\n",
    ),
    "with cluster domain, launcher as worker disabled, with running pods": (
        False,
        "cluster.local",
        ["foo-worker-0", "foo-worker-1"],
        "#!/bin/sh\necho foo-worker-0.foo.bar.svc.cluster.local\n"
        "echo foo-worker-1.foo.bar.svc.cluster.local\n",
    ),
    "with cluster domain, launcher as worker enabled, with running pods": (
        True,
        "cluster.local",
        ["foo-worker-0", "foo-worker-1"],
        "#!/bin/sh\necho foo-launcher.foo.bar.svc.cluster.local\n"
        "echo foo-worker-0.foo.bar.svc.cluster.local\n"
        "echo foo-worker-1.foo.bar.svc.cluster.local\n",
    ),
    "pods are sorted by name": (
        False,
        "",
        ["foo-worker-11", "foo-worker-2", "foo-worker-0", "foo-worker-1"],
        "#!/bin/sh\necho foo-worker-0.foo.bar.svc\necho foo-worker-1.foo.bar.svc\n"
        "echo foo-worker-11.foo.bar.svc\necho foo-worker-2.foo.bar.svc\n",
    ),
}


@pytest.mark.parametrize("case", list(DISCOVER_HOSTS_CASES))
def test_update_discover_hosts_in_config_map(case: str) -> None:
    """Counterpart of upstream TestUpdateDiscoverHostsInConfigMap (every named case)."""
    launcher_as_worker, domain, running, expected = DISCOVER_HOSTS_CASES[case]
    job = make_job(launcher_as_worker=launcher_as_worker, workers=12)
    assert discover_hosts(job, running, domain) == expected
    assert build_config_map(job, running, domain)["data"]["discover_hosts.sh"] == expected


def test_hostfile_follows_scale_and_ignores_worker_state() -> None:
    assert hostfile(make_job(workers=3)).count("\n") == 3
    assert hostfile(make_job(workers=None)) == ""


@pytest.mark.parametrize("workers", [0, 1, 9, 10, 11, 100, 1234])
@pytest.mark.parametrize("implementation", ["OpenMPI", "Intel", "MPICH"])
@pytest.mark.parametrize("launcher_as_worker", [False, True])
@pytest.mark.parametrize("domain", ["", "cluster.local"])
def test_the_counted_size_is_the_size_of_the_built_config_map(
    workers: int, implementation: str, launcher_as_worker: bool, domain: str
) -> None:
    job = make_job(
        workers=workers,
        implementation=implementation,
        slots=12,
        launcher_as_worker=launcher_as_worker,
    )
    built = build_config_map(job, names.worker_names(job), domain)
    assert data_bytes(job, domain) == sum(len(k) + len(v) for k, v in built["data"].items())


def test_a_hostfile_beyond_the_api_servers_limit_is_refused_naming_the_field_and_limit() -> None:
    job = make_job(workers=100_000)
    [error] = size_errors(job)
    assert error.path == "spec.mpiReplicaSpecs[Worker].replicas"
    assert "Invalid value: 100000" in error.message
    assert f"beyond the {MAX_DATA_BYTES} bytes" in error.message
    assert size_errors(make_job(workers=1000)) == []


def test_int32_max_workers_are_refused_without_building_anything() -> None:
    job = make_job(workers=2**31 - 1)
    assert size_errors(job)  # counted in microseconds: no list of two billion names

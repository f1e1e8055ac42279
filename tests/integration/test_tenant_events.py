"""Events a tenant forges in its own namespace under another namespace's job receive nothing of
that job's: the operator files an Event under its object only in the object's namespace.

The tenant is impersonated with Kubernetes' ``edit`` role and Kubeflow's MPIJob edit role in
its own namespace only, which let it create Events there. It knows the victim's job (name,
namespace, uid) and forges the Events the operator will post about it, with this component's
source, reasons and messages, before the operator starts and lists the Events it finds.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from mpijob import keys
from mpijob.desired.events import Event, normal
from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.tenants import TenantJobs, bind_tenant

pytestmark = pytest.mark.integration

TENANT = "forger@example.com"


@pytest.fixture
def tenant_ns(crds: Cluster) -> Iterator[str]:
    """The tenant's own namespace (the test's ``namespace`` is the victim's)."""
    name = f"t-forger-{uuid.uuid4().hex[:6]}"
    crds.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    bind_tenant(crds, name, TENANT)
    yield name
    crds.delete_namespace(name)


def forged(job: dict[str, Any], event: Event, namespace: str, *, named: str) -> dict[str, Any]:
    """An Event in the tenant's ``namespace`` about ``job``, as the operator would post it;
    its ``involvedObject`` names the job's namespace (allowed with an ``eventTime``, as the
    events.k8s.io API writes Events) or, ``named`` "own", the tenant's."""
    meta = job["metadata"]
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    involved_namespace = namespace if named == "own" else meta["namespace"]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"forged-{event.reason.lower()}-{named}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND,
            "name": meta["name"],
            "namespace": involved_namespace,
            "uid": meta["uid"],
        },
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": keys.EVENT_COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if named != "own":  # the API server lets only a "new" Event name another namespace's object
        body |= {
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "action": "Sync",
            "reportingComponent": keys.EVENT_COMPONENT,
            "reportingInstance": "forger",
        }
    return body


def counts(cluster: Cluster, namespace: str) -> dict[str, tuple[int, str]]:
    """Each Event of ``namespace`` by name: its count and resourceVersion (any write moves it)."""
    return {
        e.metadata.name: (e.count, e.metadata.resource_version)
        for e in cluster.core.list_namespaced_event(namespace).items
    }


def test_events_forged_in_a_tenants_namespace_receive_nothing_of_another_namespaces_job(
    crds: Cluster, namespace: str, tenant_ns: str, start_operator: Any
) -> None:
    victims = MPIJobs(crds, namespace)
    job = victims.create(
        mpijob("victim", workers=1, launcher_annotations={keys.SIM_SUCCEED_AFTER: "1s"})
    )
    # The texts of mpijob.desired.status: Created, Running and Succeeded as the operator words
    # them (checked below against what it posts, so the forgery is exact).
    key = f"{namespace}/victim"
    texts = [
        normal(keys.REASON_CREATED, f"MPIJob {key} is created."),
        normal(keys.REASON_RUNNING, f"MPIJob {key} is running"),
        normal(keys.REASON_SUCCEEDED, f"MPIJob {key} successfully completed."),
    ]
    tenant = TenantJobs(crds, tenant_ns, TENANT)
    for event in texts:
        for named in ("victim", "own"):
            tenant.core.create_namespaced_event(
                tenant_ns, forged(job, event, tenant_ns, named=named)
            )
    before = counts(crds, tenant_ns)
    assert len(before) == 6
    assert all(count == 1 for count, _ in before.values())

    # Started now, the operator lists the forged Events with those of the job's namespace.
    start_operator("--namespace", tenant_ns)
    victims.wait_condition("victim", keys.COND_SUCCEEDED, timeout=90)
    # Events go out one at a time in the order posted: once Succeeded is there, every Event
    # posted before it has been sent too.
    victims.wait_event("victim", keys.REASON_SUCCEEDED, timeout=30)

    posted = victims.events("victim")
    assert {e["component"] for e in posted} == {keys.EVENT_COMPONENT}, posted
    for event in (texts[0], texts[2]):
        assert [
            (e["type"], e["message"], e["count"]) for e in posted if e["reason"] == event.reason
        ] == [(event.type, event.message, 1)], posted
    assert counts(crds, tenant_ns) == before, "the forged Events were counted up"

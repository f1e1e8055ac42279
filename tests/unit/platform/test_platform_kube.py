"""The API adapter: one rate-limit bucket per API client, lists read page by page."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.platform import kube
from mpijob.platform.kube import bucket_of

pytestmark = pytest.mark.unit


def test_mpijobs_podgroups_and_the_lease_have_their_own_buckets_as_upstreams_clients() -> None:
    core = bucket_of("/api/v1/namespaces/ns/pods")
    assert bucket_of("/apis/batch/v1/namespaces/ns/jobs") == core
    assert bucket_of("/api/v1/namespaces/ns/events") == core
    own = {
        bucket_of("/apis/kubeflow.org/v2beta1/namespaces/ns/mpijobs/pi/status"),
        bucket_of("/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups"),
        bucket_of("/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups"),
        bucket_of("/apis/coordination.k8s.io/v1/namespaces/ns/leases/mpijob-operator"),
    }
    assert len(own) == 4
    assert core not in own


async def test_a_list_reads_every_page_with_its_selectors() -> None:
    class Pages:
        list_page = kube.Kube.list_page  # each page read as the client reads it

        def __init__(self) -> None:
            self.queries: list[dict[str, str]] = []

        async def request(self, method: str, url: str, **kw: Any) -> dict[str, Any]:
            self.queries.append(dict(kw["query"]))
            more = {"continue": "next"} if len(self.queries) == 1 else {}
            return {"metadata": more, "items": [{"page": len(self.queries)}]}

    api = Pages()
    items = await kube.Kube.list(api, "v1", "Event", "ns", fields="source=x")  # type: ignore[arg-type]
    assert items == [{"page": 1}, {"page": 2}]
    assert api.queries == [
        {"limit": "500", "fieldSelector": "source=x"},
        {"limit": "500", "fieldSelector": "source=x", "continue": "next"},
    ]

"""What the handlers and services ask of the API adapter, as a type.

:class:`mpijob.handlers.kube.Kube` is the one implementation that talks to an API server;
naming this Protocol instead of the class lets a caller be given anything that answers these
calls alike (the tests' in-memory API), with mypy checking the stand-in as it checks the adapter.
Only the calls made outside the adapter are listed: its connection, session and rate limits are
its own business.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, Protocol

JSON = dict[str, Any]


class KubeApi(Protocol):
    """Async JSON access to the API server: the verbs :class:`~mpijob.handlers.kube.Kube` has."""

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        urgent: bool = True,
    ) -> JSON:
        """One request on a raw path (discovery, Leases, configurations the kinds omit)."""
        ...

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> JSON | None:
        """The object, or None when the API has none of that name."""
        ...

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        *,
        labels: str = "",
        fields: str = "",
        urgent: bool = True,
    ) -> builtins.list[JSON]:
        """Every object of the kind (in ``namespace``, or all when None) the selectors match."""
        ...

    async def create(self, obj: JSON, *, urgent: bool = True) -> JSON: ...

    async def replace(self, obj: JSON) -> JSON: ...

    async def replace_status(self, obj: JSON) -> JSON: ...

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: JSON,
        *,
        subresource: str = "",
        urgent: bool = True,
    ) -> JSON:
        """A JSON merge patch."""
        ...

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        propagation: str = "Background",
        grace_seconds: int | None = None,
    ) -> bool:
        """True when this call deleted it; False when it was gone or had another uid."""
        ...

    async def aclose(self) -> None: ...

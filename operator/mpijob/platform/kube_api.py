"""What the handlers and services ask of the API adapter, as a type.

:class:`mpijob.platform.kube.Kube` is the one implementation that talks to an API server;
naming this Protocol instead of the class lets a caller be given anything that answers these
calls alike (the tests' in-memory API), with mypy checking the stand-in as it checks the adapter.
Only the calls made outside the adapter are listed: its connection, session and rate limits are
its own business. Refusals are the adapter's typed errors (:class:`mpijob.platform.kube.ApiError`
and its subclasses), which a stand-in raises too.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, Protocol

from mpijob.objects import JSON


class KubeApi(Protocol):
    """Async JSON access to the API server: the verbs :class:`~mpijob.platform.kube.Kube` has."""

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        urgent: bool = True,
        retry: bool = True,
    ) -> JSON:
        """One request on a raw path; ``retry=False`` leaves retrying to the caller's own loop."""
        ...

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str, *, retry: bool = True
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

    async def create(self, obj: JSON, *, urgent: bool = True, retry: bool = True) -> JSON: ...

    async def replace(self, obj: JSON, *, retry: bool = True) -> JSON: ...

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
        """A JSON merge patch (RFC 7386)."""
        ...

    async def json_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        ops: builtins.list[JSON],
        *,
        subresource: str = "",
    ) -> JSON:
        """A JSON patch (RFC 6902): its operations applied in order, or none of them."""
        ...

    async def apply(self, obj: JSON, *, field_manager: str = ...) -> JSON:
        """Server-side apply of ``obj``; the fields it names become the manager's, by force."""
        ...

    async def version(self) -> JSON:
        """The API server's ``/version``."""
        ...

    async def resources(self, group_version: str) -> JSON | None:
        """The discovery document of ``group_version``; None when it is not served."""
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

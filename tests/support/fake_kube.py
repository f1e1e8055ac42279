"""An in-memory API server behind the operator's adapter calls (:class:`KubeApi`).

Objects live in a dict keyed by apiVersion, kind, namespace and name, and every verb acts on it
as the API server would where the operator can tell: a create of an existing name is a 409, a
get of a missing one None, a patch or replace of a missing one a 404, a delete of a missing one
(or under another uid) False; writes bump the object's own resourceVersion (counted per
object, from "1"). What it does not do: resourceVersion preconditions (last write wins),
field selectors (recorded, not applied), defaulting, admission.

Every call is recorded (:attr:`requests`, :attr:`calls`), failed ones too, with the error they
raised. Raw-path requests (discovery, Leases) answer from :attr:`served`, else 404. ``latency``
makes each call take that long on the event loop's clock (free on :mod:`support.virtual_time`),
so tests can have calls overlap; :attr:`most_in_flight` says whether they did.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mpijob.handlers.kube import ApiError
from mpijob.handlers.kube_api import KubeApi

JSON = dict[str, Any]
Ref = tuple[str, str, str | None, str]


@dataclass
class Call:
    verb: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _matches(labels: str, obj: JSON) -> bool:
    """Equality selectors (``a=b,c=d``), the only kind the operator sends."""
    have = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, labels.split(",")):
        key, _, value = term.partition("=")
        if have.get(key) != value:
            return False
    return True


class FakeKube:
    """The API adapter's verbs served from memory; see the module's docstring."""

    def __init__(self, *objects: JSON, latency: float = 0.0) -> None:
        self.objects: dict[Ref, JSON] = {}
        self.served: dict[str, JSON] = {}
        """Answers to raw-path GETs, by path."""
        self.requests: list[tuple[str, tuple[Any, ...]]] = []
        """Each call as (verb, positional arguments), in order."""
        self.calls: list[Call] = []
        """Each call with its keyword arguments and the error it raised, in order."""
        self.latency = latency
        self.in_flight = self.most_in_flight = 0
        self._failures: dict[str, list[Exception]] = {}
        self._serial = 0
        self.add(*objects)

    # --- the test's side: state set and read without a request ----------------------------

    def add(self, *objects: JSON) -> None:
        """Store objects as if made before the test (no request recorded)."""
        for obj in objects:
            stored = copy.deepcopy(obj)
            stored["metadata"].setdefault("resourceVersion", "1")
            self.objects[self._ref_of(stored)] = stored

    def remove(self, kind: str, namespace: str | None, name: str) -> None:
        """Delete by hand (no request recorded)."""
        for ref in [r for r in self.objects if (r[1], r[2], r[3]) == (kind, namespace, name)]:
            del self.objects[ref]

    def stored(self, kind: str, namespace: str | None = None) -> builtins.list[JSON]:
        """The objects of ``kind`` (in ``namespace``, or all), in the order they were made."""
        return [o for r, o in self.objects.items() if r[1] == kind and namespace in (None, r[2])]

    def fail(self, verb: str, *errors: Exception) -> None:
        """The next calls of ``verb`` raise ``errors``, one each, in order."""
        self._failures.setdefault(verb, []).extend(errors)

    def done(self, verb: str) -> builtins.list[Call]:
        """The calls of ``verb`` that succeeded."""
        return [c for c in self.calls if c.verb == verb and c.ok]

    def created(self) -> builtins.list[str]:
        """``Kind/name`` of each create asked for, in order (refused ones too)."""
        return [
            f"{a[0]['kind']}/{a[0]['metadata']['name']}" for v, a in self.requests if v == "create"
        ]

    # --- KubeApi -------------------------------------------------------------------------------

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
        async with self._call("request", (method, url), {"body": body, "query": query}):
            if method == "GET" and url in self.served:
                return copy.deepcopy(self.served[url])
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> JSON | None:
        async with self._call("get", (api_version, kind, namespace, name)):
            found = self.objects.get((api_version, kind, namespace, name))
            return copy.deepcopy(found) if found is not None else None

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
        kwargs = {"labels": labels, "fields": fields, "urgent": urgent}
        async with self._call("list", (api_version, kind, namespace), kwargs):
            return [
                copy.deepcopy(o)
                for r, o in self.objects.items()
                if r[:2] == (api_version, kind)
                and namespace in (None, r[2])
                and _matches(labels, o)
            ]

    async def create(self, obj: JSON, *, urgent: bool = True) -> JSON:
        async with self._call("create", (obj,), {"urgent": urgent}):
            ref = self._ref_of(obj)
            if ref in self.objects:
                raise ApiError(409, "AlreadyExists", f'{obj["kind"]} "{ref[3]}" already exists')
            self._serial += 1
            stored = copy.deepcopy(obj)
            meta = stored["metadata"]
            meta.setdefault("uid", f"uid-{self._serial}")
            meta["resourceVersion"] = "1"
            self.objects[ref] = stored
            return copy.deepcopy(stored)

    async def replace(self, obj: JSON) -> JSON:
        async with self._call("replace", (obj,)):
            ref = self._existing(self._ref_of(obj))
            return self._write(ref, {**obj, "status": self.objects[ref].get("status", {})})

    async def replace_status(self, obj: JSON) -> JSON:
        async with self._call("replace_status", (obj,)):
            ref = self._existing(self._ref_of(obj))
            return self._write(ref, {**self.objects[ref], "status": obj.get("status", {})})

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
        kwargs = {"subresource": subresource, "urgent": urgent}
        async with self._call("patch", (api_version, kind, namespace, name, patch), kwargs):
            ref = self._existing((api_version, kind, namespace, name))
            return self._write(ref, merge_patch(self.objects[ref], patch))

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
        kwargs = {"uid": uid, "propagation": propagation, "grace_seconds": grace_seconds}
        async with self._call("delete", (api_version, kind, namespace, name), kwargs):
            ref = (api_version, kind, namespace, name)
            found = self.objects.get(ref)
            if found is None or (uid and found["metadata"].get("uid") != uid):
                return False
            del self.objects[ref]
            return True

    async def aclose(self) -> None:
        pass

    # --- inside --------------------------------------------------------------------------------

    @staticmethod
    def _ref_of(obj: JSON) -> Ref:
        meta = obj["metadata"]
        return (obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])

    def _existing(self, ref: Ref) -> Ref:
        if ref not in self.objects:
            raise ApiError(404, "NotFound", f'{ref[1]} "{ref[3]}" not found')
        return ref

    def _write(self, ref: Ref, obj: JSON) -> JSON:
        stored = copy.deepcopy(obj)
        version = int(self.objects[ref]["metadata"].get("resourceVersion") or 0) + 1
        stored["metadata"] = {**stored["metadata"], "resourceVersion": str(version)}
        self.objects[ref] = stored
        return copy.deepcopy(stored)

    def _call(
        self, verb: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
    ) -> _Calling:
        call = Call(verb, args, dict(kwargs or {}))
        self.requests.append((verb, args))
        self.calls.append(call)
        return _Calling(self, call)


class _Calling:
    """One call's course: in flight for ``latency``, then a scripted failure or the answer."""

    def __init__(self, kube: FakeKube, call: Call) -> None:
        self._kube, self._call = kube, call

    async def __aenter__(self) -> None:
        kube = self._kube
        kube.in_flight += 1
        kube.most_in_flight = max(kube.most_in_flight, kube.in_flight)
        try:
            if kube.latency:
                await asyncio.sleep(kube.latency)
            failures = kube._failures.get(self._call.verb)
            if failures:
                raise failures.pop(0)
        except BaseException as e:
            kube.in_flight -= 1
            if isinstance(e, Exception):
                self._call.error = e
            raise

    async def __aexit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        self._kube.in_flight -= 1
        if isinstance(error, Exception):
            self._call.error = error


def _conforms(kube: FakeKube) -> KubeApi:
    """mypy checks here that the fake answers every call of the Protocol alike."""
    return kube

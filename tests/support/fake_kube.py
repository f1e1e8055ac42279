"""An in-memory API server behind the operator's adapter calls (:class:`KubeApi`).

Objects live in a dict keyed by apiVersion, kind, namespace and name, and every verb acts on it
as the API server would where the operator can tell: a create of an existing name is a 409, a
get of a missing one None, a patch or replace of a missing one a 404, a delete of a missing one
(or under another uid) False; writes bump the object's own resourceVersion (counted per
object, from "1"); a JSON patch whose operations do not apply is a 422 and changes nothing; a
server-side apply creates the object or merges the fields it names into it. Errors are the
adapter's typed ones (``ApiError(404, ...)`` is a ``NotFound``). What it does not do:
resourceVersion preconditions unless asked (``FakeKube(versions=True)``: a replace naming a
resourceVersion other than the stored one is a 409, as on the API server; otherwise the last
write wins, since handler tests keep bodies the watch would have refreshed), field selectors
(recorded, not applied), defaulting, admission, the managed fields of an apply.

Every call is recorded (:attr:`requests`, :attr:`calls`), failed ones too, with the error they
raised. Raw-path requests and the discovery reads (``version``, ``resources``) answer from
:attr:`served`, by path, else 404 (``resources``: None). ``retry`` is recorded, not acted on: the
fake never answers "not now" unless a test scripts it with :meth:`FakeKube.fail`. ``latency``
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

import jsonpatch

from mpijob.objects import JSON
from mpijob.platform.kube import ApiError
from mpijob.platform.kube_api import KubeApi

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

    def __init__(self, *objects: JSON, latency: float = 0.0, versions: bool = False) -> None:
        self.objects: dict[Ref, JSON] = {}
        self.versions = versions
        """Whether a replace on a stale resourceVersion is refused (409)."""
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
        retry: bool = True,
    ) -> JSON:
        kwargs = {"body": body, "query": query, "retry": retry}
        async with self._call("request", (method, url), kwargs):
            return self._served(method, url)

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str, *, retry: bool = True
    ) -> JSON | None:
        async with self._call("get", (api_version, kind, namespace, name), {"retry": retry}):
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

    async def create(self, obj: JSON, *, urgent: bool = True, retry: bool = True) -> JSON:
        async with self._call("create", (obj,), {"urgent": urgent, "retry": retry}):
            ref = self._ref_of(obj)
            if ref in self.objects:
                raise ApiError(409, "AlreadyExists", f'{obj["kind"]} "{ref[3]}" already exists')
            return self._make(ref, obj)

    async def replace(self, obj: JSON, *, retry: bool = True) -> JSON:
        async with self._call("replace", (obj,), {"retry": retry}):
            ref = self._current(self._existing(self._ref_of(obj)), obj)
            return self._write(ref, {**obj, "status": self.objects[ref].get("status", {})})

    async def replace_status(self, obj: JSON) -> JSON:
        async with self._call("replace_status", (obj,)):
            ref = self._current(self._existing(self._ref_of(obj)), obj)
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
        args = (api_version, kind, namespace, name, ops)
        async with self._call("json_patch", args, {"subresource": subresource}):
            ref = self._existing((api_version, kind, namespace, name))
            try:
                patched = jsonpatch.apply_patch(self.objects[ref], ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                raise ApiError(422, "Invalid", str(error)) from error
            return self._write(ref, patched)

    async def apply(self, obj: JSON, *, field_manager: str = "mpijob-operator") -> JSON:
        async with self._call("apply", (obj,), {"field_manager": field_manager}):
            ref = self._ref_of(obj)
            if ref not in self.objects:
                return self._make(ref, obj)
            return self._write(ref, merge_patch(self.objects[ref], obj))

    async def version(self) -> JSON:
        async with self._call("version", ()):
            return self._served("GET", "/version")

    async def resources(self, group_version: str) -> JSON | None:
        prefix = "/api/" if group_version == "v1" else "/apis/"
        async with self._call("resources", (group_version,)):
            return copy.deepcopy(self.served.get(prefix + group_version))

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

    def _current(self, ref: Ref, obj: JSON) -> Ref:
        """With :attr:`versions`, a replace naming a resourceVersion writes only over that
        version, as the API server's optimistic concurrency has it; one naming none, over any."""
        named = obj["metadata"].get("resourceVersion")
        stored = self.objects[ref]["metadata"].get("resourceVersion")
        if self.versions and named and named != stored:
            raise ApiError(409, "Conflict", f'{ref[1]} "{ref[3]}": the object has been modified')
        return ref

    def _served(self, method: str, url: str) -> JSON:
        if method == "GET" and url in self.served:
            return copy.deepcopy(self.served[url])
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _make(self, ref: Ref, obj: JSON) -> JSON:
        self._serial += 1
        stored = copy.deepcopy(obj)
        meta = stored["metadata"]
        meta.setdefault("uid", f"uid-{self._serial}")
        meta["resourceVersion"] = "1"
        self.objects[ref] = stored
        return copy.deepcopy(stored)

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

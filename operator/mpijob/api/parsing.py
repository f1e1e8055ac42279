"""Turns a raw MPIJob body into an :class:`~mpijob.api.models.MPIJob`, or one clear error.

The operator must keep running whatever is stored: type errors from pydantic and malformed pod
templates (which the CRD passes through unchecked) all become :class:`InvalidMPIJob` with field
paths in Kubernetes notation. Nothing else ever escapes :func:`parse`.
Called by the handlers on every MPIJob event, before defaulting and validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from mpijob.api.errors import FieldError, InvalidMPIJob, go_quote, invalid
from mpijob.api.models import MPIJob
from mpijob.objects import clone

#: Fields whose keys are map keys rather than field names; shown as ``[key]`` in paths.
_MAP_FIELDS = frozenset(
    {"mpiReplicaSpecs", "replicaStatuses", "labels", "annotations", "minResources"}
)
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer"}


def managed_by(body: Mapping[str, Any]) -> str | None:
    """``spec.runPolicy.managedBy`` when it is a string, else None. Never raises.

    Upstream skips jobs managed by another controller before validating them, so this reads
    the raw body rather than a parsed model.
    """
    try:
        value = body["spec"]["runPolicy"]["managedBy"]
    except (KeyError, TypeError, IndexError):
        return None
    return value if isinstance(value, str) else None


def parse(body: Mapping[str, Any]) -> MPIJob:
    """The MPIJob in ``body``; raises :class:`InvalidMPIJob` (and nothing else) if it is malformed.

    Only shapes are checked here; upstream's rules are in :func:`mpijob.api.validate`.
    """
    try:
        if not isinstance(body, Mapping):
            raise InvalidMPIJob([invalid("", _json_type(body), "must be an object")])
        try:
            # Templates are kept as given; copy so that the job never aliases the caller's body.
            job = MPIJob.model_validate(clone(dict(body)))
        except pydantic.ValidationError as exc:
            raise InvalidMPIJob([_from_pydantic(e) for e in exc.errors()]) from None
        errors = []
        for replica_type, replica in (job.spec.mpi_replica_specs or {}).items():
            if replica is not None:
                path = f"spec.mpiReplicaSpecs[{replica_type}].template"
                errors += template_shape_errors(replica.template, path)
        if errors:
            raise InvalidMPIJob(errors)
        return job
    except InvalidMPIJob:
        raise
    except Exception as exc:  # a malformed object must never crash the operator
        raise InvalidMPIJob([FieldError("", f"Internal error: {exc!r}")]) from exc


def template_shape_errors(template: Mapping[str, Any], path: str) -> list[FieldError]:
    """Where a pod template's shape breaks what the builders and Kubernetes need.

    Upstream's CRD embeds the full PodTemplateSpec schema; ours passes templates through, so
    the parts the operator reads or extends are checked here.
    """
    errors: list[FieldError] = []
    metadata = _expect(template, "metadata", dict, path, errors)
    for key in ("labels", "annotations"):
        mapping = _expect(metadata, key, dict, f"{path}.metadata", errors)
        for name, value in mapping.items():
            if not isinstance(value, str):
                errors.append(_wrong_type(f"{path}.metadata.{key}[{name}]", value, "string"))
    spec_path = f"{path}.spec"
    spec = _expect(template, "spec", dict, path, errors)
    for key, kind in (
        ("hostNetwork", bool),
        ("restartPolicy", str),
        ("priorityClassName", str),
        ("schedulerName", str),
        ("nodeSelector", dict),
        ("dnsConfig", dict),
    ):
        _expect(spec, key, kind, spec_path, errors)
    dns = spec.get("dnsConfig")
    if isinstance(dns, dict):
        _expect_list_of(dns, "searches", str, f"{spec_path}.dnsConfig", errors)
    for key in ("volumes", "tolerations", "schedulingGates", "initContainers"):
        _expect_list_of(spec, key, dict, spec_path, errors)
    containers = _expect_list_of(spec, "containers", dict, spec_path, errors)
    for index, container in enumerate(containers):
        if isinstance(container, dict):
            errors += _container_shape_errors(container, f"{spec_path}.containers[{index}]")
    return errors


def _container_shape_errors(container: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    _expect(container, "name", str, path, errors)
    _expect(container, "image", str, path, errors)
    for key in ("command", "args"):
        _expect_list_of(container, key, str, path, errors)
    for key in ("env", "volumeMounts"):
        _expect_list_of(container, key, dict, path, errors)
    resources = _expect(container, "resources", dict, path, errors)
    for key in ("requests", "limits"):
        _expect(resources, key, dict, f"{path}.resources", errors)
    return errors


def _expect(
    parent: Mapping[str, Any], key: str, kind: type, path: str, errors: list[FieldError]
) -> Any:
    """``parent[key]`` if it has type ``kind``; an empty value (and an error) otherwise."""
    value = parent.get(key)
    if value is None:
        return kind()
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    errors.append(_wrong_type(f"{path}.{key}", value, _JSON_TYPES[kind]))
    return kind()


def _expect_list_of(
    parent: Mapping[str, Any], key: str, item: type, path: str, errors: list[FieldError]
) -> list[Any]:
    values: list[Any] = _expect(parent, key, list, path, errors)
    for index, value in enumerate(values):
        if not isinstance(value, item):
            errors.append(_wrong_type(f"{path}.{key}[{index}]", value, _JSON_TYPES[item]))
    return values


def _wrong_type(path: str, value: Any, expected: str) -> FieldError:
    return invalid(path, _json_type(value), f"must be of type {expected}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for kind, name in _JSON_TYPES.items() if type(value) is kind), "number")


def _from_pydantic(error: Any) -> FieldError:
    path = _path(error["loc"])
    if error["type"] == "missing":
        return FieldError(path, "Required value")
    value = error.get("input")
    shown = value if isinstance(value, bool | int | float | str) else _json_type(value)
    message = str(error["msg"])
    if isinstance(shown, str) and not isinstance(value, str):
        # Non-scalar inputs are named by their JSON type, quoted, as the API server does.
        return FieldError(path, f"Invalid value: {go_quote(shown)}: {message}")
    return invalid(path, shown, message)


def _path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    previous: int | str | None = None
    for item in loc:
        if isinstance(item, int) or previous in _MAP_FIELDS:
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
        previous = item
    return "".join(parts)

"""The one name for a Kubernetes object, or any part of one, as JSON decodes it.

It loads nothing of the operator's (orjson alone, a C extension), so the agent and the console
share it without loading what the operator loads.
"""

import copy
from typing import Any, TypeVar

import orjson

JSON = dict[str, Any]

_J = TypeVar("_J")

LOG_REF = "k8s_ref"
"""The ``extra=`` key of a log record that names the object the line is about: the key Kopf's own
per-object records carry, so the operator's lines and Kopf's read alike
(:mod:`mpijob.platform.logs` prints it)."""


def about(kind: str, namespace: str | None, name: str | None) -> JSON:
    """``extra=`` for a log line about one object: ``log.info(..., extra=about(...))``."""
    return {LOG_REF: {"kind": kind, "namespace": namespace, "name": name}}


#: What :func:`clone` refuses to turn into strings: a time, a dataclass or a subclass of a JSON
#: type is not JSON, and its copy must keep its type.
_STRICT = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def clone(value: _J) -> _J:
    """A deep copy of JSON data (an object's body, a pod template): written and read back by
    orjson, in C, about eight times faster than :func:`copy.deepcopy`, which the reconcile ran
    for every pod it builds. What orjson will not write (an integer beyond 64 bits or a lone
    surrogate, which a tenant's object may carry and the standard library decodes; anything not
    JSON) is copied by :func:`copy.deepcopy`. Only for JSON: orjson writes an infinite float as
    null, and the API server, whose decoder refuses numbers beyond float64's range, sends none."""
    try:
        return orjson.loads(orjson.dumps(value, option=_STRICT))  # type: ignore[no-any-return]
    except TypeError:  # orjson.JSONEncodeError
        return copy.deepcopy(value)

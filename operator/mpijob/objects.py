"""The one name for a Kubernetes object, or any part of one, as JSON decodes it.

Dependency-free, so the agent and the console share it with the operator without loading what
the operator loads.
"""

from typing import Any

JSON = dict[str, Any]

LOG_REF = "k8s_ref"
"""The ``extra=`` key of a log record that names the object the line is about: the key Kopf's own
per-object records carry, so the operator's lines and Kopf's read alike
(:mod:`mpijob.platform.logs` prints it)."""


def about(kind: str, namespace: str | None, name: str | None) -> JSON:
    """``extra=`` for a log line about one object: ``log.info(..., extra=about(...))``."""
    return {LOG_REF: {"kind": kind, "namespace": namespace, "name": name}}

"""Reading the kustomize base's files for the manifest tests (no kustomize needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "manifests" / "base"
OPERATOR_RBAC = BASE / "rbac" / "operator.yaml"
AGENT_RBAC = BASE / "rbac" / "agent.yaml"

Permission = tuple[str, str, str]
"""(API group, resource, verb)."""


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(path: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for d in documents(path) if d["kind"] == kind and name in (None, d["metadata"]["name"])
    ]
    assert len(found) == 1, f"{path}: {len(found)} {kind} {name or ''}"
    return found[0]


def permissions(rules: list[dict[str, Any]]) -> set[Permission]:
    """Rules flattened to single (group, resource, verb) grants."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def operator_permissions() -> tuple[set[Permission], set[Permission]]:
    """The operator's (cluster-wide, lock-namespace-only) grants from the RBAC file."""
    cluster = permissions(one(OPERATOR_RBAC, "ClusterRole")["rules"])
    namespaced = permissions(one(OPERATOR_RBAC, "Role")["rules"])
    return cluster, namespaced

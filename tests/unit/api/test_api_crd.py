"""The CRD agrees with the models, upstream's schema and its own promises.

Only the API server evaluates CEL; here the structural part of the schema (types, enums,
minimums, required fields) is checked with a small evaluator, so that fixtures classified as the
operator's are known to pass the schema and the upstream examples are known to fit it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpijob import keys
from mpijob.api import validation

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
CRD = yaml.safe_load((ROOT / "crds" / "kubeflow.org_mpijobs.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]
DATA = ROOT / "tests" / "data"


def test_identity_matches_upstream() -> None:
    assert CRD["metadata"]["name"] == "mpijobs.kubeflow.org"
    assert CRD["spec"]["group"] == keys.GROUP
    assert CRD["spec"]["scope"] == "Namespaced"
    assert CRD["spec"]["names"] == {
        "kind": "MPIJob",
        "listKind": "MPIJobList",
        "plural": "mpijobs",
        "singular": "mpijob",
    }
    assert [v["name"] for v in CRD["spec"]["versions"]] == [keys.VERSION]
    assert VERSION["served"] is True
    assert VERSION["storage"] is True
    assert VERSION["subresources"] == {"status": {}}
    assert SPEC["required"] == ["mpiReplicaSpecs"]


def test_defaults_and_enums_match_the_operator() -> None:
    props = SPEC["properties"]
    assert props["slotsPerWorker"]["default"] == 1
    assert props["sshAuthMountPath"]["default"] == keys.DEFAULT_SSH_AUTH_MOUNT_PATH
    assert props["launcherCreationPolicy"]["default"] == keys.LAUNCHER_AT_STARTUP
    assert "enum" not in props["launcherCreationPolicy"]
    assert props["mpiImplementation"]["default"] == keys.IMPL_OPENMPI
    assert set(props["mpiImplementation"]["enum"]) == set(validation.VALID_IMPLEMENTATIONS)
    run_policy = props["runPolicy"]["properties"]
    assert set(run_policy["cleanPodPolicy"]["enum"]) == set(validation.VALID_CLEAN_POD_POLICIES)
    assert "enum" not in run_policy["managedBy"]
    for name in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        assert run_policy[name]["minimum"] == 0


def test_status_schema_is_upstreams() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    assert set(status) == {
        "conditions",
        "replicaStatuses",
        "startTime",
        "completionTime",
        "lastReconcileTime",
    }
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert sorted(conditions["items"]["required"]) == ["status", "type"]
    assert set(conditions["items"]["properties"]) == {
        "type",
        "status",
        "reason",
        "message",
        "lastUpdateTime",
        "lastTransitionTime",
    }
    replica = status["replicaStatuses"]["additionalProperties"]["properties"]
    assert set(replica) == {"active", "succeeded", "failed", "labelSelector", "selector"}


def _properties(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, sub in (schema.get("properties") or {}).items():
        found.append((f"{path}.{name}", sub))
        found += _properties(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _properties(schema[key], f"{path}[*]")
    return found


def test_every_field_is_described_for_kubectl_explain() -> None:
    missing = [
        path
        for path, sub in _properties(SCHEMA, "mpijob")
        if path != "mpijob.metadata" and not sub.get("description")
    ]
    assert missing == []


def test_every_cel_rule_names_its_field() -> None:
    rules = []

    def collect(schema: dict[str, Any]) -> None:
        rules.extend(schema.get("x-kubernetes-validations") or [])
        for sub in (schema.get("properties") or {}).values():
            collect(sub)
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                collect(schema[key])

    collect(SCHEMA)
    assert len(rules) >= 8
    for rule in rules:
        text = rule.get("message") or rule.get("messageExpression")
        assert text, rule
        assert re.search(r"(spec\.mpiReplicaSpecs\[(Launcher|Worker)\]|metadata\.name)", text)


def test_printer_columns_cover_state_workers_and_age() -> None:
    columns = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    for condition in ("Running", "Succeeded", "Failed", "Suspended"):
        assert f'@.type=="{condition}"' in columns[condition]
    assert columns["Workers"] == ".spec.mpiReplicaSpecs.Worker.replicas"
    assert columns["Age"] == ".metadata.creationTimestamp"


# --- a small structural evaluator (no CEL) ---------------------------------------------------

_JSON = {"object": dict, "array": list, "string": str, "boolean": bool}


def _structural_errors(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if "anyOf" in schema or schema.get("x-kubernetes-int-or-string"):
        return []
    kind = schema.get("type")
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [f"{path}: must be of type integer"]
    elif kind in _JSON and not isinstance(value, _JSON[kind]):
        return [f"{path}: must be of type {kind}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: Unsupported value")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: should be greater than or equal to {schema['minimum']}")
    if isinstance(value, dict):
        errors += [
            f"{path}.{r}: Required value" for r in schema.get("required", []) if r not in value
        ]
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += _structural_errors(sub, item, f"{path}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += _structural_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def _header(path: Path) -> tuple[str, str]:
    who, field = path.read_text().splitlines()[0].removeprefix("# expect: ").split(" ", 1)
    return who, field


@pytest.mark.parametrize(
    "path",
    sorted((DATA / "golden").glob("*.mpijob.yaml"))
    + [p for p in sorted((DATA / "invalid").glob("*.yaml")) if _header(p)[0] == "operator"],
    ids=lambda p: p.name,
)
def test_upstream_examples_and_operator_fixtures_fit_the_schema(path: Path) -> None:
    body = yaml.safe_load(path.read_text())
    assert _structural_errors(SCHEMA, body, "") == []


@pytest.mark.parametrize(
    "name",
    [
        "worker-replicas-string",
        "worker-replicas-float",
        "slots-string",
        "negative-slots",
        "unknown-implementation",
        "bad-clean-pod-policy",
        "negative-ttl",
        "negative-deadline",
        "negative-backoff",
        "suspend-string",
        "launcher-as-worker-string",
        "launcher-command-string",
        "missing-replica-specs",
    ],
)
def test_schema_fixtures_fail_the_schema_at_their_field(name: str) -> None:
    path = DATA / "invalid" / f"{name}.yaml"
    who, field = _header(path)
    assert who == "apiserver"
    errors = _structural_errors(SCHEMA, yaml.safe_load(path.read_text()), "")
    dotted = re.sub(r"\[([A-Za-z][^\]]*)\]", r".\1", field)
    assert any(f".{dotted}:" in e for e in errors), errors

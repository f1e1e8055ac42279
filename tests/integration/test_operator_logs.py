"""The operator's real log lines, as the person on call reads them and a log pipeline parses them.

An admission policy refuses every Event in the test's namespace, so the operator's Event for a
new MPIJob fails to post; its log line must say when, how bad, about which job, and why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from support.jobs import mpijob
from support.kube import Cluster
from support.mpijobs import MPIJobs
from support.operator import OperatorProcess
from support.wait import wait_until

pytestmark = pytest.mark.integration

REFUSAL = "Events are refused in this namespace"
#: klog's header and its first pair (the logger), as Kubernetes' log tooling reads them.
KLOG = re.compile(r'^([IWEF])(\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d{6}) +\d+ [\w.]+:\d+\] "(.*?)"(.*)$')


@pytest.fixture
def events_refused(crds: Cluster, namespace: str) -> Iterator[None]:
    """A ValidatingAdmissionPolicy that denies creating Events in ``namespace``, in force."""
    name = f"refuse-events-{namespace}"[:63]
    policies = crds.resource("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")
    bindings = crds.resource("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding")
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"]}
    policies.create(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{**rule, "resources": ["events"]}]},
                "validations": [{"expression": "false", "message": REFUSAL}],
            },
        }
    )
    bindings.create(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )

    def refused() -> bool:
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="probe-"),
            involved_object=client.V1ObjectReference(
                kind="ConfigMap", name="probe", namespace=namespace
            ),
            reason="Probe",
            message="probe",
        )
        try:
            made = crds.core.create_namespaced_event(namespace, event)
        except ApiException as e:
            return REFUSAL in str(e.body)
        crds.core.delete_namespaced_event(made.metadata.name, namespace)
        return False

    try:
        wait_until(refused, timeout=30, what="the policy refusing Events")
        yield
    finally:
        bindings.delete(name)
        policies.delete(name)


def failed_post(op: OperatorProcess, parse: Callable[[str], dict[str, Any] | None]) -> Any:
    def found() -> dict[str, Any] | None:
        for line in op.logs().splitlines():
            parsed = parse(line)
            if parsed and parsed["msg"] == "Failed to post event":
                return parsed
        return None

    return wait_until(found, timeout=60, what="the operator's 'Failed to post event' line")


def klog_line(line: str) -> dict[str, Any] | None:
    m = KLOG.match(line)
    if m is None:
        return None
    letter, month, day, clock, msg, rest = m.groups()
    pairs = {k: json.loads(v) for k, v in re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)', rest)}
    return {"letter": letter, "when": (int(month), int(day), clock), "msg": msg, **pairs}


def json_line(line: str) -> dict[str, Any] | None:
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def recent(at: datetime) -> bool:
    return abs(datetime.now(UTC) - at) < timedelta(minutes=5)


def test_text_lines_say_when_how_bad_which_job_and_why(
    crds: Cluster,
    namespace: str,
    events_refused: None,
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
) -> None:
    op = start_operator()
    mpijobs.create(mpijob("pi", workers=1))
    line = failed_post(op, klog_line)
    month, day, clock = line["when"]
    now = datetime.now(UTC)
    at = datetime.strptime(f"{now.year}-{month}-{day} {clock}", "%Y-%m-%d %H:%M:%S.%f")
    assert recent(at.replace(tzinfo=UTC)), line
    assert line["letter"] == "W"
    assert line["logger"] == "mpijob.platform.recorder"
    assert (line["object"], line["kind"]) == (f"{namespace}/pi", "MPIJob")
    assert REFUSAL in line["error"]
    # Every line is one klog line (or a traceback line under one): nothing bare.
    for text in op.logs().splitlines():
        assert KLOG.match(text) or text.startswith("\t"), text


def test_json_lines_are_zaps_with_the_job_and_the_error(
    crds: Cluster,
    namespace: str,
    events_refused: None,
    start_operator: Callable[..., OperatorProcess],
    mpijobs: MPIJobs,
) -> None:
    op = start_operator("--log-format", "json")
    mpijobs.create(mpijob("pi", workers=1))
    line = failed_post(op, json_line)
    assert recent(datetime.fromisoformat(line["ts"])), line
    assert line["level"] == "warn"
    assert line["logger"] == "mpijob.platform.recorder"
    assert line["object"] == {"kind": "MPIJob", "namespace": namespace, "name": "pi"}
    assert (line["namespace"], line["name"]) == (namespace, "pi")
    assert REFUSAL in line["error"]
    for text in op.logs().splitlines():  # every line is one JSON object with zap's keys
        parsed = json.loads(text)
        assert {"ts", "level", "logger", "msg"} <= parsed.keys(), text

"""What the pod watch keeps of a pod: enough to say why it failed and whether it is reachable."""

from __future__ import annotations

from typing import Any

import pytest

from mpijob.desired import observed
from mpijob.handlers.watches import pod_summary

pytestmark = pytest.mark.unit


def oom_killed_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "pi-worker-0", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"nodeName": "n", "containers": [{"name": "w", "image": "i", "env": ["..."]}]},
        "status": {
            "phase": "Failed",
            "podIP": "10.88.0.7",
            "containerStatuses": [
                {
                    "name": "w",
                    "image": "i",
                    "imageID": "sha256:...",
                    "containerID": "containerd://...",
                    "ready": False,
                    "state": {
                        "terminated": {
                            "reason": "OOMKilled",
                            "exitCode": 137,
                            "startedAt": "2026-01-01T00:00:00Z",
                            "finishedAt": "2026-01-01T00:00:20Z",
                            "containerID": "containerd://...",
                        }
                    },
                    "lastState": {"waiting": {"reason": "ImagePullBackOff", "message": "x" * 500}},
                }
            ],
        },
    }


def test_the_summary_keeps_container_states_and_the_ip_but_no_container_specs() -> None:
    summary = pod_summary(oom_killed_pod())  # type: ignore[arg-type]
    assert "containers" not in summary["spec"]
    assert summary["status"]["podIP"] == "10.88.0.7"
    (container,) = summary["status"]["containerStatuses"]
    assert container["state"] == {
        "terminated": {
            "reason": "OOMKilled",
            "exitCode": 137,
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:00:20Z",
        }
    }
    assert container["lastState"]["waiting"]["message"] == "x" * 200
    assert set(container) == {"name", "state", "lastState"}
    failure = observed.pod_failure(summary)
    assert failure is not None
    assert (failure.reason, failure.container, failure.exit_code) == ("OOMKilled", "w", 137)

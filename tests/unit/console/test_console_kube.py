"""Which API calls :class:`mpijob.console.kube.Api` makes for one namespace and for all."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from kubernetes.client.exceptions import ApiException

from mpijob import keys
from mpijob.console.kube import Api, ConsoleError

pytestmark = pytest.mark.unit

SELECTOR = f"{keys.LABEL_OPERATOR_NAME}={keys.OPERATOR_NAME}"


def api() -> Any:
    """An Api bound to namespace team-a whose client calls are mocks (no kubeconfig read)."""
    bound = Api.__new__(Api)
    bound.namespace = "team-a"
    bound._client = mock.Mock(sanitize_for_serialization=lambda obj: obj)
    bound._core = mock.Mock()
    bound._custom = mock.Mock()
    return bound


def test_list_jobs_reads_one_namespace_or_the_whole_cluster() -> None:
    a = api()
    a._custom.list_namespaced_custom_object.return_value = {"items": [{"n": 1}]}
    a._custom.list_cluster_custom_object.return_value = {"items": [{"n": 1}, {"n": 2}]}
    assert a.list_jobs() == [{"n": 1}]
    a._custom.list_namespaced_custom_object.assert_called_once_with(
        keys.GROUP, keys.VERSION, "team-a", keys.PLURAL
    )
    assert a.list_jobs(all_namespaces=True) == [{"n": 1}, {"n": 2}]
    a._custom.list_cluster_custom_object.assert_called_once_with(
        keys.GROUP, keys.VERSION, keys.PLURAL
    )


def test_job_pods_read_one_namespace_or_the_whole_cluster() -> None:
    a = api()
    a._core.list_namespaced_pod.return_value = SimpleNamespace(items=[{"p": 1}])
    a._core.list_pod_for_all_namespaces.return_value = SimpleNamespace(items=[{"p": 2}])
    assert a.job_pods() == [{"p": 1}]
    a._core.list_namespaced_pod.assert_called_once_with("team-a", label_selector=SELECTOR)
    assert a.job_pods(all_namespaces=True) == [{"p": 2}]
    a._core.list_pod_for_all_namespaces.assert_called_once_with(label_selector=SELECTOR)


def test_no_right_to_list_every_namespace_is_one_clear_error() -> None:
    a = api()
    a._custom.list_cluster_custom_object.side_effect = ApiException(status=403)
    with pytest.raises(ConsoleError, match=r"MPIJobs in all namespaces \(HTTP 403\)"):
        a.list_jobs(all_namespaces=True)

"""One sync as data: the action lists of upstream ``mpi_job_controller_test.go``.

Each test names the upstream scenario it covers. The plan says what to write, in order; the
status is covered in test_desired_status.py.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from mpijob import api
from mpijob.desired import config_map, sync
from mpijob.desired import status as rules
from support.desired_jobs import make_job, pod

pytestmark = pytest.mark.unit

NOW = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def worker(name: str, phase: str, job: str = "test", **kw: Any) -> dict[str, Any]:
    """A worker pod as the reconciler sees it: labelled with its role, controlled by the job."""
    p = pod(name, phase, **kw)
    p["metadata"]["labels"] = {"training.kubeflow.org/job-role": "worker"}
    p["metadata"]["ownerReferences"] = [{"kind": "MPIJob", "uid": f"uid-{job}", "controller": True}]
    return p


def created(job: api.MPIJob) -> api.MPIJob:
    job.status = rules.mark_created(job, NOW).status
    return job


WHOLE = ("Service", "ConfigMap", "Secret", "PodGroup")


def kinds(plan: sync.Plan) -> list[str]:
    out = []
    for a in plan.actions:
        match a:
            case sync.Create(obj=obj) if obj["kind"] in WHOLE:
                out.append(obj["kind"])
            case sync.Create(obj=obj):
                out.append(f"{obj['kind']}/{obj['metadata']['name']}")
            case sync.Delete(kind=kind, name=name):
                out.append(f"delete {kind}/{name}")
            case sync.Patch(kind="Job", subresource="status"):
                out.append("clear launcher startTime")
            case sync.Patch(kind="Job"):
                out.append("suspend launcher")
            case sync.Replace(obj=obj) if obj["kind"] == "Job":
                out.append("resume launcher")
            case sync.Patch(kind=kind):
                out.append(f"patch {kind}")
            case sync.Replace(obj=obj):
                out.append(f"replace {obj['kind']}")
    return out


def creates(plan: sync.Plan) -> list[sync.Create]:
    return [a for a in plan.actions if isinstance(a, sync.Create)]


def launcher_job(job: api.MPIJob, *, suspended: bool = False, **status: Any) -> dict[str, Any]:
    built, _ = sync.launcher.build_launcher_job(job)
    built["metadata"]["uid"] = "uid-launcher"
    built["spec"]["suspend"] = suspended
    built["status"] = status
    return built


@pytest.mark.parametrize("implementation", ["OpenMPI", "Intel", "MPICH"])
def test_all_resources_created(implementation: str) -> None:
    """Counterpart of upstream TestAllResourcesCreated/{OpenMPI,Intel,MPICH}: creation order."""
    job = make_job(name="foo", namespace="default", workers=5, implementation=implementation)
    plan = sync.plan(job, sync.Observed(), NOW)
    assert kinds(plan) == [
        "Service",
        "ConfigMap",
        "Secret",
        *[f"Pod/foo-worker-{i}" for i in range(5)],
        "Job/foo-launcher",
    ]
    config = next(a.obj for a in creates(plan) if a.obj["kind"] == "ConfigMap")
    assert config["data"]["discover_hosts.sh"] == "#!/bin/sh\n"
    result = rules.next_status(job, sync.Observed(), NOW)
    assert result.changed
    assert [e.reason for e in result.every_event()] == ["MPIJobCreated"]


def test_shutdown_worker() -> None:
    """Counterpart of upstream TestShutdownWorker: finished with cleanPodPolicy All."""
    job = created(
        make_job(name="test", namespace="default", workers=8, run_policy={"cleanPodPolicy": "All"})
    )
    rules.set_condition(job.status, "Succeeded", "True", "MPIJobSucceeded", "done", NOW)
    job.status.completion_time = NOW
    workers = [worker(f"test-worker-{i}", "Running") for i in range(8)]
    plan = sync.plan(job, sync.Observed(pods=workers), NOW)
    assert kinds(plan) == [f"delete Pod/test-worker-{i}" for i in range(8)]
    result = rules.next_status(job, sync.Observed(pods=workers), NOW)
    assert result.changed, "the cleanup resets the worker counts"
    assert result.status.to_body()["replicaStatuses"] == {"Worker": {}}
    job.status = result.status
    again = rules.next_status(job, sync.Observed(pods=workers), NOW)
    assert not again.changed, "the same status is not written again on every sync"


@pytest.mark.parametrize("implementation", ["OpenMPI", "Intel", "MPICH"])
def test_create_suspended_mpijob(implementation: str) -> None:
    """Counterpart of upstream TestCreateSuspendedMPIJob: children and a suspended launcher,
    no workers."""
    job = make_job(
        name="test",
        namespace="default",
        workers=2,
        implementation=implementation,
        run_policy={"suspend": True},
    )
    plan = sync.plan(job, sync.Observed(), NOW)
    assert kinds(plan) == ["Service", "ConfigMap", "Secret", "Job/test-launcher"]
    launcher = plan.actions[-1]
    assert isinstance(launcher, sync.Create)
    assert launcher.obj["spec"]["suspend"] is True


def test_suspended_running_mpijob() -> None:
    """Counterpart of upstream TestSuspendedRunningMPIJob: suspend the Job, delete workers."""
    job = created(
        make_job(name="test", namespace="default", workers=8, run_policy={"suspend": True})
    )
    workers = [worker(f"test-worker-{i}", "Running") for i in range(8)]
    seen = sync.Observed(launcher_job=launcher_job(job), pods=workers)
    plan = sync.plan(job, seen, NOW)
    assert kinds(plan) == [
        "Service",
        "ConfigMap",
        "Secret",
        "suspend launcher",
        *[f"delete Pod/test-worker-{i}" for i in range(8)],
    ]


def test_resume_mpijob() -> None:
    """Counterpart of upstream TestResumeMPIJob: create the workers, then resume the Job."""
    job = created(make_job(name="test", namespace="default", workers=8))
    rules.set_condition(job.status, "Suspended", "True", "MPIJobSuspended", "MPIJob suspended", NOW)
    seen = sync.Observed(launcher_job=launcher_job(job, suspended=True))
    plan = sync.plan(job, seen, NOW)
    assert kinds(plan) == [
        "Service",
        "ConfigMap",
        "Secret",
        *[f"Pod/test-worker-{i}" for i in range(8)],
        "resume launcher",
    ]
    resumed = plan.actions[-1]
    assert isinstance(resumed, sync.Replace)
    assert resumed.obj["spec"]["suspend"] is False
    assert "clear launcher startTime" not in kinds(plan)


def test_resume_mpijob_clears_start_time() -> None:
    """Counterpart of upstream TestResumeMPIJobClearsStartTime: status.startTime first."""
    job = created(make_job(name="test", namespace="default", workers=1))
    seen = sync.Observed(
        launcher_job=launcher_job(job, suspended=True, startTime="2024-05-01T09:00:00Z")
    )
    plan = sync.plan(job, seen, NOW)
    assert kinds(plan)[-2:] == ["clear launcher startTime", "resume launcher"]
    clear, resumed = plan.actions[-2:]
    assert isinstance(clear, sync.Patch)
    assert clear.patch == {"status": {"startTime": None}}
    assert isinstance(resumed, sync.Replace)
    assert "status" not in resumed.obj


def test_resume_mpijob_with_existing_launcher() -> None:
    """Counterpart of upstream TestResumeMPIJobWithExistingLauncher: scheduling directives."""
    directives = {
        "metadata": {"annotations": {"kueue.x-k8s.io/workload": "my-workload"}},
        "spec": {
            "containers": [{"name": "launcher", "image": "mpi"}],
            "nodeSelector": {"foo": "bar"},
            "tolerations": [{"key": "foo", "operator": "Exists", "effect": "NoSchedule"}],
            "schedulingGates": [{"name": "kueue.x-k8s.io/topology"}],
        },
    }
    suspended = make_job(name="test", namespace="default", workers=1)
    job = created(
        make_job(name="test", namespace="default", workers=1, launcher_template=directives)
    )
    seen = sync.Observed(launcher_job=launcher_job(suspended, suspended=True))
    resumed = sync.plan(job, seen, NOW).actions[-1]
    assert isinstance(resumed, sync.Replace)
    template = resumed.obj["spec"]["template"]
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/workload"] == "my-workload"
    assert template["spec"]["nodeSelector"] == {"foo": "bar"}
    assert template["spec"]["tolerations"] == directives["spec"]["tolerations"]
    assert template["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]


def test_unsuspend_launcher_update_failure_does_not_poison_cache() -> None:
    """Counterpart of upstream TestUnsuspendLauncherUpdateFailureDoesNotPoisonCache.

    Planning a resume never modifies the observed launcher (the cache's object): if the update
    then fails, the cache still says suspended, and the next sync tries again.
    """
    job = created(make_job(name="test", namespace="default", workers=1))
    observed = launcher_job(job, suspended=True, startTime="2024-05-01T09:00:00Z")
    before = copy.deepcopy(observed)
    sync.plan(job, sync.Observed(launcher_job=observed), NOW)
    assert observed == before


def test_worker_ready_creates_the_launcher() -> None:
    """Counterpart of upstream TestWorkerReady: 16 ready workers and no launcher."""
    job = created(
        make_job(
            name="test",
            namespace="default",
            workers=16,
            launcherCreationPolicy="WaitForWorkersReady",
        )
    )
    workers = [worker(f"test-worker-{i}", "Running", ready=True) for i in range(16)]
    plan = sync.plan(job, sync.Observed(pods=workers), NOW)
    assert kinds(plan)[-1] == "Job/test-launcher"
    not_ready = [worker(f"test-worker-{i}", "Running", ready=i != 3) for i in range(16)]
    assert "Job/test-launcher" not in kinds(sync.plan(job, sync.Observed(pods=not_ready), NOW))


def test_scale_down_deletes_workers_by_name() -> None:
    """Beyond upstream: with runLauncherAsWorker the last wanted worker is not deleted."""
    job = created(make_job(name="test", namespace="default", workers=2, launcher_as_worker=True))
    workers = [worker(f"test-worker-{i}", "Running") for i in range(4)]
    plan = sync.plan(job, sync.Observed(pods=workers), NOW)
    assert [k for k in kinds(plan) if k.startswith("delete")] == [
        "delete Pod/test-worker-2",
        "delete Pod/test-worker-3",
    ]


def test_not_admitted_job_gets_no_workers_and_no_launcher() -> None:
    job = make_job(name="test", namespace="default", workers=2)
    plan = sync.plan(job, sync.Observed(), NOW, sync.Options(admitted=False))
    assert kinds(plan) == ["Service", "ConfigMap", "Secret"]


def test_placement_pins_each_worker_to_its_node_with_its_gpus() -> None:
    job = make_job(name="test", namespace="default", workers=2)
    where = [
        sync.PodPlacement("node-a", {"mpijob.io/gpu-ids": "1"}),
        sync.PodPlacement("node-b", {"mpijob.io/gpu-ids": "5"}),
    ]
    plan = sync.plan(job, sync.Observed(), NOW, sync.Options(placement=where))
    pods = [a.obj for a in creates(plan) if a.obj["kind"] == "Pod"]
    for p, w in zip(pods, where, strict=True):
        assert (
            p["metadata"]["annotations"]["mpijob.io/gpu-ids"] == w.annotations["mpijob.io/gpu-ids"]
        )
        terms = p["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [w.node]}
                ]
            }
        ]


# --- every sync ensures every child ------------------------------------------------------------


def children(job: api.MPIJob) -> dict[str, dict[str, Any]]:
    """The job's Service, ConfigMap and Secret as the watches show them when nothing drifted."""
    built = {a.obj["kind"]: a.obj for a in creates(sync.plan(job, sync.Observed(), NOW))}
    secret = {**built["Secret"], "data": dict.fromkeys(built["Secret"]["data"], "")}
    secret["metadata"] = {**secret["metadata"], "resourceVersion": "7"}
    return {"service": built["Service"], "config_map": built["ConfigMap"], "secret": secret}


def test_a_sync_with_every_child_in_place_writes_nothing() -> None:
    job = created(make_job(name="test", namespace="default", workers=2))
    pods = [worker(f"test-worker-{i}", "Pending") for i in range(2)]
    seen = sync.Observed(launcher_job=launcher_job(job), pods=pods, **children(job))
    assert sync.plan(job, seen, NOW).actions == []


@pytest.mark.parametrize("deleted", ["service", "config_map", "secret"])
def test_a_child_deleted_by_hand_is_created_again(deleted: str) -> None:
    job = created(make_job(name="test", namespace="default", workers=2))
    pods = [worker(f"test-worker-{i}", "Pending") for i in range(2)]
    present = {k: v for k, v in children(job).items() if k != deleted}
    plan = sync.plan(job, sync.Observed(launcher_job=launcher_job(job), pods=pods, **present), NOW)
    expected = {"service": "Service", "config_map": "ConfigMap", "secret": "Secret"}[deleted]
    assert kinds(plan) == [expected]


def test_a_worker_deleted_by_hand_is_created_again() -> None:
    job = created(make_job(name="test", namespace="default", workers=3))
    pods = [worker(f"test-worker-{i}", "Running") for i in (0, 2)]
    seen = sync.Observed(launcher_job=launcher_job(job), pods=pods, **children(job))
    assert kinds(sync.plan(job, seen, NOW)) == ["patch ConfigMap", "Pod/test-worker-1"]


def pending_worker() -> dict[str, Any]:
    return worker("test-worker-0", "Pending")


def test_a_drifted_service_gets_its_selector_back() -> None:
    job = created(make_job(name="test", namespace="default", workers=1))
    seen_children = children(job)
    seen_children["service"] = {**seen_children["service"], "spec": {"selector": {"app": "x"}}}
    plan = sync.plan(
        job,
        sync.Observed(launcher_job=launcher_job(job), pods=[pending_worker()], **seen_children),
        NOW,
    )
    [patch] = plan.actions
    assert isinstance(patch, sync.Patch)
    assert (patch.kind, patch.name) == ("Service", "test")
    assert patch.patch["spec"]["selector"]["training.kubeflow.org/job-name"] == "test"


def test_hostfile_drift_is_patched() -> None:
    job = created(make_job(name="test", namespace="default", workers=1))
    seen_children = children(job)
    desired = seen_children["config_map"]["data"]
    seen_children["config_map"] = {
        **seen_children["config_map"],
        "data": {**desired, "hostfile": "stale\n"},
    }
    plan = sync.plan(
        job,
        sync.Observed(launcher_job=launcher_job(job), pods=[pending_worker()], **seen_children),
        NOW,
    )
    [patch] = plan.actions
    assert isinstance(patch, sync.Patch)
    assert patch.patch == {"data": desired}
    assert not patch.deferrable, "the hostfile is read by the launcher: it goes out in the sync"


def test_foreign_keys_in_the_config_map_replace_its_data_whole() -> None:
    """The cache keeps digests of the operator's keys only and marks that others exist (a
    tenant's data costs nothing to hold): the sync replaces the data, dropping them."""
    job = created(make_job(name="test", namespace="default", workers=1))
    seen_children = children(job)
    desired = seen_children["config_map"]["data"]
    live = {**desired, "extra": "x" * 100_000}
    summary = {
        **seen_children["config_map"],
        "metadata": {**seen_children["config_map"]["metadata"], "resourceVersion": "7"},
        config_map.DIGESTS: config_map.digests(live),
    }
    del summary["data"]
    assert len(str(summary[config_map.DIGESTS])) < 200
    seen_children["config_map"] = summary
    plan = sync.plan(
        job,
        sync.Observed(launcher_job=launcher_job(job), pods=[pending_worker()], **seen_children),
        NOW,
    )
    [replace] = plan.actions
    assert isinstance(replace, sync.Replace)
    assert replace.obj["data"] == desired
    assert replace.obj["metadata"]["resourceVersion"] == "7"


def test_a_config_map_summary_equal_to_the_desired_data_needs_nothing() -> None:
    job = created(make_job(name="test", namespace="default", workers=1))
    seen_children = children(job)
    whole = seen_children["config_map"]
    seen_children["config_map"] = {
        "metadata": whole["metadata"],
        config_map.DIGESTS: config_map.digests(whole["data"]),
    }
    plan = sync.plan(
        job,
        sync.Observed(launcher_job=launcher_job(job), pods=[pending_worker()], **seen_children),
        NOW,
    )
    assert not [a for a in plan.actions if getattr(a, "kind", "") == "ConfigMap"]


def test_a_discover_hosts_refresh_may_go_out_after_the_sync() -> None:
    job = created(make_job(name="test", namespace="default", workers=2))
    pods = [worker(f"test-worker-{i}", "Running") for i in range(2)]
    seen = sync.Observed(launcher_job=launcher_job(job), pods=pods, **children(job))
    [patch] = sync.plan(job, seen, NOW).actions
    assert isinstance(patch, sync.Patch)
    assert patch.kind == "ConfigMap"
    assert "test-worker-1" in patch.patch["data"]["discover_hosts.sh"]
    assert patch.deferrable


def test_a_secret_with_the_wrong_keys_is_replaced_with_a_new_pair() -> None:
    job = created(make_job(name="test", namespace="default", workers=1))
    seen_children = children(job)
    seen_children["secret"] = {**seen_children["secret"], "data": {"only-one": ""}}
    options = sync.Options(new_key_pair=lambda: (b"PRIVATE", b"PUBLIC"))
    plan = sync.plan(
        job,
        sync.Observed(launcher_job=launcher_job(job), pods=[pending_worker()], **seen_children),
        NOW,
        options,
    )
    [replace] = plan.actions
    assert isinstance(replace, sync.Replace)
    assert replace.obj["metadata"]["resourceVersion"] == "7", "a concurrent change conflicts"
    assert set(replace.obj["data"]) == {"ssh-privatekey", "ssh-publickey"}


# --- a finished job stays finished -----------------------------------------------------------


def finished(ttl: int | None, at: datetime = NOW) -> api.MPIJob:
    policy = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    job = created(make_job(name="test", namespace="default", workers=1, run_policy=policy))
    rules.set_condition(job.status, "Succeeded", "True", "MPIJobSucceeded", "done", at)
    job.status.completion_time = at
    return job


def test_the_launcher_job_carries_no_ttl_the_operator_applies_it() -> None:
    job = make_job(name="test", namespace="default", run_policy={"ttlSecondsAfterFinished": 0})
    plan = sync.plan(job, sync.Observed(), NOW)
    built = next(a.obj for a in creates(plan) if a.obj["kind"] == "Job")
    assert "ttlSecondsAfterFinished" not in built["spec"]


def test_a_finished_job_s_launcher_goes_once_its_ttl_has_passed() -> None:
    job = finished(ttl=0)
    plan = sync.plan(job, sync.Observed(launcher_job=launcher_job(job)), NOW)
    assert plan.actions == [sync.Delete("batch/v1", "Job", "test-launcher", "uid-launcher")]
    assert plan.requeue_after is None


def test_before_its_ttl_has_passed_the_launcher_stays_and_the_sync_comes_back() -> None:
    job = finished(ttl=60)
    later = NOW.replace(second=20)
    plan = sync.plan(job, sync.Observed(launcher_job=launcher_job(job)), later)
    assert plan.actions == []
    assert plan.requeue_after == 40


def test_without_a_ttl_a_finished_job_s_launcher_stays() -> None:
    job = finished(ttl=None)
    plan = sync.plan(job, sync.Observed(launcher_job=launcher_job(job)), NOW)
    assert plan.actions == []
    assert plan.requeue_after is None


def test_a_job_whose_status_says_it_finished_never_gets_a_launcher_again() -> None:
    # Failed without completionTime (eviction, as upstream) is not short-circuited, but its
    # launcher ran: one that is missing now was not lost before it started.
    job = created(make_job(name="test", namespace="default", workers=1))
    rules.set_condition(job.status, "Failed", "True", "MPIJobEvicted", "evicted", NOW)
    plan = sync.plan(job, sync.Observed(), NOW)
    assert not [a for a in creates(plan) if a.obj["kind"] == "Job"]
    gone = sync.plan(finished(ttl=0), sync.Observed(), NOW)
    assert gone.actions == []


def test_a_launcher_job_made_with_a_ttl_loses_it_while_the_job_runs() -> None:
    job = created(make_job(name="test", namespace="default", workers=1))
    live = launcher_job(job)
    live["spec"]["ttlSecondsAfterFinished"] = 0
    plan = sync.plan(job, sync.Observed(launcher_job=live), NOW)
    assert (
        sync.Patch("batch/v1", "Job", "test-launcher", {"spec": {"ttlSecondsAfterFinished": None}})
        in plan.actions
    )

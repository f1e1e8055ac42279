"""Which lane each integration test runs in when ``make test`` runs them side by side.

``make test`` runs the suite in two phases on one local cluster (docs/development.md, "Test
lanes"): first every test not in :data:`EXCLUSIVE`, spread over pytest-xdist workers, then the
:data:`EXCLUSIVE` ones one at a time with nothing beside them. In the first phase each test has
its own namespace and its own operator (watching only that namespace), and the tests of a lane
share something the namespace does not fence, so a lane runs on one worker, one test after
another:

- :data:`GPUS`: tests that take GPUs of the simulated nodes. An operator sees only its own
  namespace's pods and claims, so two of them would hand out the same GPUs; many also wait for
  every GPU to be idle (the ``idle_gpus`` fixture) or expect a particular node.
- :data:`REAL_NODES`: tests that run real workloads on the two real nodes, which have this
  machine's two cores each (real MPI, training, faults of real containers). One real workload
  at a time keeps those tests' timing what it is when they run alone.
- :data:`INSTALLS`: tests that install the operator into ``mpi-operator`` as users do (its
  Deployment, Lease, cluster-wide webhooks and RBAC have fixed names; each install removes the
  one before). The operator's own image runs on the real nodes, beside :data:`REAL_NODES`' one
  workload: what they run there asks for little CPU (upstream's pi, simulated jobs).
- :data:`FREE`: tests that touch nothing beyond their namespace; they run anywhere.
- :data:`EXCLUSIVE`: tests that change what every other test sees (nodes added, cordoned or
  lost, Kueue's cluster-wide webhooks, an operator watching every namespace, an audit check of
  every operator's writes).

The lanes are a table, not marks on the tests, because xdist's scheduler sees only test ids:
:func:`lane` reads a test's lane from its id. Every integration module is in :data:`MODULES`
(``tests/conftest.py`` refuses one that is not); :data:`TESTS` names the tests whose lane
differs from their module's.
"""

from __future__ import annotations

GPUS = "gpus"
REAL_NODES = "real-nodes"
INSTALLS = "installs"
FREE = "free"
EXCLUSIVE = "exclusive"
#: Lanes whose tests run one after another on one worker.
SERIAL = (GPUS, REAL_NODES, INSTALLS)

MODULES: dict[str, str] = {
    "test_admission_liveness.py": GPUS,
    "test_agent_reports_actual_gpus.py": GPUS,
    "test_bad_input.py": FREE,
    "test_console.py": GPUS,
    "test_crash_safety.py": FREE,
    "test_dra.py": GPUS,
    "test_dra_binding.py": GPUS,
    "test_examples.py": GPUS,
    "test_fabric.py": EXCLUSIVE,  # adds 36 tray nodes and a ComputeDomain CRD
    "test_failures.py": REAL_NODES,
    "test_faults.py": EXCLUSIVE,  # a node lost, spare nodes added (the rest: TESTS)
    "test_fractional.py": EXCLUSIVE,  # share nodes, a cluster-wide pod webhook
    "test_gang.py": GPUS,
    "test_workload_gang.py": GPUS,
    "test_gpu_quota.py": GPUS,
    "test_healing.py": FREE,
    "test_helm.py": INSTALLS,
    "test_incluster.py": INSTALLS,
    "test_install.py": INSTALLS,
    "test_kueue.py": EXCLUSIVE,  # Kueue's webhooks see every MPIJob and Job
    "test_launch_agent.py": REAL_NODES,
    "test_leader_election.py": GPUS,
    "test_lifecycle.py": FREE,
    "test_local_cluster.py": GPUS,
    "test_monitoring.py": GPUS,
    "test_operator_logs.py": FREE,
    "test_ownership.py": FREE,
    "test_placement.py": GPUS,
    "test_realnode.py": REAL_NODES,
    "test_tenant_events.py": FREE,
    "test_tenant_memory.py": FREE,
    "test_tenant_queue.py": GPUS,
    "test_tenant_status.py": FREE,
    "test_training.py": REAL_NODES,
    "test_trust.py": EXCLUSIVE,  # the agent's cluster-wide RBAC and policies
    "test_upstream_e2e.py": EXCLUSIVE,  # cordons the simulated nodes; watches every namespace
}
#: examples/ whose jobs ask for no GPU.
CPU_EXAMPLES = (
    "pi",
    "pi-intel",
    "pi-mpich",
    "pi-no-sshd",
    "pi-restricted",
    "pi-suspended",
    "pytorch-cpu",
)
#: Tests whose lane is not their module's, by ``file::name``, or ``file::name[parameters]`` for
#: one case of a parametrized test.
TESTS: dict[str, str] = {
    # Simulated GPUs, not the real nodes.
    "test_failures.py::test_workers_left_running_after_success_say_so_and_hold_gpus": GPUS,
    "test_failures.py::test_the_admins_default_clean_pod_policy_frees_the_gpus_of_jobs_that_set_none": GPUS,  # noqa: E501
    # No node added or lost, no GPU: their own namespace is all they touch.
    "test_faults.py::test_a_job_with_a_ttl_of_zero_runs_once_and_ends_succeeded": FREE,
    "test_faults.py::test_a_storm_of_sigkills_loses_no_created_event": FREE,
    # The examples that ask for no GPU (test_examples.py fails one that does, outside GPUS).
    **{
        f"test_examples.py::test_example_reaches_its_end_state[{example}.yaml]": FREE
        for example in CPU_EXAMPLES
    },
    "test_examples.py::test_suspended_example_runs_once_resumed": FREE,
}


def lane(nodeid: str) -> str | None:
    """The lane of an integration test by its id (``tests/integration/test_x.py::test_y[p]``,
    perhaps with a worker's suffix); None for a test outside the integration tier or a module
    missing from :data:`MODULES`."""
    path, _, name = nodeid.partition("::")
    if not path.startswith("tests/integration/"):
        return None
    module = path.rsplit("/", 1)[-1]
    case = name.split("@", 1)[0]
    test = case.split("[", 1)[0]
    return TESTS.get(f"{module}::{case}") or TESTS.get(f"{module}::{test}") or MODULES.get(module)

"""Which lane each integration test runs in when ``make test`` runs them side by side.

``make test`` runs the suite in two phases on one local cluster (docs/development.md, "Test
lanes"): first every test not marked :data:`EXCLUSIVE`, spread over pytest-xdist workers, then
the :data:`EXCLUSIVE` ones one at a time with nothing beside them. In the first phase each test
has its own namespace and its own operator (watching only that namespace), and tests that share
something the namespace does not fence run in one lane, one after another:

- :data:`GPUS`: tests that take GPUs of the simulated nodes. An operator sees only its own
  namespace's pods and claims, so two of them would hand out the same GPUs; many also wait for
  every GPU to be idle (the ``idle_gpus`` fixture) or expect a particular node.
- :data:`REAL_NODES`: tests that run real containers on the two real nodes, whose few cores
  they share, or install the operator into ``mpi-operator`` (its Deployment, Lease and
  cluster-wide webhooks and RBAC have fixed names).
- :data:`FREE`: tests that touch nothing beyond their namespace; they run anywhere.
- :data:`EXCLUSIVE`: tests that change what every other test sees (nodes added, cordoned or
  lost, cluster-wide webhooks such as Kueue's, an operator watching every namespace, an audit
  check of every operator's writes).

Every integration module says which (``tests/conftest.py`` refuses one that does not); a test
that differs from its module says so itself.
"""

from __future__ import annotations

import pytest

GPUS = pytest.mark.xdist_group("gpus")
REAL_NODES = pytest.mark.xdist_group("real-nodes")
FREE = pytest.mark.lane_free
EXCLUSIVE = pytest.mark.exclusive

#: The marks that name a lane: an integration test must carry one.
NAMES = ("xdist_group", "lane_free", "exclusive")

# mpijob-operator. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NODES ?= 4
TOPOLOGY ?= dgx1-v100
# Real nodes (kubelet + containerd running real containers) beside the simulated ones; 0 for none.
REAL_NODES ?= 2
export REAL_NODES
KUBECONFIG ?= $(CURDIR)/.cluster/kubeconfig
export KUBECONFIG

CACHE := $(or $(MPIJOB_CACHE),$(HOME)/.cache/mpijob-operator)
# The Kubernetes minor of the local cluster (1.35, 1.36 or 1.37; hack/versions.env).
K8S_VERSION ?= $(shell sed -n 's/^DEFAULT_K8S_VERSION=//p' hack/versions.env)
export K8S_VERSION
KUBE_VERSION := $(shell sed -n 's/^KUBE_VERSION_$(subst .,_,$(K8S_VERSION))=//p' hack/versions.env)
KUBECTL := $(CACHE)/bin/kubernetes-v$(KUBE_VERSION)/kubectl

.PHONY: help install bins cluster cluster-down cluster-status test test-unit test-integration \
        lint reference modules demo run crds image install-manifest chart deploy-local undeploy-local bench bench-scale bench-gang bench-placement bench-tas bench-soak bench-bigjob bench-storm bench-failover bench-apiserver-restart bench-dra bench-fractional bench-kopf-events bench-queue bench-queue-cluster bench-train bench-launch bench-train-gpu kind-e2e clean dashboards test-compat

help: ## Show this help
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  \033[1m%-18s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "Python >= 3.11 is required (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

install: $(VENV)/.installed ## Create .venv with the project and its test extra

bins: ## Build the control-plane binaries that are missing (Go module proxy -> ~/.cache)
	hack/build-bins.sh

cluster: install ## Start the local cluster (NODES=4 TOPOLOGY=dgx1-v100 REAL_NODES=2; KUEUE=1 adds Kueue); harmless if running
	@REAL_NODES=$(REAL_NODES) bash hack/node-deps.sh || echo "[cluster] going on; the real node will say what it lacks"
	@# Exit status 3: the control plane and the simulated nodes are up, the real node is not (said why).
	@# With the audit log, as the tests start it: make demo and make test share one cluster either way.
	$(PY) -m hack.cluster up --audit-log --nodes $(NODES) --topology $(TOPOLOGY) --real-nodes $(REAL_NODES) \
	  $(if $(IMAGES),--images $(IMAGES)) \
	  || { rc=$$?; [ $$rc -eq 3 ] && echo "[cluster] up without the real node (see above)"; [ $$rc -eq 3 ]; }

cluster-down: ## Stop the local cluster; leaves no process behind
	@if [ -x $(PY) ]; then $(PY) -m hack.cluster down; else python3 -m hack.cluster down; fi

cluster-status: install ## Show the local cluster's processes and memory
	$(PY) -m hack.cluster status

# The suite in two phases on one local cluster (tests/support/lanes.py): first what may run side by
# side, over TEST_WORKERS pytest-xdist workers (each lane of tests that share something on one
# worker), then the exclusive tests, alone. Both phases run even when the first fails.
TEST_WORKERS ?= 4
define pytest_phases
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25 -m "$(1)not exclusive"; \
	  first=$$?; \
	  $(PY) -m pytest -p no:xdist --durations=10 -m "$(1)exclusive"; second=$$?; \
	  [ $$first -eq 0 ] && [ $$second -eq 0 ]
endef

# Before the tests: refuse beside an operator that would also reconcile their jobs, check that
# pytest collects every test file, install Prometheus and build the control plane if missing.
test: install ## Run unit and integration tests (installs Prometheus, builds and starts the local cluster)
	$(PY) -m hack.stray_operators
	$(PY) -m hack.check_collected
	bash hack/test-deps.sh
	$(call pytest_phases,)

# The compatibility lane, not in CI's time: on the oldest supported minor (COMPAT_VERSION), the
# integration tests of everything whose API changed between the minors (docs/kubernetes-versions.md)
# and upstream's e2e suite, in the same two phases. The cluster restarts on that minor, and the
# next `make test` or `make demo` restarts it on the default one.
COMPAT_VERSION ?= 1.35
COMPAT_TESTS := $(addprefix tests/integration/,test_gang.py test_lifecycle.py test_dra.py \
  test_dra_binding.py test_gpu_quota.py test_fractional.py test_kueue.py test_agent_reports_actual_gpus.py \
  test_realnode.py test_training.py test_upstream_e2e.py test_workload_gang.py)
test-compat: export K8S_VERSION = $(COMPAT_VERSION)
test-compat: install ## On Kubernetes 1.35 (COMPAT_VERSION): the tests of what changed between minors, and upstream's e2e suite
	$(PY) -m hack.stray_operators
	bash hack/test-deps.sh
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=10 -m "not exclusive" $(COMPAT_TESTS); \
	  first=$$?; \
	  $(PY) -m pytest -p no:xdist --durations=10 -m "exclusive" $(COMPAT_TESTS); second=$$?; \
	  [ $$first -eq 0 ] && [ $$second -eq 0 ]

test-unit: install ## Run the unit tests only (no cluster)
	$(PY) -m pytest -m unit

test-integration: install ## Run the integration tests only (the same set-up as make test)
	$(PY) -m hack.stray_operators
	bash hack/test-deps.sh
	$(call pytest_phases,integration and )

lint: install ## ruff, mypy, the import-layer contracts, one GPU count, generated dashboards, docs/reference.md and the module map up to date
	$(VENV)/bin/ruff check operator tests bench hack dashboards docs
	$(VENV)/bin/ruff format --check operator tests bench hack dashboards docs
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -p no:randomly -p no:cacheprovider tests/unit/test_one_request_count.py
	$(PY) dashboards/generate.py --check
	$(PY) docs/generate_reference.py --check
	$(PY) docs/generate_watches.py --check
	$(PY) docs/generate_modules.py --check
	$(PY) -m hack.gen_install --check
	$(PY) -m hack.gen_chart --check

dashboards: install ## Regenerate the Grafana dashboard and Prometheus rules (dashboards/generate.py)
	$(PY) dashboards/generate.py

reference: install ## Regenerate docs/reference.md from keys.py and metrics.py, and docs/informers.md's table from the watched kinds
	$(PY) docs/generate_reference.py
	$(PY) docs/generate_watches.py

modules: install ## Regenerate the module map in docs/development.md from the modules' docstrings (docs/generate_modules.py)
	$(PY) docs/generate_modules.py

crds: cluster ## Install the MPIJob CRD into the cluster
	$(KUBECTL) apply --server-side -f crds/

image: install ## Build the operator image for the real nodes (Dockerfile's recipe, no Docker; cached by recipe)
	$(PY) -m hack.operator_image build

install-manifest: install ## Regenerate deploy/mpi-operator.yaml (the standalone overlay in one file)
	$(PY) -m hack.gen_install

chart: install ## Regenerate the Helm chart's templates and CRDs from the overlays (hack/gen_chart.py)
	$(PY) -m hack.gen_chart

# OVERLAY=standalone|monitoring|fractional-gpus|..., REPLICAS=n, UPSTREAM_NAMES=1 (Deployment
# mpi-operator/mpi-operator, as upstream's install names it).
deploy-local: cluster crds ## Install the operator in the local cluster from its image, on the real node
	$(PY) -m hack.incluster deploy --overlay $(or $(OVERLAY),standalone) \
	  $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(filter 1,$(UPSTREAM_NAMES)),--upstream-names)

undeploy-local: install ## Remove the in-cluster operator (CRDs, RBAC and MPIJobs stay)
	$(PY) -m hack.incluster undeploy

run: install ## Run the operator in the foreground against KUBECONFIG (default .cluster/kubeconfig)
	$(PY) -m mpijob run --no-leader-elect $(ARGS)

# The demo's real nodes hold only the images it runs; `make test` adds the others to running nodes.
demo: IMAGES ?= pause,openmpi,pytorch
demo: cluster crds ## Local cluster + operator (namespace demo, left running) + a sample MPIJob to Succeeded; IN_CLUSTER=1: the operator's image on the real node
	IN_CLUSTER=$(IN_CLUSTER) $(PY) -m hack.demo

bench: install ## Reconcile benchmark: 100 MPIJobs x 8 workers, ours vs upstream Go mpi-operator
	$(PY) -m bench.reconcile

bench-scale: install ## Scale run: 100 then 1,000 MPIJobs x 8 workers on 200 nodes, ours vs upstream (queue limit lifted)
	$(PY) -m bench.reconcile --scale

bench-gang: install ## Submission to all pods bound, 16 workers: Coscheduling vs our admission
	$(PY) -m bench.gang

bench-dra: install ## What the dra GPU binding adds: 100 topology jobs x 8 workers, annotations vs dra
	$(PY) -m bench.dra

bench-storm: install ## Kill storm: 24 SIGKILLs + an API-server restart while 56 topology jobs compete
	$(PY) -m bench.killstorm

bench-failover: install ## Two replicas through 20 leadership changes (freeze, kill, partition) during 60 topology jobs, own cluster with its audit log
	REAL_NODES=0 $(PY) -m bench.failover

bench-apiserver-restart: install ## The API server killed and restarted 20 s later, 3 times: a job created after it is back, seconds until its pods (median)
	REAL_NODES=0 $(PY) -m bench.failover --restarts 3

bench-soak: install ## 10,000 MPIJob lifecycles through one operator process, own cluster: RSS and metric series after 1,000 and 10,000 (within 10 %)
	REAL_NODES=0 $(PY) -m bench.soak

bench-bigjob: install ## One MPIJob of 8,192 GPUs (1,024 workers x 8) on 1,024 kwok nodes in a fabric, own cluster: apply to placed, bound, Running; ours vs upstream (median of 3)
	REAL_NODES=0 $(PY) -m bench.bigjob

bench-tas: install ## Topology-aware placement three ways, own cluster: ours vs kube-scheduler's (Workload API) vs Kueue TAS, figure of merit and time to bound (median of 3)
	REAL_NODES=0 $(PY) -m bench.native_tas

bench-placement: install ## Placement quality and latency benchmark (pure, no cluster)
	$(PY) -m bench.placement

bench-fractional: install ## Fractional-GPU admission latency per pod at 1,000 opted-in nodes (pure, no cluster)
	$(PY) -m bench.fractional

bench-kopf-events: install ## CPU per MPIJob event through Kopf's path, tuned and not, against the handler alone (pure, no cluster)
	$(PY) -m bench.kopf_events

bench-queue: install ## Admission passes over 10,000 waiting topology jobs on 1,000 nodes: pass time, /healthz, loop stall (pure, no cluster)
	$(PY) -m bench.admission_queue

bench-queue-cluster: install ## 10,000 waiting topology jobs on 1,000 kwok nodes, own cluster: an unrelated job's time to Created, pass p99, /healthz p99 (median of 3)
	REAL_NODES=0 $(PY) -m bench.admission_queue --cluster

bench-train: cluster crds ## img/s of examples/pytorch-cpu.yaml at 1, 2 and 4 workers on the real nodes (median of 3)
	$(PY) -m bench.train

bench-launch: cluster crds ## Launcher start to all ranks running, sshd vs the launch agent, 2 and 16 workers on the real nodes (median of 5)
	$(PY) -m bench.launch

bench-train-gpu: ## On a host with NVIDIA GPUs (no cluster): img/s over NCCL at 1, 2 and 4 ranks (median of 3)
	python3 bench/train_gpu.py

kind-e2e: install ## For users with Docker: the integration suite against a kind cluster
	hack/kind-e2e.sh

clean: cluster-down ## Stop the cluster and remove local state (keeps the binary cache)
	rm -rf .cluster .bench .pytest_cache .mypy_cache .ruff_cache

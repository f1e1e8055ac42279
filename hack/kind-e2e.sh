#!/usr/bin/env bash
# For users with Docker and kind: the same integration suite against a kind cluster.
# Our CI has no Docker engine and does not run this.
#
# The cluster gets what the local one has: the kwok controller with this project's Stages
# (hack/kwok/stages.yaml) and simulated GPU nodes, the PodGroup CRDs, and the operator's tests
# run it as a local process against the kind kubeconfig. kind's default scheduler has no
# Coscheduling plugin, so the Coscheduling tests need scheduler-plugins installed as the default
# scheduler first (https://scheduler-plugins.sigs.k8s.io); everything else runs as is.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: '$tool' is required" >&2; exit 1; }
done
source hack/versions.sh
NAME=${KIND_CLUSTER_NAME:-mpijob-e2e}
KUBECONFIG_E2E=${KUBECONFIG_E2E:-$PWD/.cluster/kind-kubeconfig}
mkdir -p "$(dirname "$KUBECONFIG_E2E")"

kind get clusters | grep -qx "$NAME" || kind create cluster --name "$NAME"
kind get kubeconfig --name "$NAME" > "$KUBECONFIG_E2E"
export KUBECONFIG=$KUBECONFIG_E2E

# kwok in the cluster, driven by our Stages instead of its defaults.
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/v$KWOK_VERSION/kwok.yaml"
kubectl apply -f hack/kwok/stages.yaml
# Simulated GPU nodes, exactly as the local cluster makes them.
.venv/bin/python -m hack.cluster node-manifests --nodes "${NODES:-4}" | kubectl apply -f -
# PodGroup APIs: scheduler-plugins' and Volcano's.
kubectl apply --server-side -f "https://raw.githubusercontent.com/kubernetes-sigs/scheduler-plugins/v$SCHED_PLUGINS_VERSION/manifests/coscheduling/crd.yaml"
kubectl apply --server-side -f "https://raw.githubusercontent.com/volcano-sh/volcano/v$VOLCANO_VERSION/config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml"
kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s

MPIJOB_TEST_KUBECONFIG=$KUBECONFIG_E2E .venv/bin/python -m pytest -m integration "$@"

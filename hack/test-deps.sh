#!/usr/bin/env bash
# What the integration tests need beyond the virtualenv, made present on a fresh machine:
# Prometheus (tests/integration/test_monitoring.py starts it on 127.0.0.1 itself), the local
# control plane's binaries, Kueue's (tests/integration/test_kueue.py runs it beside them) and
# Volcano's (the tests' cluster runs its scheduler, hack/volcano.py), upstream's e2e suite (tests/integration/test_upstream_e2e.py) and, unless REAL_NODES=0, the
# real node's packages and images.
# Usage: hack/test-deps.sh (run by `make test` and `make test-integration`).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[test-deps]\033[0m %s\n' "$*" >&2; }
die() { printf '[test-deps] error: %s\n' "$*" >&2; exit 1; }

if ! command -v prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    die "prometheus is not installed; tests/integration/test_monitoring.py needs it. Install it, then re-run:
  sudo apt-get update && sudo apt-get install -y --no-install-recommends prometheus
(or put any Prometheus binary on PATH as 'prometheus': the test starts its own, not the packaged service)"
  fi
  command -v apt-get >/dev/null 2>&1 \
    || die "prometheus is not installed and there is no apt-get: put a Prometheus binary on PATH as 'prometheus', then re-run."
  say "installing Prometheus (Debian's prometheus package, for tests/integration/test_monitoring.py)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v prometheus >/dev/null 2>&1 \
    || die "apt-get installed prometheus but 'prometheus' is not on PATH (expected /usr/bin/prometheus)."
fi

# Against a cluster of the user's (MPIJOB_TEST_KUBECONFIG) the local control plane is never started.
if [ -z "${MPIJOB_TEST_KUBECONFIG:-}" ]; then
  bash hack/node-deps.sh
  # The real nodes' images build beside the Go builds: they wait on Debian's archive as much as
  # on the CPU. (python3: hack/images.py needs the standard library only.)
  images=
  if [ "${REAL_NODES:-1}" != 0 ]; then
    python3 -m hack.images build &
    images=$!
  fi
  hack/build-bins.sh default kueue e2e volcano helm
  [ -z "$images" ] || wait "$images" || die "an image did not build (its [images] lines above say why)"
fi

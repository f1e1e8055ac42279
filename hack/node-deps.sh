#!/usr/bin/env bash
# The real node's Debian packages (hack/realnode.py): containerd, runc and the CNI plugins run it,
# mmdebstrap builds its images. Installed with apt-get when missing and run as root; otherwise
# the command to run is printed and the exit status is 1. Nothing with REAL_NODES=0.
# Run by `make cluster` (so `make demo` too) and hack/test-deps.sh (`make test`).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m[node-deps]\033[0m %s\n' "$*" >&2; }
die() { printf '[node-deps] error: %s\n' "$*" >&2; exit 1; }

[ "${REAL_NODES:-1}" = 0 ] && exit 0

real_node_pkgs() {
  local missing=() tool pkg
  for tool in containerd:containerd runc:runc mmdebstrap:mmdebstrap \
      /usr/lib/cni/bridge:containernetworking-plugins; do
    pkg=${tool#*:}; tool=${tool%%:*}
    if [[ "$tool" == /* ]]; then [ -x "$tool" ] || missing+=("$pkg")
    else command -v "$tool" >/dev/null 2>&1 || missing+=("$pkg"); fi
  done
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "the real node needs ${missing[*]}. Install them, then re-run:
  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}
(or run without the real node: REAL_NODES=0)"
  fi
  say "installing ${missing[*]} (Debian packages, for the real node)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

real_node_pkgs

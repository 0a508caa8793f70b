#!/usr/bin/env bash
# The first run from empty caches, side by side: `go run ./cmd/authz serve` to its first grant,
# and scripts/first-run/opa-floor (one Rego rule served with the same OPA) to its first grant.
# Each run gets an empty GOCACHE and GOMODCACHE of its own under /tmp (modules downloaded from
# GOPROXY, everything compiled), removed afterwards. Takes minutes; run it on a quiet machine:
#
#   bash scripts/first-run/run.sh [ROUNDS]
#
# Prints one line per run: seconds from `go run` to the first grant.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-1}

# first_grant NAME URL -- COMMAND...: runs COMMAND from empty caches and prints the seconds
# until POST URL with examples/grant.json answers "allow": true.
first_grant() {
  local name=$1 url=$2; shift 3
  local tmp; tmp=$(mktemp -d /tmp/first-run.XXXXXX)
  local start; start=$(date +%s.%N)
  GOCACHE=$tmp/cache GOMODCACHE=$tmp/mod GOFLAGS=-modcacherw setsid "$@" >"$tmp/log" 2>&1 &
  local pid=$!
  until curl -s --max-time 2 --json @examples/grant.json "$url" 2>/dev/null | tr -d ' \n' | grep -q '"allow":true'; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name: exited before its first grant:"; cat "$tmp/log"; exit 1; fi
    sleep 0.2
  done
  local end; end=$(date +%s.%N)
  kill -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
  printf '%-10s %6.1f s to the first grant from empty caches\n' "$name" "$(echo "$end - $start" | bc)"
}

for _ in $(seq "$rounds"); do
  first_grant authz http://127.0.0.1:18181/v1/authorize -- go run ./cmd/authz serve --addr 127.0.0.1:18181
  first_grant opa-floor http://127.0.0.1:18182/ -- go run ./scripts/first-run/opa-floor
done

#!/usr/bin/env bash
# Loopback load test of `authz serve` on its defaults (embedded policy, example driver as a real
# plugin process). Needs wrk (apt-get install -y wrk). Bounded: each level runs DURATION, the
# service is stopped at the end whatever happens.
#   scripts/load.sh [DURATION] [CONNECTIONS...]     e.g. scripts/load.sh 10s 1 8 32 64
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}; shift || true
levels=("$@"); [ ${#levels[@]} -gt 0 ] || levels=(1 8 32 64)
command -v wrk >/dev/null || { echo "load.sh: wrk is missing: apt-get install -y wrk" >&2; exit 1; }

work=$(mktemp -d)
go build -o "$work/authz" ./cmd/authz
# A free loopback port, chosen by the service itself (--addr 127.0.0.1:0): the address it logs is
# the one it listens on, so the load can never hit another server that happens to hold a port.
"$work/authz" serve --addr 127.0.0.1:0 --log-level info --log-json 2>"$work/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
addr=
for _ in $(seq 100); do
  addr=$(sed -n 's/.*"@message":"listening".*"addr":"\([^"]*\)".*/\1/p' "$work/serve.log" | head -1)
  [ -n "$addr" ] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
[ -n "$addr" ] || { cat "$work/serve.log"; echo "load.sh: the service did not start" >&2; exit 1; }
for _ in $(seq 100); do
  curl -fs "http://$addr/health/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "http://$addr/health/ready" >/dev/null || { cat "$work/serve.log"; echo "load.sh: service not ready" >&2; exit 1; }
# Identity check: the server on $addr is the one this script started (its plugin's parent is
# $pid) and runs the policy this checkout embeds.
want_rev=$("$work/authz" version | awk '$1 == "policy" {print $2}')
got_rev=$(curl -fs "http://$addr/health/ready" | sed -n 's/.*"revision":"\([^"]*\)".*/\1/p')
plugin_pid=$(curl -fs "http://$addr/v1/plugins" | grep -o '"pid":[0-9]*' | head -1 | cut -d: -f2)
parent=$(awk '{print $4}' "/proc/$plugin_pid/stat" 2>/dev/null || echo "?")
if [ "$got_rev" != "$want_rev" ] || [ "$parent" != "$pid" ]; then
  echo "load.sh: http://$addr is not the service this script started (revision $got_rev, want $want_rev; plugin parent $parent, want $pid)" >&2
  exit 1
fi
grant=$(curl -fs -H 'Content-Type: application/json' --data-binary @examples/grant.json "http://$addr/v1/authorize")
grep -q '"allow":true' <<<"$grant" || { echo "load.sh: examples/grant.json is not granted: $grant" >&2; exit 1; }
echo "service pid $pid on http://$addr, policy $got_rev"

for req in grant deny; do
  cat > "$work/$req.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("examples/$req.json"); wrk.body = f:read("*a"); f:close()
LUA
done
rss() { awk '/VmRSS/ {print $2/1024 " MiB"}' "/proc/$1/status" 2>/dev/null || echo "?"; }
echo "service pid $pid RSS $(rss $pid) at start; plugin pid $plugin_pid RSS $(rss "$plugin_pid")"
printf '%-6s %-5s %10s %10s %10s %10s\n' request conns req/s p50 p90 p99
for req in grant deny; do
  for c in "${levels[@]}"; do
    t=$(( c < 2 ? 1 : 2 ))
    out=$(wrk -t"$t" -c"$c" -d"$duration" --latency -s "$work/$req.lua" "http://$addr/v1/authorize")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p() { awk -v q="$1" '$1 == q {print $2}' <<<"$out"; }
    errs=$(grep -E 'Non-2xx|Socket errors' <<<"$out" || true)
    printf '%-6s %-5s %10s %10s %10s %10s %s\n' "$req" "$c" "$rps" "$(p 50%)" "$(p 90%)" "$(p 99%)" "$errs"
  done
done
echo "service RSS $(rss $pid) after the load; plugin RSS $(rss "$plugin_pid")"

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
addr=127.0.0.1:18181
go build -o "$work/authz" ./cmd/authz
"$work/authz" serve --addr "$addr" --log-level warn 2>"$work/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -fs "http://$addr/health/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "http://$addr/health/ready" >/dev/null || { cat "$work/serve.log"; echo "service not ready" >&2; exit 1; }

for req in grant deny; do
  cat > "$work/$req.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("examples/$req.json"); wrk.body = f:read("*a"); f:close()
LUA
done
rss() { awk '/VmRSS/ {print $2/1024 " MiB"}' "/proc/$1/status" 2>/dev/null || echo "?"; }
plugin_pid=$(curl -fs "http://$addr/v1/plugins" | grep -o '"pid":[0-9]*' | head -1 | cut -d: -f2)
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

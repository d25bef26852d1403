#!/usr/bin/env bash
# The seed design's hot path, measured: its Redis Lua deduction script
# (infra/bench/seckill_deduct.lua, copied from shared/seeds/flash-sale-system-design.md §4:
# SISMEMBER, GET, DECR, SADD) under redis-benchmark, on Debian's redis-server on a free
# loopback port. One client connection, EVALSHA, a fixed number of requests; the
# "pipelined" line lets the client send 16 at a time, as the best case for Redis.
#
# Prints (one per line, ops/s as redis-benchmark reports them):
#   redis_lua_ops_per_sec=<n>                       stock left: the full deduction
#   redis_lua_sold_out_ops_per_sec=<n>              stock 0: the seed's sold-out answer
#   redis_lua_sold_out_pipelined_ops_per_sec=<n>    the same, -P 16
#
# Needs the apt packages redis-server and redis-tools. REQUESTS (default 200000) sets
# the requests per run. Starts nothing it does not stop: the server is killed by its
# pid on exit, whatever happens.
set -euo pipefail

REQUESTS="${REQUESTS:-200000}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRIPT="$HERE/seckill_deduct.lua"

for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "redis_seed.sh: $tool is missing (apt-get install redis-server redis-tools)" >&2; exit 2; }
done

# A port the kernel just handed out, so parallel runs and other services don't collide.
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
WORKDIR="$(mktemp -d)"
redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no \
  --dir "$WORKDIR" --logfile "$WORKDIR/redis.log" --daemonize no &
SERVER_PID=$!
stop_server() {
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORKDIR"
}
trap stop_server EXIT

cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }
for _ in $(seq 1 100); do
  [ "$(cli ping 2>/dev/null || true)" = PONG ] && break
  sleep 0.1
done
[ "$(cli ping)" = PONG ] || { echo "redis_seed.sh: redis-server did not start" >&2; exit 1; }

SHA="$(cli script load "$(cat "$SCRIPT")")"
STOCK=seckill:stock:bench
USERS=seckill:users:bench

# ops/s of EVALSHA over one connection; extra arguments go to redis-benchmark.
evalsha_rps() {
  # __rand_int__ (with -r) gives each request a random user id, as a surge of buyers.
  timeout 300 redis-benchmark -h 127.0.0.1 -p "$PORT" -c 1 -n "$REQUESTS" -r 100000000 --csv "$@" \
    EVALSHA "$SHA" 2 "$STOCK" "$USERS" "user:__rand_int__" |
    awk -F'"' 'NR == 2 { printf "%d\n", $4 }'
}

# Enough stock that every request deducts (or finds a repeat buyer), never sells out.
cli set "$STOCK" "$((REQUESTS * 10))" >/dev/null
cli del "$USERS" >/dev/null
[ "$(cli evalsha "$SHA" 2 "$STOCK" "$USERS" probe)" = 1 ] || { echo "redis_seed.sh: the script did not deduct" >&2; exit 1; }
echo "redis_lua_ops_per_sec=$(evalsha_rps)"

cli set "$STOCK" 0 >/dev/null
[ "$(cli evalsha "$SHA" 2 "$STOCK" "$USERS" late-buyer)" = 0 ] || { echo "redis_seed.sh: the script did not answer sold out" >&2; exit 1; }
echo "redis_lua_sold_out_ops_per_sec=$(evalsha_rps)"
echo "redis_lua_sold_out_pipelined_ops_per_sec=$(evalsha_rps -P 16)"

#!/usr/bin/env bash
# perf.sh: one run of outboxd's drain and keep-up (bench/load) and, with
# -river, of the same work by River (bench/river), printed as one markdown
# table (metric, figure, command) under a line naming the machine: the
# table docs/performance.md shows.
#
#   bench/load/perf.sh                              # 100,000 events; keep-up for 60s
#   bench/load/perf.sh -events 2000 -duration 5s    # a smoke run
#   bench/load/perf.sh -river                       # River's figures too
#
# It builds outboxd (the repository root), load (this folder) and, with
# -river, riverbench (bench/river). It needs Go, psql and a PostgreSQL
# server it may create databases on (-database-url, else DATABASE_URL,
# else the local server). Every figure moves with other load on the
# machine: run it on an otherwise idle one.
set -euo pipefail
args="$*"
events=100000 duration=60s river=""
db=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
while [ $# -gt 0 ]; do
	case $1 in
	-events) events=$2; shift 2 ;;
	-duration) duration=$2; shift 2 ;;
	-database-url) db=$2; shift 2 ;;
	-river) river=1; shift ;;
	*) echo "usage: $0 [-events N] [-duration D] [-database-url URL] [-river]" >&2; exit 2 ;;
	esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$root" && go build -o "$bin/outboxd" .)
(cd "$here" && go build -o "$bin/load" .)

# measure NAME COMMAND...: runs COMMAND, keeping its output as $bin/NAME.out.
measure() { local name=$1; shift; echo "perf.sh: ${*#"$bin/"}" >&2; "$@" >"$bin/$name.out"; }
# field NAME REGEX: REGEX's first group (sed -E) in NAME's output.
field() { sed -nE "s|.*$2.*|\1|p" "$bin/$1.out" | head -n 1; }
# ms DURATION: a Go duration (850µs, 12.3ms, 1.2s) in milliseconds.
ms() { awk -v d="$1" 'BEGIN { u = d; sub(/^[0-9.]+/, "", u)
	f = u == "s" ? 1000 : u == "ms" ? 1 : u == "ns" ? 1e-6 : 0.001; printf "%.1f ms", (d + 0) * f }'; }
row() { printf '| %s | %s | `%s` |\n' "$1" "$2" "$3"; }
# latencies NAME: the p50, p99 and max of NAME's latency line.
latencies() {
	local p50 p99 max
	read -r p50 p99 max < <(sed -nE 's/.*latency p50 (\S+) p95 \S+ p99 (\S+) max (\S+).*/\1 \2 \3/p' "$bin/$1.out" | head -n 1)
	echo "$(ms "$p50") / $(ms "$p99") / $(ms "$max")"
}

drain="load -outboxd outboxd -mode drain -events $events"
keepup="load -outboxd outboxd -mode keepup -duration $duration"
measure drain "$bin/load" -outboxd "$bin/outboxd" -database-url "$db" -mode drain -events "$events"
measure keepup "$bin/load" -outboxd "$bin/outboxd" -database-url "$db" -mode keepup -duration "$duration"
if [ -n "$river" ]; then
	(cd "$root/bench/river" && go build -o "$bin/riverbench" .)
	river_url=$(echo "$db" | sed -E 's#^([a-z]+://[^/]*)/[^?]*#\1/perf_river#')
	# fresh [create]: drops River's database, and creates it again.
	fresh() {
		PGOPTIONS=--client-min-messages=warning psql -q "$db" -c 'DROP DATABASE IF EXISTS perf_river WITH (FORCE)'
		[ "${1:-}" != create ] || psql -q "$db" -c 'CREATE DATABASE perf_river'
	}
	river_drain="riverbench load -mode drain -events $events -workers 1000"
	river_keepup="riverbench load -mode keepup -duration $duration -workers 1000"
	fresh create && measure river-drain "$bin/riverbench" load -database-url "$river_url" -mode drain -events "$events" -workers 1000
	fresh create && measure river-keepup "$bin/riverbench" load -database-url "$river_url" -mode keepup -duration "$duration" -workers 1000
	fresh
fi

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
echo "Machine: $(nproc) CPUs ($cpu), $mem of memory; PostgreSQL $(psql "$db" -Atc 'SHOW server_version'); $("$bin/outboxd" version)"
echo "Command: bench/load/perf.sh $args (load and outboxd built by it from the same checkout)"
echo
echo "| metric | figure | command |"
echo "|---|---|---|"
row "drain: events recorded with outboxd stopped, then delivered from its start (events/s)" "$(field drain 'delivered in \S+: ([0-9]+) events/s')" "$drain"
row "drain: CPU time per event, outboxd and its PostgreSQL backends" "$(field drain 'CPU time: .*: ([0-9.]+) ms per event') ms" "$drain"
row "drain: outboxd peak RSS" "$(field drain 'peak RSS ([0-9.]+ MiB)')" "$drain"
row "keep-up: committed by 16 producers, one event a transaction (events/s)" "$(field keepup 'committed ([0-9]+) events/s')" "$keepup"
row "keep-up: delivered during the run (events/s)" "$(field keepup 'delivered ([0-9]+) events/s')" "$keepup"
row "keep-up: commit to first 2xx, p50 / p99 / max" "$(latencies keepup)" "$keepup"
row "keep-up: CPU time per event, outboxd and its PostgreSQL backends" "$(field keepup 'CPU time: .*: ([0-9.]+) ms per event') ms" "$keepup"
row "keep-up: outboxd peak RSS" "$(field keepup 'peak RSS ([0-9.]+ MiB)')" "$keepup"
if [ -n "$river" ]; then
	row "River drain: webhook jobs inserted, then delivered (events/s)" "$(field river-drain 'delivered in \S+: ([0-9]+) events/s')" "$river_drain"
	row "River drain: peak RSS" "$(field river-drain 'peak RSS ([0-9.]+ MiB)')" "$river_drain"
	row "River keep-up: committed by 16 producers, one job a transaction (events/s)" "$(field river-keepup 'committed ([0-9]+) events/s')" "$river_keepup"
	row "River keep-up: delivered during the run (events/s)" "$(field river-keepup 'delivered ([0-9]+) events/s')" "$river_keepup"
	row "River keep-up: commit to first 2xx, p50 / p99 / max" "$(latencies river-keepup)" "$river_keepup"
fi

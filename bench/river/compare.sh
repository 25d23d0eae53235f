#!/usr/bin/env bash
# Builds outboxd (from the repository root), bench/load (the load
# generator that drives it) and riverbench (this module), then runs
# `riverbench compare`: outboxd and River through the same work,
# alternating, each run on a fresh database, and prints a markdown table of
# medians and ratios. Every argument goes to riverbench compare; -h lists
# them (-runs, -events, -database-url, -works, ...).
#
#   bench/river/compare.sh                        # 3 runs at the default sizes
#   bench/river/compare.sh -runs 1 -events 20000 -duration 10s
#
# BENCH_LOCK=/path/to/file makes each single run hold flock(2) on that file,
# so that other load on a shared machine waits for it (and it for them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

(cd "$root" && go build -o "$bin/outboxd" .)
(cd "$root/bench/load" && go build -o "$bin/load" .)
(cd "$here" && go build -o "$bin/riverbench" .)
"$bin/riverbench" compare -outboxd "$bin/outboxd" -load "$bin/load" "$@"

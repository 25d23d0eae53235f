#!/usr/bin/env bash
# What a held snapshot costs the queue: the most common incident of a
# queue in PostgreSQL. Someone's long transaction (a forgotten psql
# session, an analytics query) holds the xmin horizon; vacuum can then
# remove no row version that died after it began, and every claim wades
# through them. Each system, outboxd and River, on a fresh database, runs
# keep-up at a fixed rate (-held-rate, 1,000 events/s by default, over 16
# producers) for -held-run (6m), while a REPEATABLE READ transaction in
# that run's database takes its snapshot at -held-from (40s after the run
# starts) and sits idle in it until -held-until (280s). Every 15 s
# (-held-sample) the run's log gets the queue tables' dead row versions and
# the backlog; the table shows the rate committed, delivered/committed,
# commit->first 2xx p50, p95, p99 and max, and the dead row versions at the
# end of the hold (bench/river/README.md, the held row).
#
#   bench/held-snapshot.sh -runs 1                                   # a 4-minute hold, about 15 minutes in all
#   bench/held-snapshot.sh -runs 1 -held-run 26m -held-until 1240s   # a 20-minute hold
#   bench/held-snapshot.sh -runs 1 -held-run 90s -held-from 15s -held-until 60s   # a quick check
#
# It builds the binaries and runs bench/river/compare.sh -works held; every
# argument goes on to riverbench compare (-database-url, -log-dir, -h, ...).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/river/compare.sh" -works held "$@"

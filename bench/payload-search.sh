#!/usr/bin/env bash
# What the search by payload costs and buys (docs/performance.md, search by
# payload), on a PostgreSQL server reached by DATABASE_URL (a superuser:
# it creates and drops two databases of its own, payload_bench_a and _b).
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/payload-search.sh
#
# 1. A producer's cost of the index: pgbench records one event a
#    transaction through outbox.record, 8 clients for 10 s, into a
#    fresh database with outboxd's schema without events_by_payload (a)
#    and one with it (b), alternating, five times; it prints each run's
#    transactions a second and the median ratio b/a.
# 2. What it buys: 1,000,000 events of 50,000 customers, then the first
#    page of the stream (GET /api/events' query, 51 rows) searched for one
#    customer (about 20 events), timed by EXPLAIN ANALYZE, with the index
#    and without it.
set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL to a superuser connection}"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

db_url() { # the URL of database $1 on DATABASE_URL's server
  python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$DATABASE_URL" "$1"
}
fresh() { # database $1 with outboxd's schema, without the payload index
  psql -qX "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1"
  psql -qX -v ON_ERROR_STOP=1 "$(db_url "$1")" -f "$root/schema.sql" >/dev/null
  psql -qX "$(db_url "$1")" -c "DROP INDEX outbox.events_by_payload"
}

cat >"$work/record.sql" <<'EOF'
\set n random(1, 1000000000)
\set c random(1, 50000)
SELECT outbox.record('order.paid', :n::text, jsonb_build_object('id', :n, 'status', 'paid', 'amount_cents', :n % 100000, 'currency', 'EUR', 'customer', jsonb_build_object('id', :c, 'email', 'customer' || :c || '@example.com', 'country', 'DE'), 'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (:n % 97), 'qty', 1 + :n % 3), jsonb_build_object('sku', 'SKU-' || (:n % 89), 'qty', 1))));
EOF

echo "## A producer's cost: transactions a second, without the index (a) and with it (b)"
ratios=()
for run in 1 2 3 4 5; do
  # Both start empty each run: a table that grew in an earlier run would
  # slow its side for reasons of its own.
  fresh payload_bench_a
  fresh payload_bench_b
  psql -qX "$(db_url payload_bench_b)" -c "CREATE INDEX events_by_payload ON outbox.events USING gin (payload jsonb_path_ops)"
  for side in a b; do
    # Without waiting for the WAL flush at commit: the CPU a transaction
    # costs, not the disk's latency, bounds what 8 clients commit.
    tps=$(PGOPTIONS='-c synchronous_commit=off' pgbench -n -c 8 -j 2 -T 10 -f "$work/record.sql" "$(db_url payload_bench_$side)" 2>/dev/null |
      awk '/^tps/ {print $3}')
    echo "run $run $side: $tps"
    eval "tps_$side=$tps"
  done
  ratios+=("$(python3 -c "print(f'{$tps_b / $tps_a:.3f}')")")
done
echo "ratio b/a per run: ${ratios[*]}; median $(printf '%s\n' "${ratios[@]}" | sort -n | sed -n 3p)"

echo
echo "## The first page of a search for one customer among 1,000,000 events"
fresh payload_bench_a
psql -qX "$(db_url payload_bench_a)" <<'EOF'
INSERT INTO outbox.events (topic, subject, payload, fanned_out_at)
SELECT 'order.paid', i::text,
       jsonb_build_object('id', i, 'status', 'paid', 'amount_cents', i % 100000, 'currency', 'EUR',
                          'customer', jsonb_build_object('id', i % 50000, 'email', 'customer' || i % 50000 || '@example.com', 'country', 'DE'),
                          'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || i % 97, 'qty', 1 + i % 3))),
       now()
FROM generate_series(1, 1000000) AS i;
VACUUM ANALYZE outbox.events;
EOF
search() {
  psql -qXAt "$(db_url payload_bench_a)" -c "EXPLAIN (ANALYZE, TIMING OFF)
SELECT id FROM outbox.events
WHERE payload @> '{\"customer\": {\"id\": 12345}}'
ORDER BY id DESC LIMIT 51" | grep -E 'Execution Time|Index|Seq Scan' | sed 's/^/  /'
}
echo "without the index:"; search; search
psql -qX "$(db_url payload_bench_a)" -c "CREATE INDEX events_by_payload ON outbox.events USING gin (payload jsonb_path_ops)" \
  -c "ANALYZE outbox.events"
echo "with it:"; search; search
psql -qXAt "$(db_url payload_bench_a)" -c "SELECT 'index size: ' || pg_size_pretty(pg_relation_size('outbox.events_by_payload')) || ', table: ' || pg_size_pretty(pg_relation_size('outbox.events'))"

psql -qX "$DATABASE_URL" -c "DROP DATABASE payload_bench_a" -c "DROP DATABASE payload_bench_b"

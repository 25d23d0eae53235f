-- 008_0.8.0.sql: from release 0.7.0 to 0.8.0.
--
-- Gone: what 0.7.0 kept for 0.6.0's replicas while they rolled, its pass
-- that claimed for its own workers (fan_out_claiming) and the functions
-- 0.6.0's fan-out called. No replica of 0.6.0 runs beside this release:
-- a roll goes one release at a time (docs/upgrades.md). Every statement
-- can run again over a database that has what it made.

DROP FUNCTION IF EXISTS outbox.fan_out_claiming(integer, jsonb, integer, double precision, text, integer, bigint, bigint[], integer, text[]);
DROP FUNCTION IF EXISTS outbox.born_running(bigint[], bigint[]);
DROP FUNCTION IF EXISTS outbox.lock_born_lanes(bigint[], integer);
DROP FUNCTION IF EXISTS outbox.has_due_live_jobs(bigint);
DROP FUNCTION IF EXISTS outbox.takes_deliveries_running(outbox.endpoints);

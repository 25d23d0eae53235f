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

-- Per-endpoint retries, timeout and headers (endpointrequest.go): NULL
-- settings and no headers keep every endpoint as it was.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS max_attempts integer,
  ADD COLUMN IF NOT EXISTS retry_window_seconds integer,
  ADD COLUMN IF NOT EXISTS timeout_seconds integer,
  ADD COLUMN IF NOT EXISTS headers jsonb NOT NULL DEFAULT '{}',
  ADD COLUMN IF NOT EXISTS secret_headers bytea;
ALTER TABLE outbox.endpoints
  DROP CONSTRAINT IF EXISTS endpoints_max_attempts_range,
  DROP CONSTRAINT IF EXISTS endpoints_retry_window_range,
  DROP CONSTRAINT IF EXISTS endpoints_timeout_range,
  DROP CONSTRAINT IF EXISTS endpoints_headers_object,
  DROP CONSTRAINT IF EXISTS endpoints_secret_headers_length;
ALTER TABLE outbox.endpoints
  ADD CONSTRAINT endpoints_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 18),
  ADD CONSTRAINT endpoints_retry_window_range CHECK (retry_window_seconds BETWEEN 1 AND 327369),
  ADD CONSTRAINT endpoints_timeout_range CHECK (timeout_seconds BETWEEN 1 AND 60),
  ADD CONSTRAINT endpoints_headers_object CHECK (jsonb_typeof(headers) = 'object' AND length(headers::text) <= 16384),
  ADD CONSTRAINT endpoints_secret_headers_length CHECK (length(secret_headers) <= 16384 + 33);

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

-- Asymmetric signatures (v1a): an endpoint's secret may be the seed of an
-- ed25519 private key, which public_key then marks and verifies; the
-- claim hands both public keys to the workers at the end of claimed_job,
-- where 0.7.0's claim, reading its columns by name, does not see them.
-- Both attributes are added in the transaction that makes as_claimed_job
-- fill them.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS public_key bytea,
  ADD COLUMN IF NOT EXISTS previous_public_key bytea;

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_public_key_length CHECK (length(public_key) = 32),
    ADD CONSTRAINT endpoints_previous_public_key_length CHECK (length(previous_public_key) = 32);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute
                 WHERE attrelid = 'outbox.claimed_job'::regclass AND attname = 'public_key' AND NOT attisdropped) THEN
    ALTER TYPE outbox.claimed_job
      ADD ATTRIBUTE public_key bytea,
      ADD ATTRIBUTE previous_public_key bytea;
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.as_claimed_job(id bigint, kind text, attempt integer, max_attempts integer,
                                                 endpoint_id bigint, replay_id bigint, attempted_at timestamptz,
                                                 e outbox.events, ep outbox.endpoints, start_in_ms integer,
                                                 wake_on_outcome boolean, replay_yields boolean)
RETURNS outbox.claimed_job
LANGUAGE sql STABLE
AS $$
  SELECT ROW(id, kind, attempt, max_attempts, endpoint_id,
         e.id, e.topic, e.subject, e.payload, e.created_at,
         e.traceparent, e.tracestate,
         ep.url, ep.secret,
         CASE WHEN ep.previous_secret_expires_at > now() THEN ep.previous_secret END,
         ep.disabled_reason, start_in_ms, wake_on_outcome, replay_yields,
         -- A first attempt of a live delivery cannot be a duplicate: no
         -- earlier request of it exists. A replay's may resend what an
         -- earlier job delivered.
         CASE WHEN attempt > 1 OR replay_id IS NOT NULL THEN ep.dedup_window_seconds END,
         attempted_at,
         coalesce(e.committed_at, e.created_at),
         ep.public_key,
         CASE WHEN ep.previous_secret_expires_at > now() THEN ep.previous_public_key END)::outbox.claimed_job
$$;

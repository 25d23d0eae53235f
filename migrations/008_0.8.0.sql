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

-- The relay's scan bound: its claim looks for events from an id below
-- which none can wait, and moves it only when a snapshot proves nothing
-- below can still commit (schema.sql, advance_relay_scan). The claim, the
-- relay's pass and its list of rows take the bound as a last argument
-- with a default of 0, so 0.7.0's calls, which pass none, scan from the
-- start as they did. outbox.record takes its xid before it draws an id,
-- and a requeue counts in outbox.events_requeued, whichever release or
-- statement makes it (a trigger).
DROP FUNCTION IF EXISTS outbox.claim_unfanned(integer);
DROP FUNCTION IF EXISTS outbox.claim_to_fan_out(integer, bigint);
DROP FUNCTION IF EXISTS outbox.fan_out(integer, bigint, jsonb, integer, double precision, text);
CREATE SEQUENCE IF NOT EXISTS outbox.events_requeued;
CREATE OR REPLACE FUNCTION outbox.count_requeue() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('outbox.events_requeued');
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS events_count_requeues ON outbox.events;
CREATE TRIGGER events_count_requeues
  AFTER UPDATE OF poisoned_at ON outbox.events
  FOR EACH ROW
  WHEN (OLD.poisoned_at IS NOT NULL AND NEW.poisoned_at IS NULL AND NEW.fanned_out_at IS NULL)
  EXECUTE FUNCTION outbox.count_requeue();

CREATE OR REPLACE FUNCTION outbox.claim_unfanned(batch integer, scan_from bigint DEFAULT 0)
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
AS $$
BEGIN
  RETURN QUERY
  SELECT e.id
  FROM outbox.events AS e
  WHERE e.fanned_out_at IS NULL
    AND e.poisoned_at IS NULL
    AND e.id >= scan_from
  ORDER BY e.id
  LIMIT batch
  FOR UPDATE OF e SKIP LOCKED;
END
$$;

CREATE OR REPLACE FUNCTION outbox.advance_relay_scan(in_from bigint, in_candidate bigint, in_candidate_xmax xid8,
                                          in_requeued bigint)
RETURNS TABLE (scan_from bigint, candidate bigint, candidate_xmax xid8, requeued bigint)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END INTO requeued FROM outbox.events_requeued AS s;
  scan_from := in_from;
  IF requeued IS DISTINCT FROM in_requeued THEN
    scan_from := 0;
  ELSIF in_candidate IS NOT NULL AND pg_snapshot_xmin(pg_current_snapshot()) >= in_candidate_xmax THEN
    scan_from := coalesce((SELECT min(e.id) FROM outbox.events AS e
                           WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL
                             AND e.id >= in_from AND e.id < in_candidate),
                          in_candidate);
  END IF;
  SELECT coalesce((SELECT min(e.id) FROM outbox.events AS e
                   WHERE e.fanned_out_at IS NULL AND e.poisoned_at IS NULL AND e.id >= scan_from),
                  (SELECT max(e.id) + 1 FROM outbox.events AS e),
                  scan_from),
         pg_snapshot_xmax(pg_current_snapshot())
  INTO candidate, candidate_xmax;
  RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION outbox.claim_to_fan_out(in_batch integer, in_event_id bigint, in_scan_from bigint DEFAULT 0)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF in_event_id IS NULL THEN
    RETURN ARRAY(SELECT outbox.claim_unfanned(in_batch, in_scan_from));
  END IF;
  RETURN ARRAY(
    SELECT e.id
    FROM outbox.events AS e
    WHERE e.id = in_event_id
      AND e.fanned_out_at IS NULL
      AND e.poisoned_at IS NULL
    FOR UPDATE OF e SKIP LOCKED);
END
$$;

CREATE OR REPLACE FUNCTION outbox.fan_out(in_batch integer, in_event_id bigint, in_subscribers jsonb,
                               in_max_attempts integer, in_breaker_delay double precision, in_origin text,
                               in_scan_from bigint DEFAULT 0)
RETURNS TABLE (out_fanned bigint, out_jobs bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  claimed bigint[];
  marked outbox.events[];
  deliveries record;
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  IF in_origin <> '' THEN
    PERFORM set_config('outbox.relay_origin', in_origin, true);
  END IF;
  claimed := outbox.claim_to_fan_out(in_batch, in_event_id, in_scan_from);
  marked := ARRAY(SELECT m FROM outbox.mark_claimed_fanned_out(claimed) AS m);
  out_fanned := cardinality(marked);
  out_jobs := outbox.enqueue_for_subscribers(marked, in_subscribers, in_max_attempts);
  SELECT * INTO deliveries FROM outbox.enqueue_deliveries(marked, in_max_attempts, in_breaker_delay) AS d;
  out_jobs := out_jobs + deliveries.out_jobs;
  PERFORM outbox.index_subjects(marked);
  IF cardinality(deliveries.out_lane_endpoints) > 0 THEN
    PERFORM outbox.advance_lanes(deliveries.out_lane_endpoints, deliveries.out_lane_keys, true);
  END IF;
  RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION outbox.record(topic text, subject text, payload jsonb, owner text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  recorded_id bigint;
  tp          text := nullif(current_setting('outbox.traceparent', true), '');
  ts          text := nullif(current_setting('outbox.tracestate', true), '');
  tc          record;
BEGIN
  -- The transaction takes its xid before the insert draws the event's id:
  -- the relay's scan bound counts on it (advance_relay_scan).
  PERFORM pg_current_xact_id();
  IF tp IS NOT NULL OR ts IS NOT NULL THEN
    -- An assignment, not a SELECT INTO: PL/pgSQL evaluates it as an
    -- expression, without running a query.
    tc := outbox.trace_context(tp, ts);
    tp := tc.traceparent;
    ts := tc.tracestate;
    IF cardinality(tc.repairs) > 0 THEN
      PERFORM nextval(('outbox.trace_repairs_' || r)::regclass) FROM unnest(tc.repairs) AS r;
    END IF;
  END IF;
  INSERT INTO outbox.events (topic, subject, payload, traceparent, tracestate, owner)
  VALUES (record.topic, coalesce(record.subject, ''), coalesce(record.payload, '{}'), tp, ts,
          nullif(record.owner, ''))
  RETURNING events.id INTO recorded_id;
  RETURN recorded_id;
END
$$;

-- The event catalog and test sends (topics.go, docs/catalog.md).
--
-- outbox.topics: the topics the admin registered, each with a
-- description and an example payload. A test send records an event
-- marked events.test, already fanned out, and one job for its endpoint
-- marked jobs.test: it is delivered like any other, its attempts kept in
-- the history, but record_outcomes leaves them out of the statistics and
-- replays pass its event by. Both columns are NULL for what the
-- application records and the fan-out inserts: adding them rewrites no
-- row, and the release before, which names its columns, never sees them.
-- finish_jobs returns the job's mark, for record_outcomes: a changed
-- result, so it is dropped and made again; the release before calls
-- record_outcomes alone, whose signature stays.
CREATE TABLE IF NOT EXISTS outbox.topics (
  name        text        PRIMARY KEY,
  description text        NOT NULL DEFAULT '',
  example     jsonb       NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  updated_at  timestamptz NOT NULL DEFAULT now(),

  -- The events' own rule (events_topic_format): a topic registered is
  -- one an event can have.
  CONSTRAINT topics_name_format CHECK (name ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}$'),
  CONSTRAINT topics_description_length CHECK (length(description) <= 2000),
  CONSTRAINT topics_example_size CHECK (pg_column_size(example) <= 65536)
);

ALTER TABLE outbox.events ADD COLUMN IF NOT EXISTS test boolean;
ALTER TABLE outbox.jobs ADD COLUMN IF NOT EXISTS test boolean;

DROP FUNCTION IF EXISTS outbox.finish_jobs(json, json);
CREATE FUNCTION outbox.finish_jobs(in_outcomes json, in_attempts json)
RETURNS TABLE (id bigint, attempt integer, endpoint_id bigint, lane_key text, state outbox.job_state, test boolean)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH outcome AS (
    SELECT o.* FROM json_to_recordset(in_outcomes) AS o(id bigint, attempt integer, state text, delay_ms bigint, error text)
  ),
  delivered AS (
    DELETE FROM outbox.jobs AS j
    USING outcome AS o
    WHERE j.id = o.id AND j.attempt = o.attempt AND j.state = 'running' AND o.state = 'completed'
    RETURNING j.id, j.attempt, j.event_id, j.kind, j.endpoint_id, j.replay_id, j.lane_key, j.attempted_at,
              'completed'::outbox.job_state AS state, o.error, false AS released, j.test
  ),
  failed AS (
    UPDATE outbox.jobs AS j
    SET state = CASE WHEN o.state <> 'released' THEN o.state WHEN j.attempt > 1 THEN 'retryable'
                     ELSE 'available' END::outbox.job_state,
        attempt = CASE WHEN o.state = 'released' THEN j.attempt - 1 ELSE j.attempt END,
        scheduled_at = CASE WHEN o.state = 'retryable' THEN now() + o.delay_ms * interval '1 millisecond'
                            ELSE j.scheduled_at END,
        finalized_at = CASE WHEN o.state = 'discarded' THEN now() END,
        errors = CASE WHEN o.error = '' THEN j.errors
                      ELSE j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', o.error))
                 END
    FROM outcome AS o
    WHERE j.id = o.id AND j.attempt = o.attempt AND j.state = 'running' AND o.state <> 'completed'
    RETURNING j.id, o.attempt, j.event_id, j.kind, j.endpoint_id, j.replay_id, j.lane_key, j.attempted_at,
              j.state, o.error, o.state = 'released', j.test
  ),
  finished AS (
    SELECT * FROM delivered UNION ALL SELECT * FROM failed
  ),
  made AS (
    SELECT a.* FROM json_to_recordset(in_attempts)
      AS a(job_id bigint, attempt integer, duration_ms integer, status_code integer, error text, excerpt text)
  ),
  history AS (
    INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, replay_id, outcome, attempted_at,
                                   duration_ms, status_code, error, response_excerpt)
    SELECT f.id, f.attempt, f.event_id, f.kind, f.endpoint_id, f.replay_id, f.state, f.attempted_at,
           coalesce(a.duration_ms, 0), nullif(a.status_code, 0), coalesce(nullif(a.error, ''), f.error, ''),
           coalesce(a.excerpt, '')
    FROM finished AS f
    LEFT JOIN made AS a ON a.job_id = f.id AND a.attempt = f.attempt
    WHERE NOT f.released
    ORDER BY 1, 2
    ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
  )
  SELECT f.id, f.attempt, f.endpoint_id, f.lane_key, f.state, f.test FROM finished AS f;
END
$$;

CREATE OR REPLACE FUNCTION outbox.record_outcomes(in_outcomes json, in_attempts json, in_health json, in_gone bigint[],
                                       in_windows json, in_breaker_threshold integer, in_buckets integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
AS $$
DECLARE
  written_ids bigint[];
  written_attempts integer[];
  counted_ids bigint[];
  counted_attempts integer[];
  lane_endpoints bigint[];
  lane_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  -- outbox.events first, in the order a migration locks the tables
  -- (migrate.go, schemaTablesQuery): a completion in an ordered lane reads
  -- events after it updates jobs (advance_lanes).
  LOCK TABLE outbox.events IN ACCESS SHARE MODE;
  SELECT array_agg(f.id), array_agg(f.attempt),
         array_agg(f.id) FILTER (WHERE f.test IS NOT TRUE), array_agg(f.attempt) FILTER (WHERE f.test IS NOT TRUE),
         array_agg(f.endpoint_id ORDER BY f.endpoint_id, f.lane_key) FILTER (WHERE f.lane_done),
         array_agg(f.lane_key ORDER BY f.endpoint_id, f.lane_key) FILTER (WHERE f.lane_done)
  INTO written_ids, written_attempts, counted_ids, counted_attempts, lane_endpoints, lane_keys
  FROM (SELECT f.*, f.lane_key IS NOT NULL AND f.state IN ('completed', 'discarded') AS lane_done
        FROM outbox.finish_jobs(in_outcomes, in_attempts) AS f) AS f;
  IF lane_endpoints IS NOT NULL THEN
    PERFORM outbox.advance_lanes(lane_endpoints, lane_keys, false);
  END IF;
  written_ids := coalesce(written_ids, '{}');
  written_attempts := coalesce(written_attempts, '{}');
  PERFORM outbox.record_fenced_attempts(in_attempts, written_ids, written_attempts);
  -- A test send's attempts (jobs.test) are history, not statistics.
  PERFORM outbox.count_attempts(in_attempts, coalesce(counted_ids, '{}'), coalesce(counted_attempts, '{}'), in_buckets);
  PERFORM outbox.record_endpoint_health(in_health, in_gone, in_windows, in_breaker_threshold);
END
$$;

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

-- A job's event and endpoint are held by declared foreign keys again,
-- where triggers held them a statement at a time: since a delivered job
-- leaves the queue by a delete, which no key checks, the keys cost a
-- user-facing figure less than the 10% that would keep the triggers
-- (docs/performance.md). The history still goes with its event by a
-- trigger, events_delete_history. The triggers held the rows as the keys
-- do, so the keys validate over the jobs there are.
DROP TRIGGER IF EXISTS jobs_references ON outbox.jobs;
DROP TRIGGER IF EXISTS jobs_changed_references ON outbox.jobs;
DROP TRIGGER IF EXISTS endpoints_release_jobs ON outbox.endpoints;
DROP TRIGGER IF EXISTS events_refuse_truncate ON outbox.events;
DROP TRIGGER IF EXISTS events_delete_jobs ON outbox.events;
DROP FUNCTION IF EXISTS outbox.jobs_check_references();
DROP FUNCTION IF EXISTS outbox.jobs_check_changed_references();
DROP FUNCTION IF EXISTS outbox.lock_job_references(bigint[], bigint[]);
DROP FUNCTION IF EXISTS outbox.endpoints_release_jobs();
DROP FUNCTION IF EXISTS outbox.events_refuse_truncate();
DROP FUNCTION IF EXISTS outbox.events_delete_jobs();
CREATE OR REPLACE FUNCTION outbox.events_delete_history() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  DELETE FROM outbox.deliveries AS d WHERE d.event_id = ANY (ARRAY(SELECT g.id FROM gone_events AS g));
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS events_delete_history ON outbox.events;
CREATE TRIGGER events_delete_history
  AFTER DELETE ON outbox.events
  REFERENCING OLD TABLE AS gone_events
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.events_delete_history();
ALTER TABLE outbox.jobs DROP CONSTRAINT IF EXISTS jobs_event_id_fkey;
ALTER TABLE outbox.jobs ADD CONSTRAINT jobs_event_id_fkey
  FOREIGN KEY (event_id) REFERENCES outbox.events (id) ON DELETE CASCADE NOT VALID;
ALTER TABLE outbox.jobs VALIDATE CONSTRAINT jobs_event_id_fkey;
ALTER TABLE outbox.jobs DROP CONSTRAINT IF EXISTS jobs_endpoint_id_fkey;
ALTER TABLE outbox.jobs ADD CONSTRAINT jobs_endpoint_id_fkey
  FOREIGN KEY (endpoint_id) REFERENCES outbox.endpoints (id) ON DELETE SET NULL NOT VALID;
ALTER TABLE outbox.jobs VALIDATE CONSTRAINT jobs_endpoint_id_fkey;

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

-- The jobs 0.6.0 completed stayed in the queue, their attempt's answer on
-- the job, until the job cleaner deleted them a day later. None is left
-- to wait for it: each goes to the history as the attempt that completed
-- it (unless the history has that attempt already), with the note of a
-- job completed without its effect (its last error, of its last attempt)
-- as the attempt's error, as this release's completer writes it, and
-- leaves the queue,
-- with the two columns only those jobs used. No release that runs beside
-- this one writes a completed job.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute
             WHERE attrelid = 'outbox.jobs'::regclass AND attname = 'status_code' AND NOT attisdropped) THEN
    EXECUTE $move$
      INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, replay_id, outcome, attempted_at,
                                     finished_at, duration_ms, status_code, error)
      SELECT j.id, j.attempt, j.event_id, j.kind, j.endpoint_id, j.replay_id, 'completed', j.attempted_at,
             coalesce(j.finalized_at, now()), greatest(coalesce(j.duration_ms, 0), 0), j.status_code,
             CASE WHEN (j.errors -> -1 ->> 'attempt')::integer = j.attempt
                  THEN left(j.errors -> -1 ->> 'error', 2000) ELSE '' END
      FROM outbox.jobs AS j
      WHERE j.state = 'completed' AND j.attempt > 0
      ORDER BY j.id
      ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING$move$;
  END IF;
END
$$;
DELETE FROM outbox.jobs WHERE state = 'completed';
ALTER TABLE outbox.jobs DROP COLUMN IF EXISTS status_code, DROP COLUMN IF EXISTS duration_ms;

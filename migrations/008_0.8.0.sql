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

-- 004_0.4.0.sql: from release 0.3.0 to 0.4.0.
--
-- migrate.go applies it in one transaction, except its CONCURRENTLY
-- index statements and constraint validations, which run after that
-- transaction, one at a time. Written before releases recorded their
-- migrations by number: every statement can run again over a database
-- that has part of it, as a build between two releases left it.

-- record_outcomes is the completer's transaction (completer.go): a batch
-- of outcomes with everything they record, in one call. It takes rows, as
-- JSON arrays of objects:
--
--   in_outcomes  one per job: {id, attempt, state, delay_ms, error,
--                status_code, duration_ms}; status_code and duration_ms
--                are the attempt's, kept on a job that completes (null for
--                an attempt kept in deliveries instead);
--   in_attempts  one per attempt made: {job_id, attempt, endpoint_id,
--                duration_ms, status_code, error, excerpt, kept, class,
--                minute, bucket}; kept says a success its job keeps,
--                minute is Unix seconds, bucket the 0-based latency bucket
--                of in_buckets;
--   in_health    one per endpoint whose health an attempt moved, in id
--                order: {id, succeeded, failures, hold_ms}: whether an
--                attempt succeeded, how many failed after the last success
--                (or at all, without one), the longest hold asked for;
--   in_gone      the endpoints whose receiver answered 410 Gone, in id
--                order;
--   in_windows   the dedup windows receivers advertised, in id order:
--                {id, seconds}.
--
-- It runs, in this order (every completer locks rows in it, so two of them
-- wait rather than deadlock):
--
--  1. the jobs' outcomes, each fenced on (id, attempt, running): an
--     outcome of an attempt that is no longer its job's current one
--     changes nothing. State 'released' is a job claimed ahead that never
--     sent its request (claim.go, endpointGates): it goes back to the
--     queue as it was before the claim, its attempt not counted, due
--     where it was;
--  2. advance_lanes for the ordered lanes whose delivery finished, in the
--     same transaction: never a moment with a lane held and nothing
--     running;
--  3. the attempts: a row of deliveries, unless a success whose outcome
--     its job took (kept, and written now or by this batch's earlier
--     write); and the statistics, which count
--     each attempt whose outcome its job took, in a row of delivery_stats
--     per endpoint and minute. An attempt the fence refused (a worker that
--     lost its job to the rescuer, or this batch written again after its
--     commit's answer was lost) counts nothing, and one that made no
--     request (class 'none') neither;
--  4. the endpoints: their health (a success restarts the count of
--     consecutive failures; the count reaching in_breaker_threshold opens
--     the breaker, and a success closes it; failing_since is set by the
--     first failure after a success and cleared by a success; a hold only
--     ever extends held_until), the ones whose receiver answered 410 Gone
--     (disabled, with failing_since, in one change: one "disabled"
--     notification, not a "failing" one first), and the dedup window each
--     receiver advertised (an unchanged one written at most hourly). A
--     healthy endpoint's row is not rewritten on every delivery.
--
-- Writing a batch again is safe: outcomes are fenced on the attempt,
-- attempts inserted ON CONFLICT DO NOTHING, and endpoint states set, not
-- toggled. Rows go in (endpoint, minute) or id order, so two completers
-- lock them in one order. The commit does not wait for the WAL to reach
-- the disk (database.go, beginPipelineTx, says why that loses nothing).
--
-- enable_bitmapscan = off, for the reason claim_lane_jobs gives: the
-- outcomes' jobs are found through jobs_running_by_attempted_at (the
-- generic plan expects few running jobs and hashes them all), and a bitmap
-- scan of it visits every entry, dead ones included, without ever marking
-- them dead: 1,685 entries read for a batch of 32 outcomes a few seconds
-- into a drain (auto_explain). A plain index scan marks the entries of
-- rows dead to every snapshot, and the next batch skips them. Measured
-- alternately against the bitmap scan (docs/performance.md, the
-- completer's plan): an outcome batch of the keep-up run 8.8 ms for 36
-- jobs against 16.6 ms for 55.
DROP FUNCTION IF EXISTS outbox.record_outcomes(bigint[], integer[], text[], bigint[], text[], integer[], integer[],
  bigint[], integer[], bigint[], integer[], integer[], text[], text[], boolean[], text[], bigint[], integer[], integer,
  bigint[], boolean[], integer[], bigint[], integer, bigint[], bigint[], bigint[]);

DROP FUNCTION IF EXISTS outbox.record_outcomes(json, json, json, bigint[], json, integer, integer);

CREATE FUNCTION outbox.record_outcomes(in_outcomes json, in_attempts json, in_health json, in_gone bigint[],
                                       in_windows json, in_breaker_threshold integer, in_buckets integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_bitmapscan = off
AS $$
DECLARE
  written_ids bigint[];
  written_attempts integer[];
  lane_endpoints bigint[];
  lane_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);

  WITH recorded AS (
    UPDATE outbox.jobs AS j
    SET state = CASE WHEN o.state <> 'released' THEN o.state
                     WHEN j.attempt > 1 THEN 'retryable'
                     ELSE 'available' END::outbox.job_state,
        attempt = CASE WHEN o.state = 'released' THEN j.attempt - 1 ELSE j.attempt END,
        scheduled_at = CASE WHEN o.state = 'retryable'
                            THEN now() + o.delay_ms * interval '1 millisecond'
                            ELSE j.scheduled_at END,
        finalized_at = CASE WHEN o.state IN ('completed', 'discarded') THEN now() END,
        errors = CASE WHEN o.error = '' THEN j.errors
                      ELSE j.errors || jsonb_build_array(jsonb_build_object(
                             'attempt', j.attempt, 'at', now(), 'error', o.error))
                 END,
        status_code = CASE WHEN o.state = 'completed' THEN o.status_code ELSE j.status_code END,
        duration_ms = CASE WHEN o.state = 'completed' THEN o.duration_ms ELSE j.duration_ms END
    FROM json_to_recordset(in_outcomes)
         AS o(id bigint, attempt integer, state text, delay_ms bigint, error text, status_code integer, duration_ms integer)
    WHERE j.id = o.id
      AND j.attempt = o.attempt
      AND j.state = 'running'
    RETURNING j.id, j.attempt, j.endpoint_id, j.lane_key, j.state
  ),
  finished AS (
    SELECT DISTINCT r.endpoint_id, r.lane_key
    FROM recorded AS r
    WHERE r.lane_key IS NOT NULL
      AND r.state IN ('completed', 'discarded')
  )
  SELECT (SELECT array_agg(r.id) FROM recorded AS r),
         (SELECT array_agg(r.attempt) FROM recorded AS r),
         (SELECT array_agg(f.endpoint_id ORDER BY f.endpoint_id, f.lane_key) FROM finished AS f),
         (SELECT array_agg(f.lane_key ORDER BY f.endpoint_id, f.lane_key) FROM finished AS f)
  INTO written_ids, written_attempts, lane_endpoints, lane_keys;

  IF lane_endpoints IS NOT NULL THEN
    PERFORM outbox.advance_lanes(lane_endpoints, lane_keys, false);
  END IF;

  WITH attempt AS (
    SELECT a.*, w.id IS NOT NULL AS written
    FROM json_to_recordset(in_attempts)
         AS a(job_id bigint, attempt integer, endpoint_id bigint, duration_ms integer, status_code integer,
              error text, excerpt text, kept boolean, class text, minute bigint, bucket integer)
    LEFT JOIN unnest(written_ids, written_attempts) AS w(id, attempt)
      ON w.id = a.job_id AND w.attempt = a.attempt
  ),
  kept AS (
    INSERT INTO outbox.deliveries (job_id, attempt, endpoint_id, duration_ms, status_code, error, response_excerpt)
    SELECT a.job_id, a.attempt, nullif(a.endpoint_id, 0), a.duration_ms, nullif(a.status_code, 0), a.error, a.excerpt
    FROM attempt AS a
    WHERE NOT (a.kept AND a.written)
      -- A success the fence refused because it completed its job already
      -- (this batch written again after its commit's answer was lost) is
      -- on the job: not kept a second time.
      AND NOT (a.kept AND EXISTS (SELECT 1 FROM outbox.jobs AS j
                                  WHERE j.id = a.job_id AND j.state = 'completed' AND j.attempt = a.attempt))
    ON CONFLICT (job_id, attempt) DO NOTHING
  ),
  counted AS (
    SELECT a.endpoint_id, a.minute,
           count(*) AS attempts,
           count(*) FILTER (WHERE a.class = 'success') AS successes,
           count(*) FILTER (WHERE a.class = 'timeout') AS failed_timeout,
           count(*) FILTER (WHERE a.class = '4xx') AS failed_4xx,
           count(*) FILTER (WHERE a.class = '5xx') AS failed_5xx,
           count(*) FILTER (WHERE a.class = 'connection') AS failed_connection,
           count(*) FILTER (WHERE a.class = 'other') AS failed_other,
           array_agg(a.bucket) FILTER (WHERE a.class = 'success') AS buckets
    FROM attempt AS a
    WHERE a.written
      AND a.endpoint_id <> 0
      AND a.class <> 'none'
    GROUP BY a.endpoint_id, a.minute
  )
  INSERT INTO outbox.delivery_stats AS s (endpoint_id, minute, attempts, successes, failed_timeout,
                                          failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
  SELECT c.endpoint_id, to_timestamp(c.minute), c.attempts, c.successes, c.failed_timeout,
         c.failed_4xx, c.failed_5xx, c.failed_connection, c.failed_other,
         ARRAY(
           SELECT count(b.bucket)
           FROM generate_series(0, in_buckets - 1) AS g(bucket)
           LEFT JOIN unnest(c.buckets) AS b(bucket) ON b.bucket = g.bucket
           GROUP BY g.bucket
           ORDER BY g.bucket
         )
  FROM counted AS c
  ORDER BY c.endpoint_id, c.minute
  ON CONFLICT (endpoint_id, minute) DO UPDATE
  SET attempts = s.attempts + EXCLUDED.attempts,
      successes = s.successes + EXCLUDED.successes,
      failed_timeout = s.failed_timeout + EXCLUDED.failed_timeout,
      failed_4xx = s.failed_4xx + EXCLUDED.failed_4xx,
      failed_5xx = s.failed_5xx + EXCLUDED.failed_5xx,
      failed_connection = s.failed_connection + EXCLUDED.failed_connection,
      failed_other = s.failed_other + EXCLUDED.failed_other,
      latency_buckets = ARRAY(
        SELECT a + b
        FROM unnest(s.latency_buckets, EXCLUDED.latency_buckets) WITH ORDINALITY AS t(a, b, i)
        ORDER BY i
      );

  IF json_array_length(in_health) > 0 THEN
    UPDATE outbox.endpoints AS ep
    SET consecutive_failures = h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END,
        breaker_opened_at = CASE
          WHEN h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END >= in_breaker_threshold
          THEN coalesce(ep.breaker_opened_at, now())
        END,
        failing_since = CASE
          WHEN h.failures = 0 THEN NULL
          WHEN h.succeeded THEN now()
          ELSE coalesce(ep.failing_since, now())
        END,
        held_until = CASE
          WHEN h.hold_ms > 0 THEN greatest(ep.held_until, now() + h.hold_ms * interval '1 millisecond')
          ELSE ep.held_until
        END
    FROM json_to_recordset(in_health) AS h(id bigint, succeeded boolean, failures integer, hold_ms bigint)
    WHERE ep.id = h.id
      AND (h.failures > 0 OR h.hold_ms > 0
           OR ep.consecutive_failures > 0 OR ep.failing_since IS NOT NULL OR ep.breaker_opened_at IS NOT NULL);
  END IF;

  IF cardinality(in_gone) > 0 THEN
    UPDATE outbox.endpoints AS ep
    SET disabled_at = now(),
        disabled_reason = 'the receiver answered 410 Gone',
        disabled_cause = 'gone',
        failing_since = coalesce(ep.failing_since, now())
    WHERE ep.id = ANY (in_gone)
      AND ep.disabled_at IS NULL;
  END IF;

  -- A window row's seconds is NULL for a 2xx that advertised none: the
  -- receiver no longer promises one, and its stored window goes. None
  -- stored and none advertised writes nothing.
  IF json_array_length(in_windows) > 0 THEN
    UPDATE outbox.endpoints AS ep
    SET dedup_window_seconds = w.seconds,
        dedup_window_seen_at = CASE WHEN w.seconds IS NOT NULL THEN now() END
    FROM json_to_recordset(in_windows) AS w(id bigint, seconds bigint)
    WHERE ep.id = w.id
      AND (ep.dedup_window_seconds IS DISTINCT FROM w.seconds
           OR ep.dedup_window_seen_at < now() - interval '1 hour');
  END IF;
END
$$;

-- 003_0.3.0.sql: from release 0.2.0 to 0.3.0.
--
-- migrate.go applies it in one transaction, except its CONCURRENTLY
-- index statements and constraint validations, which run after that
-- transaction, one at a time. Written before releases recorded their
-- migrations by number: every statement can run again over a database
-- that has part of it, as a build between two releases left it.

-- Every event row is updated once (fanned_out_at) and deleted once
-- (retention): a high-churn table. Vacuum it after 2% of its rows are dead
-- instead of PostgreSQL's default 20%, so the claim index stays small, and
-- after 2% of them were inserted (a bulk write, a backlog), so that the
-- first claims after it do not walk the visibility of every page. Its
-- vacuum is not throttled (cost delay 0): the relay's claims walk the dead
-- entries at the front of events_unfanned_by_id until a vacuum removes
-- them, and a throttled vacuum of a large backlog reaches them late, at
-- PostgreSQL's default pace for any table. fillfactor
-- 90 leaves a page room for the fanned-out version of its rows (the
-- update cannot be HOT: fanned_out_at is in the claim index's predicate),
-- so the relay's update dirties the page it read, not one more.
-- TestQueueTablesVacuumAggressively pins these numbers.
ALTER TABLE outbox.events SET (
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0,
  fillfactor = 90
);

-- claim_to_fan_out is the relay's claim (fan_out): it locks up to
-- in_batch events with claim_unfanned, or with in_event_id that one event
-- if it is still waiting, for the caller's transaction, and returns their
-- ids. fan_out calls it in a statement of its own, before the statement
-- that reads the endpoints: each statement of a PL/pgSQL function sees the
-- rows committed when it began, so the endpoints are read as they were
-- after the claim, and every endpoint committed before an event it claimed
-- gets the event. (Claimed from inside the statement that reads the
-- endpoints, an event committed after that statement began could be
-- claimed while an endpoint committed before the event was not seen: the
-- event was marked fanned out with no delivery to it.)
CREATE OR REPLACE FUNCTION outbox.claim_to_fan_out(in_batch integer, in_event_id bigint)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF in_event_id IS NULL THEN
    RETURN ARRAY(SELECT outbox.claim_unfanned(in_batch));
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

-- mark_claimed_fanned_out marks the events in_claimed (claim_to_fan_out)
-- fanned out and returns what the fan-out reads of them, in the caller's
-- transaction. Marking them, it keeps each one's commit time
-- (commit_time): the UPDATE's expressions read the row as it was, its
-- xmin still the recording transaction's. enable_seqscan = off has the
-- UPDATE fetch the claimed rows by key, where a planner that thinks index
-- reads expensive (a high random_page_cost) would scan the whole backlog
-- for 200 rows.
--
-- The claim comes first, in a statement before this one: each statement
-- of a PL/pgSQL function sees the rows committed when it began, so the
-- UPDATE sees every row the claim locked. (The other way round, a claim
-- made by a function called from the UPDATE runs later than the UPDATE's
-- snapshot and can lock a row that the UPDATE does not see.)
CREATE OR REPLACE FUNCTION outbox.mark_claimed_fanned_out(in_claimed bigint[])
RETURNS TABLE (id bigint, topic text, subject text, payload jsonb)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
BEGIN
  RETURN QUERY
  UPDATE outbox.events AS e
  SET fanned_out_at = now(),
      committed_at = outbox.commit_time(e, e.xmin)
  WHERE e.id = ANY (in_claimed)
  RETURNING e.id, e.topic, e.subject, e.payload;
END
$$;

-- mark_fanned_out claims (claim_to_fan_out) and marks
-- (mark_claimed_fanned_out) in one call. This release's fan_out no longer
-- calls it; the previous release's did, and a relay pass of a replica of it
-- under way while a migration replaces fan_out still may, so it stays until
-- the release after this one. Replaced, not dropped and made again: a pass
-- of that release that planned its call before a migration and runs it
-- after finds the function it planned.
DROP FUNCTION IF EXISTS outbox.mark_fanned_out(integer);

CREATE OR REPLACE FUNCTION outbox.mark_fanned_out(in_batch integer, in_event_id bigint)
RETURNS TABLE (id bigint, topic text, subject text, payload jsonb)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  claimed bigint[];
BEGIN
  claimed := outbox.claim_to_fan_out(in_batch, in_event_id);
  RETURN QUERY SELECT m.id, m.topic, m.subject, m.payload FROM outbox.mark_claimed_fanned_out(claimed) AS m;
END
$$;

-- filter narrows what an endpoint receives beyond its topics: a SQL/JSON
-- path predicate over the event's payload, in jsonb_path_match's syntax
-- ('$.status == "paid" && $.amount_cents > 1000'), kept as it was written
-- for the API to echo; NULL: every event of its topics (docs/filters.md).
-- filter_path is it parsed, once, when it is written: the fan-out tests it
-- against every event its topics pass, and a text would be parsed again
-- for each. A filter that does not parse fails the write here; the Go side
-- says why before it comes to that (filters.go, checkFilter).
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS filter text,
  ADD COLUMN IF NOT EXISTS filter_path jsonpath GENERATED ALWAYS AS (filter::jsonpath) STORED;

-- filter_problem says why a parsed filter may not be stored, or NULL when
-- it may. jsonb_path_match with silent => true turns what a payload can
-- cause (a missing member, a wrong type, a division by zero) into
-- unknown, which the fan-out counts as no match; what remains are errors
-- of the filter itself, which would fail every fan-out of its topics and
-- poison the events, so they are refused here:
--   - a variable ($name): the fan-out passes none, and a missing one
--     raises;
--   - .datetime(): comparing a time with a zone to one without raises
--     unless a time zone is given (jsonb_path_match_tz, which depends on
--     the session's TimeZone); ISO 8601 strings compare in order as
--     strings;
--   - not a predicate ('$.a'): evaluated on an empty object, a predicate
--     answers exactly one true, false or unknown (null), whatever the
--     payload; a path answers its items ('$.a' none, '$' the object).
-- Variables and methods are found in the normalised text PostgreSQL
-- prints for the path, with its string literals (member names among
-- them) emptied first: a variable prints as $"name", a member as ."name".
-- PL/pgSQL, so that the probe runs only after the variable check passed:
-- a SQL function's CASE could be folded with its constant arguments, the
-- probe first.
CREATE OR REPLACE FUNCTION outbox.filter_problem(f jsonpath)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  bare text := regexp_replace(f::text, '"(\\.|[^"\\])*"', '""', 'g');
  probe jsonb;
BEGIN
  IF f IS NULL THEN
    RETURN NULL;
  END IF;
  IF bare ~ '\$""' THEN
    RETURN 'a filter may not use variables ($name): none are passed to it';
  END IF;
  IF bare ~ '\.datetime\(' THEN
    RETURN '.datetime() is not supported (comparing times with and without a time zone raises an error); compare ISO 8601 strings instead, e.g. $.at >= "2026-01-01"';
  END IF;
  probe := jsonb_path_query_array('{}'::jsonb, f, '{}'::jsonb, true);
  IF jsonb_array_length(probe) <> 1 OR jsonb_typeof(probe -> 0) NOT IN ('boolean', 'null') THEN
    RETURN 'not a predicate: it selects values rather than answering true or false (write a comparison, e.g. $.paid == true rather than $.paid)';
  END IF;
  RETURN NULL;
END
$$;

-- At most 4,096 bytes (filters.go, maxFilterLen): a filter is a
-- predicate, not a program.
DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_filter_length CHECK (length(filter) <= 4096),
    ADD CONSTRAINT endpoints_filter_allowed CHECK (outbox.filter_problem(filter_path) IS NULL);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- The job table churns as the events table does, twice over: every row
-- is updated when claimed and when finished, neither update HOT (state is
-- in the claim indexes' predicates), and deleted by the job cleaner. The
-- same vacuum settings as outbox.events, for the same reasons, and
-- fillfactor 80: room on a page for both new versions of its rows.
ALTER TABLE outbox.jobs SET (
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0,
  fillfactor = 80
);

-- claimed_lane_job is a job claim_lane_jobs claimed, with lane_limit: the
-- most requests the claiming replica may have in flight to the job's
-- endpoint, as a claim with ahead counts it (NULL from any other claim).
-- A type of its own, not an attribute added to claimed_job: a previous
-- release's sessions keep plans of fan_out_claiming, whose result holds
-- claimed_job, and a changed row type fails them ("function return row
-- and query-specified return row do not match") until they end.
DO $$
BEGIN
  IF to_regtype('outbox.claimed_lane_job') IS NULL THEN
    CREATE TYPE outbox.claimed_lane_job AS (job outbox.claimed_job, lane_limit integer);
  END IF;
END
$$;

DROP FUNCTION IF EXISTS outbox.claim_lane_jobs(integer, bigint, bigint[], boolean);

DROP FUNCTION IF EXISTS outbox.claim_lane_jobs(integer, bigint, bigint[], boolean, bigint[]);

CREATE FUNCTION outbox.claim_lane_jobs(batch integer, replica bigint, answered bigint[], ahead boolean,
                                       cooling bigint[])
RETURNS SETOF outbox.claimed_lane_job
LANGUAGE plpgsql VOLATILE
ROWS 100
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  -- The endpoints this claim serves, locked: those with live work
  -- first, oldest due live job first; then those with replayed work
  -- alone, oldest first.
  lanes bigint[];
BEGIN
  -- The claim is the pipeline's bookkeeping: lost in a crash, its jobs
  -- are claimed again. Its commit need not wait for the disk, like the
  -- other pipeline transactions (database.go, beginPipelineTx). Set for
  -- the caller's transaction, not for this call: a SET clause of the
  -- function would be undone before the commit.
  PERFORM set_config('synchronous_commit', 'off', true);
  -- NULL would leave every running job uncounted: no cap at all.
  answered := coalesce(answered, '{}');
  ahead := coalesce(ahead, false);
  cooling := coalesce(cooling, '{}');
  IF replica IS NOT NULL THEN
    PERFORM 1 FROM outbox.replicas AS r WHERE r.id = replica FOR KEY SHARE;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'replica % is not registered: it was declared dead', replica
        USING ERRCODE = 'OXR01';
    END IF;
  END IF;
  lanes := ARRAY(
    WITH RECURSIVE live AS (
      (SELECT w.endpoint_id, w.scheduled_at
       FROM outbox.jobs AS w
       WHERE w.state IN ('available', 'retryable') AND w.endpoint_id IS NOT NULL AND w.replay_id IS NULL
       ORDER BY w.endpoint_id, w.scheduled_at, w.id
       LIMIT 1)
      UNION ALL
      SELECT n.endpoint_id, n.scheduled_at
      FROM live AS prev
      CROSS JOIN LATERAL (
        SELECT w.endpoint_id, w.scheduled_at
        FROM outbox.jobs AS w
        WHERE w.state IN ('available', 'retryable') AND w.endpoint_id IS NOT NULL AND w.replay_id IS NULL
          AND w.endpoint_id > prev.endpoint_id
        ORDER BY w.endpoint_id, w.scheduled_at, w.id
        LIMIT 1
      ) AS n
    ),
    replayed AS (
      (SELECT w.endpoint_id, w.scheduled_at
       FROM outbox.jobs AS w
       WHERE w.state IN ('available', 'retryable') AND w.endpoint_id IS NOT NULL AND w.replay_id IS NOT NULL
       ORDER BY w.endpoint_id, w.scheduled_at, w.id
       LIMIT 1)
      UNION ALL
      SELECT n.endpoint_id, n.scheduled_at
      FROM replayed AS prev
      CROSS JOIN LATERAL (
        SELECT w.endpoint_id, w.scheduled_at
        FROM outbox.jobs AS w
        WHERE w.state IN ('available', 'retryable') AND w.endpoint_id IS NOT NULL AND w.replay_id IS NOT NULL
          AND w.endpoint_id > prev.endpoint_id
        ORDER BY w.endpoint_id, w.scheduled_at, w.id
        LIMIT 1
      ) AS n
    ),
    -- Each endpoint with due work: its oldest due live job and its
    -- oldest due replayed one (NULL: none).
    due AS (
      SELECT d.endpoint_id,
             min(d.scheduled_at) FILTER (WHERE d.live) AS live_at,
             min(d.scheduled_at) FILTER (WHERE NOT d.live) AS replay_at
      FROM (SELECT l.endpoint_id, l.scheduled_at, true AS live FROM live AS l WHERE l.scheduled_at <= now()
            UNION ALL
            SELECT r.endpoint_id, r.scheduled_at, false FROM replayed AS r WHERE r.scheduled_at <= now()) AS d
      GROUP BY d.endpoint_id
    )
    SELECT open.id
    FROM (
    SELECT ep.id, w.live_at, w.replay_at
    FROM due AS w
    JOIN outbox.endpoints AS ep ON ep.id = w.endpoint_id
    WHERE ep.disabled_at IS NOT NULL OR (
            ep.paused_at IS NULL
        AND (ep.held_until IS NULL OR ep.held_until <= now())
        AND (ep.rate_limit_per_second IS NULL OR ep.rate_next_at IS NULL
             OR ep.rate_next_at <= now() + interval '1 second')
        AND (SELECT CASE WHEN ahead AND replica IS NOT NULL AND ep.breaker_opened_at IS NULL
                              AND ep.rate_limit_per_second IS NULL AND ep.consecutive_failures = 0
                              AND ep.id <> ALL (cooling)
                              AND count(*) FILTER (WHERE r.held_by = replica AND r.id <> ALL (answered)
                                                     AND r.attempted_at < now() - interval '250 milliseconds') = 0
                         THEN 2 * (ep.max_in_flight - count(*) FILTER (WHERE r.held_by IS DISTINCT FROM replica))
                              - count(*) FILTER (WHERE r.held_by = replica AND r.id <> ALL (answered))
                         ELSE CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END
                              - count(*) FILTER (WHERE r.id <> ALL (answered))
                    END
             FROM outbox.jobs AS r
             WHERE r.endpoint_id = ep.id AND r.state = 'running') > 0
        AND (w.live_at IS NOT NULL
             OR (SELECT count(*) FROM outbox.jobs AS r
                 WHERE r.endpoint_id = ep.id AND r.state = 'running' AND r.replay_id IS NOT NULL
                   AND r.id <> ALL (answered))
                < outbox.replay_width(ep.id, ep.max_in_flight)))
    ORDER BY w.live_at NULLS LAST, w.replay_at, ep.id
    LIMIT batch
    ) AS open
    -- After the LIMIT, so that only the lanes served are locked.
    WHERE pg_try_advisory_xact_lock(hashtext('outbox.claim_jobs'), (open.id % 2147483647)::integer)
    ORDER BY open.live_at NULLS LAST, open.replay_at, open.id
  );

  RETURN QUERY
  WITH lane AS (
    SELECT ep.id, l.lane_order, ep.rate_limit_per_second AS rate,
           greatest(now(), ep.rate_next_at) AS rate_base,
           -- What the lane may lock: its room, and no more than twice
           -- its fair share of the batch: enough for lanes with more work
           -- to take what lanes with less leave, without locking a batch
           -- per lane.
           greatest(least(
             CASE WHEN ep.disabled_at IS NOT NULL THEN batch
                  ELSE least(
                    rc.room,
                    CASE WHEN ep.rate_limit_per_second IS NULL THEN batch
                         ELSE 1 + floor(ep.rate_limit_per_second * extract(epoch FROM
                                now() + interval '1 second' - greatest(now(), ep.rate_next_at)))::integer
                    END)
             END,
             batch, 2 * batch / (cardinality(lanes) + 1) + 1), 0) AS room,
           CASE WHEN ep.disabled_at IS NOT NULL THEN batch
                ELSE outbox.replay_width(lf.live, ep.max_in_flight)
                       - (SELECT count(*) FROM outbox.jobs AS r
                          WHERE r.endpoint_id = ep.id AND r.state = 'running'
                            AND r.replay_id IS NOT NULL AND r.id <> ALL (answered))::integer
           END AS replay_room,
           -- Narrowed whenever live deliveries flow, whatever the share:
           -- with a share of 1 (a cap under 8) the width does not change,
           -- but a replayed delivery's end still need not wake a claim of
           -- its own.
           lf.live AS narrowed,
           rc.lane_limit
    FROM unnest(lanes) WITH ORDINALITY AS l(id, lane_order)
    JOIN outbox.endpoints AS ep ON ep.id = l.id
    -- The width of replay_width, asked once: OFFSET 0 keeps the subquery
    -- whole, where flattened each use of live would call the function.
    CROSS JOIN LATERAL (SELECT outbox.live_flows(ep.id) AS live OFFSET 0) AS lf
    -- The lane's room for new jobs and, claiming ahead, the limit of the
    -- claiming replica's requests in flight (above): one read of the
    -- endpoint's running jobs.
    CROSS JOIN LATERAL (
      SELECT CASE WHEN ahead AND replica IS NOT NULL AND ep.breaker_opened_at IS NULL
                       AND ep.rate_limit_per_second IS NULL AND ep.consecutive_failures = 0
                       AND ep.id <> ALL (cooling) AND n.slow = 0
                  THEN 2 * (n.cap - n.others) - n.own
                  ELSE n.cap - n.holders
             END AS room,
             CASE WHEN ahead AND replica IS NOT NULL AND ep.disabled_at IS NULL
                  THEN n.cap - n.others
             END AS lane_limit
      FROM (SELECT CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END AS cap,
                   count(*) FILTER (WHERE r.id <> ALL (answered))::integer AS holders,
                   count(*) FILTER (WHERE r.held_by IS DISTINCT FROM replica)::integer AS others,
                   count(*) FILTER (WHERE r.held_by = replica AND r.id <> ALL (answered))::integer AS own,
                   count(*) FILTER (WHERE r.held_by = replica AND r.id <> ALL (answered)
                                      AND r.attempted_at < now() - interval '250 milliseconds')::integer AS slow
            FROM outbox.jobs AS r
            WHERE r.endpoint_id = ep.id AND r.state = 'running') AS n
      OFFSET 0
    ) AS rc
  ),
  -- Each lane's due jobs, locked, in due order: the live ones first, up
  -- to its room; then the replayed ones, in the room the live ones left
  -- and the replay lane's. Two steps, each materialized: the replayed
  -- ones' limit reads how many live ones were locked, which must not read
  -- them a second time.
  live_jobs AS MATERIALIZED (
    SELECT l.id, l.lane_order, l.room, l.replay_room, l.narrowed, l.lane_limit, ARRAY(
      SELECT w.id
      FROM outbox.jobs AS w
      WHERE w.endpoint_id = l.id
        AND w.state IN ('available', 'retryable')
        AND w.replay_id IS NULL
        AND w.scheduled_at <= now()
      ORDER BY w.scheduled_at, w.id
      LIMIT l.room
      FOR UPDATE SKIP LOCKED
    ) AS ids
    FROM lane AS l
  ),
  lane_jobs AS MATERIALIZED (
    SELECT lj.id, lj.lane_order, lj.room, lj.replay_room, lj.narrowed, lj.lane_limit, lj.ids AS live_ids, ARRAY(
      SELECT w.id
      FROM outbox.jobs AS w
      WHERE w.endpoint_id = lj.id
        AND w.state IN ('available', 'retryable')
        AND w.replay_id IS NOT NULL
        AND w.scheduled_at <= now()
      ORDER BY w.scheduled_at, w.id
      LIMIT greatest(least(lj.room - cardinality(lj.ids), lj.replay_room), 0)
      FOR UPDATE SKIP LOCKED
    ) AS replay_ids
    FROM live_jobs AS lj
  ),
  candidate AS (
    SELECT c.id, false AS replayed, c.lane_rank, lj.lane_order
    FROM lane_jobs AS lj
    CROSS JOIN LATERAL unnest(lj.live_ids) WITH ORDINALITY AS c(id, lane_rank)
    UNION ALL
    SELECT c.id, true, c.lane_rank, lj.lane_order
    FROM lane_jobs AS lj
    CROSS JOIN LATERAL unnest(lj.replay_ids) WITH ORDINALITY AS c(id, lane_rank)
    UNION ALL
    SELECT c.id, false, c.lane_rank, 0
    FROM unnest(ARRAY(
      SELECT w.id
      FROM outbox.jobs AS w
      WHERE w.endpoint_id IS NULL
        AND w.state IN ('available', 'retryable')
        AND w.scheduled_at <= now()
      ORDER BY w.scheduled_at, w.id
      LIMIT least(batch, 2 * batch / (cardinality(lanes) + 1) + 1)
      FOR UPDATE SKIP LOCKED
    )) WITH ORDINALITY AS c(id, lane_rank)
  ),
  claimed AS (
    UPDATE outbox.jobs AS j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = now(),
        held_by = replica
    WHERE j.id = ANY (ARRAY(
      SELECT c.id FROM candidate AS c
      ORDER BY c.replayed, c.lane_rank, c.lane_order
      LIMIT batch
    ))
    RETURNING j.id, j.kind, j.attempt, j.max_attempts, j.endpoint_id, j.event_id,
              j.replay_id, j.lane_key, j.attempted_at
  ),
  -- Whether the claim filled what it could take: each endpoint's room
  -- and replay room, and the subscribers' share of the batch. A job
  -- claimed into a full place is wake_on_outcome: its outcome frees a
  -- place that due work may be waiting for, so the worker claims again
  -- when it is recorded; any other outcome frees nothing a claim could
  -- use at once, and the worker waits for new jobs or its poll.
  --
  -- Except a replayed delivery of a lane narrowed by live traffic
  -- (live_flows): its place is taken again by the next claim the live
  -- deliveries bring, or, if none comes soon, by one the worker makes
  -- after a short wait (replay_yields; deliver.go, replayYield). A claim
  -- of its own for each replayed delivery doubled the claims and outcome
  -- batches a second beside a replay, and the CPU they cost was what
  -- live deliveries waited for.
  filled AS (
    SELECT lj.id, lj.narrowed, lj.lane_limit,
           cardinality(lj.live_ids) + cardinality(lj.replay_ids) >= lj.room AS room_full,
           cardinality(lj.replay_ids) >= lj.replay_room AS replay_full
    FROM lane_jobs AS lj
  ),
  subscribers_filled AS (
    SELECT count(*) >= least(batch, 2 * batch / (cardinality(lanes) + 1) + 1) AS full
    FROM candidate AS sc
    WHERE sc.lane_order = 0
  ),
  -- Under a rate limit, the claimed jobs of a lane start 1/rate apart
  -- from rate_base, and the lane's next request after them.
  paced AS (
    SELECT c.id,
           l.rate_base + (row_number() OVER (PARTITION BY l.id ORDER BY c.id) - 1)
                         * make_interval(secs => 1 / l.rate) AS start_at
    FROM claimed AS c
    JOIN lane AS l ON l.id = c.endpoint_id
    WHERE l.rate IS NOT NULL
  ),
  paced_lanes AS (
    UPDATE outbox.endpoints AS ep
    SET rate_next_at = l.rate_base + n.claimed * make_interval(secs => 1 / l.rate)
    FROM (SELECT c.endpoint_id, count(*) AS claimed FROM claimed AS c GROUP BY c.endpoint_id) AS n
    JOIN lane AS l ON l.id = n.endpoint_id
    WHERE ep.id = n.endpoint_id
      AND l.rate IS NOT NULL
  )
  SELECT ROW(c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id,
         e.id, e.topic, e.subject, e.payload, e.created_at,
         e.traceparent, e.tracestate,
         ep.url, ep.secret,
         CASE WHEN ep.previous_secret_expires_at > now() THEN ep.previous_secret END,
         ep.disabled_reason,
         coalesce(greatest(0, ceil(extract(epoch FROM p.start_at - now()) * 1000)), 0)::integer,
         -- An ordered lane's delivery always: its outcome lets the lane's
         -- next one go (advance_lanes).
         c.lane_key IS NOT NULL
           OR CASE WHEN c.endpoint_id IS NULL THEN sf.full
                   ELSE coalesce(fl.room_full OR (c.replay_id IS NOT NULL AND fl.replay_full AND NOT fl.narrowed), true)
              END,
         c.replay_id IS NOT NULL AND coalesce(fl.narrowed, false),
         -- A first attempt of a live delivery cannot be a duplicate:
         -- no earlier request of it exists. A replay's may resend what
         -- an earlier job delivered.
         CASE WHEN c.attempt > 1 OR c.replay_id IS NOT NULL THEN ep.dedup_window_seconds END,
         c.attempted_at,
         coalesce(e.committed_at, e.created_at))::outbox.claimed_job,
         fl.lane_limit
  FROM claimed AS c
  JOIN outbox.events AS e ON e.id = c.event_id
  CROSS JOIN subscribers_filled AS sf
  LEFT JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
  LEFT JOIN paced AS p ON p.id = c.id
  LEFT JOIN filled AS fl ON fl.id = c.endpoint_id;
END
$$;

-- claim_due_jobs is claim_lane_jobs without ahead: every running job not
-- answered holds its endpoint's place, so that every job it claims may
-- start at once. The relay's claim (fan_out_claiming) and the releases
-- before claim_lane_jobs call it.
DROP FUNCTION IF EXISTS outbox.claim_due_jobs(integer, bigint, bigint[]);

CREATE FUNCTION outbox.claim_due_jobs(batch integer, replica bigint DEFAULT NULL, answered bigint[] DEFAULT '{}')
RETURNS SETOF outbox.claimed_job
LANGUAGE sql VOLATILE
ROWS 100
AS $$
  SELECT (l.job).* FROM outbox.claim_lane_jobs(batch, replica, answered, false, '{}') AS l
$$;

-- fan_out is the relay's transaction (relay.go): it claims and marks
-- events, then enqueues one job per (event, matching subscriber) and one
-- webhook job per (event, enabled endpoint whose topics match and whose
-- filter, if it has one, the payload passes), in one statement, one round
-- trip and one transaction. With in_event_id NULL it
-- claims a batch of up to in_batch events (claim_to_fan_out); with an id,
-- that one event, for the row-by-row retry after a batch failed (another
-- relay may have relayed it meanwhile, and then it claims nothing).
--
-- in_subscribers are the subscribers as JSON ([{"kind", "topics",
-- "per_subject"}]), in_max_attempts the jobs' max attempts, and
-- in_breaker_delay how far out (seconds) an endpoint's new jobs are
-- scheduled while its circuit breaker is open. in_origin names the process
-- whose relay runs it, for the workers' NOTIFY (notify_jobs; '' for none).
--
-- Every part reads the claimed rows once, from what the UPDATE returned.
-- Topics are matched once per distinct topic of the batch, not once per
-- event: a batch holds a handful of topics, and topic_matches is not cheap.
-- An endpoint's filter is tested once per event its topics select
-- (routed), on the path parsed when it was stored (filter_path), with
-- silent => true: an error the payload causes (a wrong type, a missing
-- member in strict mode, a result that is not a boolean) answers unknown,
-- and unknown is no match, never a failed pass. filter_problem keeps out
-- the filters whose errors silent does not cover.
--
-- A coalescing subscriber gets one job per topic and subject of the batch,
-- for its highest event id (DISTINCT ON keeps the first row of each (kind,
-- topic, subject) in the ORDER BY, id descending). Webhooks are never
-- coalesced: each event is a fact. Inserts go in id order, so the job
-- table's indexes grow at their right edge.
--
-- Each endpoint's deliveries, and the events its filter kept from it, are
-- counted for its statistics (fanout_stats) in endpoint order: relays
-- adding to the same minute's rows lock them in one order. The row also keeps when the last of them was fanned out, which
-- narrows the endpoint's replay lane while live deliveries flow
-- (replay_width). The subject index (subjects) is kept here too, in the
-- transaction that marks the events fanned out: as a job per subject it
-- would cost an insert, a claim and a completion, each a new row version
-- in every index of the job table.
--
-- Then the ordered lanes of the batch's events advance (advance_lanes), so
-- a delivery is never held behind nothing: those that got a delivery, and
-- those whose event the filter kept out, behind which advance_lanes held a
-- later event of the subject while this one waited to be fanned out. The commit does not wait for the
-- WAL to reach the disk: a crash before the flush rolls the transaction
-- back whole, and the events are claimed again (database.go,
-- beginPipelineTx, says why that loses nothing). The parameters are named in_*, so that no name in the
-- statement can be taken for one of them; the plan is kept for the
-- session (force_generic_plan), the statement being the same every pass.
DROP FUNCTION IF EXISTS outbox.fan_out(integer, jsonb, integer, double precision);

DROP FUNCTION IF EXISTS outbox.fan_out(integer, jsonb, integer, double precision, text);

DROP FUNCTION IF EXISTS outbox.fan_out_event(bigint, jsonb, integer, double precision, text);

DROP FUNCTION IF EXISTS outbox.fan_out(integer, bigint, jsonb, integer, double precision, text);

CREATE FUNCTION outbox.fan_out(in_batch integer, in_event_id bigint, in_subscribers jsonb,
                               in_max_attempts integer, in_breaker_delay double precision, in_origin text)
RETURNS TABLE (out_fanned bigint, out_jobs bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  claimed bigint[];
  lane_endpoints bigint[];
  lane_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  IF in_origin <> '' THEN
    PERFORM set_config('outbox.relay_origin', in_origin, true);
  END IF;
  -- Claimed before the statement below begins, which then sees every
  -- endpoint committed before a claimed event (claim_to_fan_out).
  claimed := outbox.claim_to_fan_out(in_batch, in_event_id);
  WITH marked AS (
    SELECT m.id, m.topic, m.subject, m.payload
    FROM outbox.mark_claimed_fanned_out(claimed) AS m
  ),
  topics AS (
    SELECT DISTINCT m.topic FROM marked AS m
  ),
  subscriptions AS (
    SELECT s.kind, s.per_subject, t.topic
    FROM jsonb_to_recordset(in_subscribers) AS s(kind text, topics text[], per_subject boolean)
    JOIN topics AS t ON outbox.topic_matches(s.topics, t.topic)
  ),
  endpoint_subscriptions AS (
    SELECT ep.id AS endpoint_id, ep.breaker_opened_at, ep.ordering, ep.filter_path, t.topic
    FROM outbox.endpoints AS ep
    JOIN topics AS t ON outbox.topic_matches(ep.topics, t.topic)
    WHERE ep.disabled_at IS NULL
  ),
  routed AS (
    SELECT m.id, m.subject, es.endpoint_id, es.breaker_opened_at, es.ordering,
           es.filter_path IS NULL
             OR coalesce(jsonb_path_match(m.payload, es.filter_path, silent => true), false) AS passes
    FROM marked AS m
    JOIN endpoint_subscriptions AS es ON es.topic = m.topic
  ),
  enqueued AS (
    INSERT INTO outbox.jobs (kind, event_id, max_attempts)
    SELECT s.kind, m.id, in_max_attempts
    FROM marked AS m
    JOIN subscriptions AS s ON s.topic = m.topic AND NOT s.per_subject
    ORDER BY m.id
    RETURNING 1
  ),
  coalesced AS (
    INSERT INTO outbox.jobs (kind, event_id, max_attempts)
    SELECT latest.kind, latest.id, in_max_attempts
    FROM (
      SELECT DISTINCT ON (s.kind, m.topic, m.subject) s.kind, m.id
      FROM marked AS m
      JOIN subscriptions AS s ON s.topic = m.topic AND s.per_subject
      ORDER BY s.kind, m.topic, m.subject, m.id DESC
    ) AS latest
    ORDER BY latest.id
    RETURNING 1
  ),
  webhooks AS (
    INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at, lane_key)
    SELECT 'webhook', r.id, r.endpoint_id, in_max_attempts,
           CASE WHEN r.ordering = 'subject' THEN 'infinity'
                WHEN r.breaker_opened_at IS NULL THEN now()
                ELSE now() + make_interval(secs => in_breaker_delay) END,
           CASE WHEN r.ordering = 'subject' THEN r.subject END
    FROM routed AS r
    WHERE r.passes
    ORDER BY r.id, r.endpoint_id
    RETURNING 1
  ),
  lanes AS (
    SELECT DISTINCT r.endpoint_id, r.subject AS lane_key FROM routed AS r WHERE r.ordering = 'subject'
  ),
  produced AS (
    INSERT INTO outbox.fanout_stats AS f (endpoint_id, minute, deliveries, filtered_out, last_fanned_at)
    SELECT r.endpoint_id, date_trunc('minute', now()),
           count(*) FILTER (WHERE r.passes), count(*) FILTER (WHERE NOT r.passes),
           CASE WHEN bool_or(r.passes) THEN now() END
    FROM routed AS r
    GROUP BY r.endpoint_id
    ORDER BY r.endpoint_id
    ON CONFLICT (endpoint_id, minute) DO UPDATE
    SET deliveries = f.deliveries + EXCLUDED.deliveries,
        filtered_out = f.filtered_out + EXCLUDED.filtered_out,
        last_fanned_at = coalesce(EXCLUDED.last_fanned_at, f.last_fanned_at)
  ),
  indexed AS (
    INSERT INTO outbox.subjects AS s (subject, topic, last_event_id, payload, updated_at)
    SELECT DISTINCT ON (m.subject, m.topic) m.subject, m.topic, m.id, m.payload, now()
    FROM marked AS m
    WHERE m.subject <> ''
    ORDER BY m.subject, m.topic, m.id DESC
    ON CONFLICT (subject, topic) DO UPDATE
    SET last_event_id = EXCLUDED.last_event_id,
        payload = EXCLUDED.payload,
        updated_at = EXCLUDED.updated_at
    WHERE s.last_event_id < EXCLUDED.last_event_id
  )
  SELECT (SELECT count(*) FROM marked),
         (SELECT count(*) FROM enqueued) + (SELECT count(*) FROM coalesced) + (SELECT count(*) FROM webhooks),
         (SELECT coalesce(array_agg(l.endpoint_id ORDER BY l.endpoint_id, l.lane_key), '{}') FROM lanes AS l),
         (SELECT coalesce(array_agg(l.lane_key ORDER BY l.endpoint_id, l.lane_key), '{}') FROM lanes AS l)
  INTO out_fanned, out_jobs, lane_endpoints, lane_keys;
  IF cardinality(lane_endpoints) > 0 THEN
    PERFORM outbox.advance_lanes(lane_endpoints, lane_keys, true);
  END IF;
  RETURN NEXT;
END
$$;

-- A row of the current minute is updated by every outcome batch, a few
-- hundred times a minute, never in an indexed column: HOT updates, as long
-- as its page has room for the new version. fillfactor 50 keeps that room,
-- and a vacuum after 50 dead versions whatever the table's size (scale
-- factor 0) keeps the page pruned. fanout_stats, updated by every relay
-- pass, likewise.
ALTER TABLE outbox.delivery_stats SET (
  fillfactor = 50,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 50
);

ALTER TABLE outbox.fanout_stats SET (
  fillfactor = 50,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 50
);

-- filtered_out is how many of the events that the endpoint's topics
-- selected in that minute its filter kept from it (outbox.endpoints,
-- filter), counted by the same upsert: one row per endpoint and pass, as
-- the deliveries are, never one per event. A row of an endpoint whose
-- filter kept every event of a pass has deliveries 0 and no
-- last_fanned_at.
ALTER TABLE outbox.fanout_stats
  ADD COLUMN IF NOT EXISTS filtered_out bigint NOT NULL DEFAULT 0;

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
--     its job took (kept, and written); and the statistics, which count
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
DROP FUNCTION IF EXISTS outbox.record_outcomes(bigint[], integer[], text[], bigint[], text[], integer[], integer[],
  bigint[], integer[], bigint[], integer[], integer[], text[], text[], boolean[], text[], bigint[], integer[], integer,
  bigint[], boolean[], integer[], bigint[], integer, bigint[], bigint[], bigint[]);

DROP FUNCTION IF EXISTS outbox.record_outcomes(json, json, json, bigint[], json, integer, integer);

CREATE FUNCTION outbox.record_outcomes(in_outcomes json, in_attempts json, in_health json, in_gone bigint[],
                                       in_windows json, in_breaker_threshold integer, in_buckets integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
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

-- Every refusal reason of the minute with its count, keyed by class, a
-- space and the reason ({"bad_signature no signature matches": 3}): the
-- last reason alone hid the others a sender got in the same minute. At
-- most 20 reasons a row (inbox.go, maxRefusalReasons); past them a
-- refusal counts under its class and "(other reasons)", so that a sender
-- varying its mistakes cannot grow the row without bound. Refusals
-- counted by a replica older than the column are in the class counts
-- only.
ALTER TABLE outbox.inbox_stats
  ADD COLUMN IF NOT EXISTS refusal_reasons jsonb NOT NULL DEFAULT '{}';

-- An endpoint's TLS material (clientcert.go): the client certificate (PEM,
-- leaf first) and its private key that deliveries present to a receiver
-- asking for mutual TLS, set and removed together, with the leaf's expiry
-- kept beside them for the overview's client_certificate_expiring alert;
-- and ca_certificate (PEM), the only authorities the receiver's own
-- certificate may chain to. The key is PEM text, or with -secrets-key
-- sealed (secrets.go, sealBlob: first byte 2). 32 kB each is maxPEMLen;
-- a sealed key is 33 bytes longer.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS client_certificate text,
  ADD COLUMN IF NOT EXISTS client_key bytea,
  ADD COLUMN IF NOT EXISTS client_certificate_expires_at timestamptz,
  ADD COLUMN IF NOT EXISTS ca_certificate text;

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_client_certificate_pair CHECK (
      (client_certificate IS NULL) = (client_key IS NULL)
      AND (client_certificate IS NULL) = (client_certificate_expires_at IS NULL)
    ),
    ADD CONSTRAINT endpoints_client_certificate_length CHECK (length(client_certificate) <= 32768),
    ADD CONSTRAINT endpoints_client_key_length CHECK (length(client_key) <= 32768 + 33),
    ADD CONSTRAINT endpoints_ca_certificate_length CHECK (length(ca_certificate) <= 32768),
    -- Only TLS carries them: on an http:// or mailto: endpoint they would
    -- be kept and never used.
    ADD CONSTRAINT endpoints_tls_material_https CHECK (
      (client_certificate IS NULL AND ca_certificate IS NULL) OR url LIKE 'https://%'
    );
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- One row per owner (owners.go), created, given a new token and
-- deleted by the admin. An owner signs in to /api/ and the panel with its
-- token, obo_ + a selector + a verifier: the row holds the selector, which
-- finds it, and the SHA-256 of the verifier, compared in constant time; so
-- the table holds nothing that signs in. Rotation replaces both: the old
-- token is refused from the commit on, on every replica. Bounded by the
-- admin, who creates every row.
CREATE TABLE IF NOT EXISTS outbox.owners (
  id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name             text        NOT NULL,
  token_selector   text        NOT NULL,
  token_hash       bytea       NOT NULL,
  created_at       timestamptz NOT NULL DEFAULT now(),
  token_rotated_at timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT owners_name_length CHECK (length(name) BETWEEN 1 AND 200),
  CONSTRAINT owners_token_selector_format CHECK (token_selector ~ '^[0-9a-f]{24}$'),
  CONSTRAINT owners_token_hash_length CHECK (length(token_hash) = 32),
  CONSTRAINT owners_token_selector_unique UNIQUE (token_selector)
);

-- An endpoint's owner, who may see and manage it through the portal; NULL:
-- the admin's alone. Deleting an owner leaves its endpoints to the admin.
-- A replica of the release before owners never reads it, and creates
-- endpoints without one. Index endpoints_by_owner_id: schema_indexes.sql.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS owner_id bigint REFERENCES outbox.owners (id) ON DELETE SET NULL;

-- One row per browser signed in as an owner: the twin of
-- outbox.panel_sessions, in a table of its own so that a replica of the
-- release before owners, which reads only panel_sessions and takes every
-- row there for the admin's, never sees an owner's session. Bounded like
-- it: every sign-in deletes up to 100 expired rows and the live ones past
-- the newest 1,000. Rotating an owner's token or deleting the owner ends
-- its sessions.
CREATE TABLE IF NOT EXISTS outbox.owner_sessions (
  id_hash    bytea       PRIMARY KEY,
  owner_id   bigint      NOT NULL REFERENCES outbox.owners (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  CONSTRAINT owner_sessions_id_hash_length CHECK (length(id_hash) = 32)
);

-- Serves the sign-in's deletions, as panel_sessions_by_expires_at does.
CREATE INDEX IF NOT EXISTS owner_sessions_by_expires_at
  ON outbox.owner_sessions (expires_at);

-- Serves the ending of one owner's sessions (rotation, delete's cascade).
CREATE INDEX IF NOT EXISTS owner_sessions_by_owner_id
  ON outbox.owner_sessions (owner_id);

-- Sign-in links the admin hands to an owner (owners.go): the link holds a
-- random code, the row its SHA-256. A link signs in once: the sign-in
-- deletes the row in the statement that reads it, so two clicks racing
-- get one session between them. It expires after -signin-link-lifetime
-- (1 h). Bounded like the sessions: every new link deletes up to 100
-- expired rows, and the live ones past the newest 1,000.
CREATE TABLE IF NOT EXISTS outbox.owner_signin_links (
  code_hash  bytea       PRIMARY KEY,
  owner_id   bigint      NOT NULL REFERENCES outbox.owners (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  CONSTRAINT owner_signin_links_code_hash_length CHECK (length(code_hash) = 32)
);

CREATE INDEX IF NOT EXISTS owner_signin_links_by_expires_at
  ON outbox.owner_signin_links (expires_at);

-- One row per change made through the API or the panel (audit.go): who
-- (the admin, or which owner, by id and by the name it had), what (the
-- route, and the fields a JSON body gave, never their values: a body may
-- hold a secret), to what (the subject's kind and id or name; endpoint_id
-- also for a change to an endpoint, which its owner may read), and when.
-- Nothing references the rows, and they reference nothing, so that an
-- entry outlives what it tells of. Retention deletes rows older than
-- -audit-retention (90 days), in batches (retention.go).
CREATE TABLE IF NOT EXISTS outbox.audit_log (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at           timestamptz NOT NULL DEFAULT now(),
  actor        text        NOT NULL,
  owner_id     bigint,
  owner_name   text,
  via          text        NOT NULL,
  action       text        NOT NULL,
  subject_kind text        NOT NULL,
  subject      text        NOT NULL,
  endpoint_id  bigint,
  fields       text[]      NOT NULL DEFAULT '{}',

  CONSTRAINT audit_log_actor_known CHECK (actor IN ('admin', 'owner')),
  CONSTRAINT audit_log_owner_with_actor CHECK ((actor = 'owner') = (owner_id IS NOT NULL)),
  CONSTRAINT audit_log_via_known CHECK (via IN ('api', 'panel')),
  CONSTRAINT audit_log_subject_kind_known CHECK (subject_kind IN ('endpoint', 'owner', 'source')),
  CONSTRAINT audit_log_lengths CHECK (
    length(action) <= 200 AND length(subject) <= 200 AND length(coalesce(owner_name, '')) <= 200
    AND cardinality(fields) <= 50
  )
);

-- Serves an owner's endpoint list and the ownership check of every route
-- under /api/endpoints/{id} an owner's token calls (owners.go), and the
-- SET NULL of an owner's delete.
CREATE INDEX CONCURRENTLY IF NOT EXISTS endpoints_by_owner_id
  ON outbox.endpoints (owner_id)
  WHERE owner_id IS NOT NULL;

-- Serves the audit trail's pages, newest first, and its retention
-- (retention.go), oldest first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS audit_log_by_at
  ON outbox.audit_log (at, id);

-- Serves an owner's page of the audit trail: its endpoints' entries.
CREATE INDEX CONCURRENTLY IF NOT EXISTS audit_log_by_endpoint_id
  ON outbox.audit_log (endpoint_id, id)
  WHERE endpoint_id IS NOT NULL;

-- 0.1.0's calls, which 0.2.0 kept for 0.1.0's replicas while they rolled.
DROP FUNCTION IF EXISTS outbox.fan_out_and_claim(integer, jsonb, integer, double precision, text, integer, bigint, bigint[]);
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer, bigint, bigint[]);

-- 005_0.5.0.sql: from release 0.4.0 to 0.5.0.
--
-- migrate.go applies it in one transaction, except its CONCURRENTLY
-- index statements and constraint validations, which run after that
-- transaction, one at a time. Written before releases recorded their
-- migrations by number: every statement can run again over a database
-- that has part of it, as a build between two releases left it.

-- A job is one delivery of one event to one in-process subscriber (kind
-- 'sub:<name>') or one endpoint (kind 'webhook', endpoint_id). The relay
-- inserts it in the transaction that marks its event fanned out. Its life:
--
--   available  → running    a worker claimed it (attempt += 1, attempted_at)
--   running    → completed  the handler succeeded (finalized_at)
--   running    → retryable  it failed and has attempts left; scheduled_at is
--                           when it may run again (backoff)
--   running    → discarded  it failed permanently or ran out of attempts
--                           (finalized_at); errors keeps every attempt's error
--   running    → retryable  the rescuer found it running past the attempt
--                           timeout plus a margin, or held by a replica
--                           declared dead (held_by, outbox.replicas): its
--                           worker is gone
--   retryable  → running    claimed again once scheduled_at has come
--   discarded  → available  retried by hand
--
-- A worker's outcome is written only if the job is still running with the
-- attempt number the worker claimed; a worker that lost its job to the
-- rescuer changes nothing. The job cleaner deletes completed jobs after 24 h
-- and discarded ones after 7 days.
CREATE TABLE IF NOT EXISTS outbox.jobs (
  id           bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind         text             NOT NULL,
  event_id     bigint           NOT NULL,
  state        outbox.job_state NOT NULL DEFAULT 'available',
  attempt      integer          NOT NULL DEFAULT 0,
  max_attempts integer          NOT NULL,
  created_at   timestamptz      NOT NULL DEFAULT now(),
  scheduled_at timestamptz      NOT NULL DEFAULT now(),
  attempted_at timestamptz,
  finalized_at timestamptz,
  -- One object per failed attempt: {"attempt", "at", "error"}.
  errors       jsonb            NOT NULL DEFAULT '[]',

  CONSTRAINT jobs_kind_length CHECK (length(kind) BETWEEN 1 AND 100),
  CONSTRAINT jobs_attempt_within_max CHECK (attempt >= 0 AND attempt <= max_attempts),
  CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts > 0),
  CONSTRAINT jobs_finalized_when_final CHECK (
    (state IN ('completed', 'discarded')) = (finalized_at IS NOT NULL)
  ),
  CONSTRAINT jobs_attempted_when_running CHECK (state <> 'running' OR attempted_at IS NOT NULL)
);

-- A webhook job names its endpoint. Deleting the endpoint keeps the job
-- (endpoint_id set NULL) so that it ends visibly, discarded with "endpoint
-- deleted", rather than vanishing; deleting its event deletes it.
ALTER TABLE outbox.jobs
  ADD COLUMN IF NOT EXISTS endpoint_id bigint;

-- A job's event and endpoint are held by triggers, a statement at a time,
-- where foreign keys would check each inserted row with a query of its
-- own: the relay inserts up to 200 jobs a pass, and those queries were a
-- quarter of its fan-out (docs/performance.md). What the keys did, the
-- triggers do, whichever statement writes:
--   - a statement that inserts jobs (or changes a job's event or
--     endpoint) locks the rows they name FOR KEY SHARE, as a key's check
--     does (lock_job_references, once for the statement's jobs), and
--     fails with foreign_key_violation (23503) if one is gone:
--     a deletion waits for the inserting transaction, and one that
--     committed first is seen, the check being a statement of its own;
--   - deleting events deletes their jobs (ON DELETE CASCADE), and
--     deleting endpoints sets their jobs' endpoint_id NULL (ON DELETE SET
--     NULL), in the deleting statement;
--   - truncating the events while jobs remain is refused (below).
-- jobs_by_event_id and jobs_one_per_event_endpoint serve the deletions.
CREATE OR REPLACE FUNCTION outbox.lock_job_references(in_events bigint[], in_endpoints bigint[])
RETURNS void
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  in_events := ARRAY(SELECT DISTINCT e FROM unnest(in_events) AS e);
  in_endpoints := ARRAY(SELECT DISTINCT ep FROM unnest(in_endpoints) AS ep WHERE ep IS NOT NULL);
  IF (SELECT count(*) FROM (SELECT 1 FROM outbox.events AS e
                            WHERE e.id = ANY (in_events) FOR KEY SHARE OF e) AS locked) < cardinality(in_events)
     OR (SELECT count(*) FROM (SELECT 1 FROM outbox.endpoints AS ep
                               WHERE ep.id = ANY (in_endpoints) FOR KEY SHARE OF ep) AS locked) < cardinality(in_endpoints)
  THEN
    RAISE EXCEPTION 'a job names an event or an endpoint that does not exist'
      USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs';
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.jobs_check_references() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM outbox.lock_job_references(ARRAY(SELECT n.event_id FROM new_jobs AS n),
                                     ARRAY(SELECT n.endpoint_id FROM new_jobs AS n));
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox.jobs_check_changed_references() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM outbox.lock_job_references(ARRAY[NEW.event_id], ARRAY[NEW.endpoint_id]);
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox.events_delete_jobs() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  DELETE FROM outbox.jobs AS j WHERE j.event_id = ANY (ARRAY(SELECT g.id FROM gone_events AS g));
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION outbox.endpoints_release_jobs() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  UPDATE outbox.jobs AS j SET endpoint_id = NULL
  WHERE j.endpoint_id = ANY (ARRAY(SELECT g.id FROM gone_endpoints AS g));
  RETURN NULL;
END
$$;

-- A key refused to truncate the table it names; a trigger must say so
-- itself. TRUNCATE outbox.events while jobs remain would leave them
-- naming no event, so it is refused: truncate outbox.jobs first, in a
-- statement of its own (in one statement with the events, the trigger
-- runs before either is emptied, and still finds the jobs). The endpoints
-- need no guard: outbox.replays' foreign key refuses their truncation.
CREATE OR REPLACE FUNCTION outbox.events_refuse_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM outbox.jobs) THEN
    RAISE EXCEPTION 'outbox.events cannot be truncated while outbox.jobs holds jobs'
      USING ERRCODE = 'feature_not_supported', HINT = 'Truncate outbox.jobs first, in a statement of its own.';
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS events_refuse_truncate ON outbox.events;

CREATE TRIGGER events_refuse_truncate
  BEFORE TRUNCATE ON outbox.events
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.events_refuse_truncate();

DROP TRIGGER IF EXISTS jobs_references ON outbox.jobs;

CREATE TRIGGER jobs_references
  AFTER INSERT ON outbox.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.jobs_check_references();

DROP TRIGGER IF EXISTS jobs_changed_references ON outbox.jobs;

CREATE TRIGGER jobs_changed_references
  AFTER UPDATE OF event_id, endpoint_id ON outbox.jobs
  FOR EACH ROW
  WHEN (NEW.event_id IS DISTINCT FROM OLD.event_id
        OR (NEW.endpoint_id IS NOT NULL AND NEW.endpoint_id IS DISTINCT FROM OLD.endpoint_id))
  EXECUTE FUNCTION outbox.jobs_check_changed_references();

DROP TRIGGER IF EXISTS events_delete_jobs ON outbox.events;

CREATE TRIGGER events_delete_jobs
  AFTER DELETE ON outbox.events
  REFERENCING OLD TABLE AS gone_events
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.events_delete_jobs();

DROP TRIGGER IF EXISTS endpoints_release_jobs ON outbox.endpoints;

CREATE TRIGGER endpoints_release_jobs
  AFTER DELETE ON outbox.endpoints
  REFERENCING OLD TABLE AS gone_endpoints
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.endpoints_release_jobs();

-- The foreign keys earlier releases made, dropped now that the triggers
-- hold what they held.
ALTER TABLE outbox.jobs
  DROP CONSTRAINT IF EXISTS jobs_event_id_fkey,
  DROP CONSTRAINT IF EXISTS jobs_endpoint_id_fkey;

-- as_claimed_job is the claimed job (claimed_job) that a claim returns for
-- job id, of kind, at attempt (of max_attempts), to endpoint_id (NULL: a
-- subscriber's), of replay_id (NULL: live), claimed at attempted_at: its
-- event e and endpoint ep (a NULL row for a subscriber's), and what the
-- claim decided of its start and its end. Every claim builds its rows
-- here: the workers' (claim_lane_jobs) and the relay's (born_running).
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
         coalesce(e.committed_at, e.created_at))::outbox.claimed_job
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
  -- Tables first in the order a migration locks them (migrate.go,
  -- schemaTablesQuery), outbox.events before the replica's row: a claim
  -- that locked the row and then queued for events behind a migration
  -- would hold what the migration waits for next.
  LOCK TABLE outbox.events IN ACCESS SHARE MODE;
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
  SELECT outbox.as_claimed_job(c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id, c.replay_id,
           c.attempted_at, e, ep,
           coalesce(greatest(0, ceil(extract(epoch FROM p.start_at - now()) * 1000)), 0)::integer,
           -- An ordered lane's delivery always: its outcome lets the lane's
           -- next one go (advance_lanes).
           c.lane_key IS NOT NULL
             OR CASE WHEN c.endpoint_id IS NULL THEN sf.full
                     ELSE coalesce(fl.room_full OR (c.replay_id IS NOT NULL AND fl.replay_full AND NOT fl.narrowed), true)
                END,
           c.replay_id IS NOT NULL AND coalesce(fl.narrowed, false)),
         fl.lane_limit
  FROM claimed AS c
  JOIN outbox.events AS e ON e.id = c.event_id
  CROSS JOIN subscribers_filled AS sf
  LEFT JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
  LEFT JOIN paced AS p ON p.id = c.id
  LEFT JOIN filled AS fl ON fl.id = c.endpoint_id;
END
$$;

-- takes_deliveries_running says whether a delivery to endpoint ep may be
-- born running (fan_out): one that a claim would start at once, its
-- endpoint's cap the only bound. Not an endpoint that is off, waiting or
-- paced (disabled, paused, held, breaker open, rate-limited), nor one
-- that orders by subject, whose deliveries take their turns
-- (advance_lanes).
CREATE OR REPLACE FUNCTION outbox.takes_deliveries_running(ep outbox.endpoints)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT ep.disabled_at IS NULL AND ep.paused_at IS NULL
     AND (ep.held_until IS NULL OR ep.held_until <= now())
     AND ep.breaker_opened_at IS NULL AND ep.rate_limit_per_second IS NULL
     AND ep.ordering <> 'subject'
$$;

-- has_due_live_jobs says whether endpoint ep has a live delivery due and
-- waiting (jobs_waiting_live_by_endpoint): one a claim would start before
-- any delivery made after it. PL/pgSQL, so that its plan is made once per
-- session: a SQL function with a subquery is not inlined, and was planned
-- again in every statement that called it, 0.3 ms a relay pass.
CREATE OR REPLACE FUNCTION outbox.has_due_live_jobs(ep bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM outbox.jobs AS w
                 WHERE w.endpoint_id = ep AND w.state IN ('available', 'retryable')
                   AND w.replay_id IS NULL AND w.scheduled_at <= now());
END
$$;

-- lock_born_lanes locks, for the caller's transaction, the lanes of up
-- to in_batch endpoints that the events in_claimed may reach and that
-- take deliveries running (takes_deliveries_running), as a claim locks
-- the lanes it serves (claim_lane_jobs), and returns them. A lane another
-- claim holds is skipped. enable_seqscan = off: the claimed events are
-- read by key, whatever the planner thinks of the batch's size.
CREATE OR REPLACE FUNCTION outbox.lock_born_lanes(in_claimed bigint[], in_batch integer)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
  claimed_topics text[];
BEGIN
  claimed_topics := ARRAY(SELECT DISTINCT e.topic FROM outbox.events AS e WHERE e.id = ANY (in_claimed));
  RETURN ARRAY(
    SELECT c.id
    FROM (
      SELECT ep.id
      FROM outbox.endpoints AS ep
      WHERE outbox.takes_deliveries_running(ep)
        AND EXISTS (SELECT 1 FROM unnest(claimed_topics) AS t(topic) WHERE outbox.topic_matches(ep.topics, t.topic))
        AND NOT outbox.has_due_live_jobs(ep.id)
      ORDER BY ep.id
      LIMIT in_batch
    ) AS c
    WHERE pg_try_advisory_xact_lock(hashtext('outbox.claim_jobs'), (c.id % 2147483647)::integer));
END
$$;

-- born_running reads the deliveries in_ids that fan_out made running, as
-- the workers run them (claimed_job, as claim_lane_jobs returns it): a
-- first attempt of a live delivery, due at once. Those of in_full_lanes
-- filled their endpoint's room, and wake a claim when they end.
-- enable_seqscan = off: a handful of rows, each read by key.
CREATE OR REPLACE FUNCTION outbox.born_running(in_ids bigint[], in_full_lanes bigint[])
RETURNS outbox.claimed_job[]
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
AS $$
BEGIN
  RETURN ARRAY(
    SELECT outbox.as_claimed_job(j.id, j.kind, j.attempt, j.max_attempts, j.endpoint_id, j.replay_id,
                                 j.attempted_at, e, ep, 0, j.endpoint_id = ANY (in_full_lanes), false)
    FROM outbox.jobs AS j
    JOIN outbox.events AS e ON e.id = j.event_id
    JOIN outbox.endpoints AS ep ON ep.id = j.endpoint_id
    WHERE j.id = ANY (in_ids)
    ORDER BY j.id);
END
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
-- Deliveries born running: given in_claim_batch slots of the relay's own
-- workers (fan_out_claiming), the pass inserts as running, held by
-- in_replica at attempt 1, the deliveries a claim would start at once,
-- and returns them (out_claimed) for the workers to send. A claim right
-- after the pass would find them and mark them running, a second version
-- of each row, with an entry in every index of the job table, and a
-- statement that reads every lane with due work; born running, they are
-- written once. Only where that changes nothing a claim decides: an
-- endpoint that takes deliveries running (takes_deliveries_running), with
-- no older live delivery due (has_due_live_jobs: those go first, by the
-- workers' claim), in the room its cap leaves (in flight: its running
-- deliveries, other replicas' included, but in_answered), counted under
-- the lane's claim lock (lock_born_lanes) in a statement after it, as a
-- claim counts; no more than in_claim_batch in all, each endpoint's by
-- event id, the endpoints taking turns. A lane another claim holds gets
-- none. What a claim would have told the worker of each comes with it
-- (born_running): a delivery that filled its endpoint's room wakes a
-- claim when it ends. The claim is lost with the pass when it rolls back,
-- and a running delivery whose replica dies is rescued like any claimed
-- one (rescue.go).
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

DROP FUNCTION IF EXISTS outbox.fan_out(integer, bigint, jsonb, integer, double precision, text, integer, bigint, bigint[]);

CREATE FUNCTION outbox.fan_out(in_batch integer, in_event_id bigint, in_subscribers jsonb,
                               in_max_attempts integer, in_breaker_delay double precision, in_origin text,
                               in_claim_batch integer DEFAULT 0, in_replica bigint DEFAULT NULL,
                               in_answered bigint[] DEFAULT '{}')
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_claimed outbox.claimed_job[])
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
  claimed bigint[];
  lane_endpoints bigint[];
  lane_keys text[];
  born_lanes bigint[] := '{}';
  born_ids bigint[];
  full_lanes bigint[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  IF in_origin <> '' THEN
    PERFORM set_config('outbox.relay_origin', in_origin, true);
  END IF;
  in_answered := coalesce(in_answered, '{}');
  -- Claimed before the statement below begins, which then sees every
  -- endpoint committed before a claimed event (claim_to_fan_out).
  claimed := outbox.claim_to_fan_out(in_batch, in_event_id);
  -- The endpoints whose deliveries may be born running (born_room,
  -- below), locked as a claim locks the lanes it serves, in a statement
  -- before the one that counts their jobs in flight, which then sees what
  -- the lock's previous holder claimed.
  IF coalesce(in_claim_batch, 0) > 0 AND in_replica IS NOT NULL AND cardinality(claimed) > 0 THEN
    PERFORM 1 FROM outbox.replicas AS r WHERE r.id = in_replica FOR KEY SHARE;
    IF FOUND THEN
      born_lanes := outbox.lock_born_lanes(claimed, in_claim_batch);
    END IF;
  END IF;
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
  born_room AS (
    SELECT ep.id AS endpoint_id,
           ep.max_in_flight - (SELECT count(*) FROM outbox.jobs AS r
                               WHERE r.endpoint_id = ep.id AND r.state = 'running'
                                 AND r.id <> ALL (in_answered))::integer AS room
    FROM outbox.endpoints AS ep
    WHERE ep.id = ANY (born_lanes)
      AND outbox.takes_deliveries_running(ep)
      AND NOT outbox.has_due_live_jobs(ep.id)
  ),
  born AS (
    SELECT b.id, b.endpoint_id, b.room
    FROM (SELECT r.id, r.endpoint_id, br.room,
                 row_number() OVER (PARTITION BY r.endpoint_id ORDER BY r.id) AS lane_rank
          FROM routed AS r
          JOIN born_room AS br ON br.endpoint_id = r.endpoint_id
          WHERE r.passes) AS b
    WHERE b.lane_rank <= b.room
    ORDER BY b.lane_rank, b.endpoint_id
    LIMIT in_claim_batch
  ),
  webhooks AS (
    INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at, lane_key,
                             state, attempt, attempted_at, held_by)
    SELECT 'webhook', r.id, r.endpoint_id, in_max_attempts,
           CASE WHEN r.ordering = 'subject' THEN 'infinity'
                WHEN r.breaker_opened_at IS NULL THEN now()
                ELSE now() + make_interval(secs => in_breaker_delay) END,
           CASE WHEN r.ordering = 'subject' THEN r.subject END,
           CASE WHEN b.id IS NULL THEN 'available' ELSE 'running' END::outbox.job_state,
           CASE WHEN b.id IS NULL THEN 0 ELSE 1 END,
           CASE WHEN b.id IS NOT NULL THEN now() END,
           CASE WHEN b.id IS NOT NULL THEN in_replica END
    FROM routed AS r
    LEFT JOIN born AS b ON b.id = r.id AND b.endpoint_id = r.endpoint_id
    WHERE r.passes
    ORDER BY r.id, r.endpoint_id
    RETURNING id, state
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
         (SELECT coalesce(array_agg(l.lane_key ORDER BY l.endpoint_id, l.lane_key), '{}') FROM lanes AS l),
         ARRAY(SELECT w.id FROM webhooks AS w WHERE w.state = 'running' ORDER BY w.id),
         ARRAY(SELECT b.endpoint_id FROM born AS b GROUP BY b.endpoint_id, b.room HAVING count(*) >= b.room)
  INTO out_fanned, out_jobs, lane_endpoints, lane_keys, born_ids, full_lanes;
  IF cardinality(lane_endpoints) > 0 THEN
    PERFORM outbox.advance_lanes(lane_endpoints, lane_keys, true);
  END IF;
  out_claimed := '{}';
  IF cardinality(born_ids) > 0 THEN
    out_claimed := outbox.born_running(born_ids, full_lanes);
  END IF;
  RETURN NEXT;
END
$$;

-- fan_out_claiming is a batch pass of fan_out that hands up to
-- in_claim_batch jobs to the relay's own workers (in_replica's, with
-- in_answered as the workers' claim takes it): the deliveries fan_out
-- made running as it inserted them or, when it made none so and the pass
-- enqueued jobs and was not full, a claim of due jobs (claim_due_jobs) in
-- the same transaction, after the fan-out, whose jobs it sees: a
-- subscriber's, an ordered lane's made due, a rate-limited endpoint's. A
-- pass that is not full is the relay keeping up, one to a few events a
-- pass: its deliveries start as they are made, where otherwise the
-- workers, woken after its commit, would claim them in a statement and a
-- commit of their own, a few milliseconds on every event's way to its
-- receiver. A full pass is a backlog, which the workers claim at their own
-- pace. A pass that made deliveries running claims nothing more: the
-- jobs it left are the workers' to claim, and the relay wakes them for
-- those (relay.go, drain).
DROP FUNCTION IF EXISTS outbox.fan_out_claiming(integer, jsonb, integer, double precision, text, integer, bigint, bigint[]);

CREATE FUNCTION outbox.fan_out_claiming(in_batch integer, in_subscribers jsonb, in_max_attempts integer,
                                        in_breaker_delay double precision, in_origin text,
                                        in_claim_batch integer, in_replica bigint, in_answered bigint[])
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_claimed outbox.claimed_job[])
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  SELECT f.out_fanned, f.out_jobs, f.out_claimed INTO out_fanned, out_jobs, out_claimed
  FROM outbox.fan_out(in_batch, NULL, in_subscribers, in_max_attempts, in_breaker_delay, in_origin,
                      in_claim_batch, in_replica, in_answered) AS f;
  IF cardinality(out_claimed) = 0 AND out_jobs > 0 AND out_fanned < in_batch AND in_claim_batch > 0 THEN
    out_claimed := ARRAY(SELECT c FROM outbox.claim_due_jobs(in_claim_batch, in_replica, in_answered) AS c);
  END IF;
  RETURN NEXT;
END
$$;

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
  -- outbox.events first, in the order a migration locks the tables
  -- (migrate.go, schemaTablesQuery): a completion in an ordered lane reads
  -- events after it updates jobs (advance_lanes).
  LOCK TABLE outbox.events IN ACCESS SHARE MODE;

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

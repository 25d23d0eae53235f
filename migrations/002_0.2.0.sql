-- 002_0.2.0.sql: from release 0.1.0 to 0.2.0.
--
-- migrate.go applies it in one transaction, except its CONCURRENTLY
-- index statements and constraint validations, which run after that
-- transaction, one at a time. Written before releases recorded their
-- migrations by number: every statement can run again over a database
-- that has part of it, as a build between two releases left it.

-- An event is written by the application, in the same transaction as the
-- business change it describes, through outbox.record() or a trigger that
-- outbox.watch() installed. Its life:
--
--   un-fanned  (fanned_out_at IS NULL, poisoned_at IS NULL): the backlog.
--              The relay claims it by row (never by cursor), enqueues one job
--              per subscriber and sets fanned_out_at, all in one transaction.
--   fanned     (fanned_out_at IS NOT NULL): its jobs carry it from here. Events
--              retention deletes it once it was fanned out longer ago than the
--              retention window and every job that references it is completed
--              (jobs read their event when they run; a discarded job may be
--              retried by hand, so it keeps its event until the job cleaner
--              removes it).
--   poisoned   (poisoned_at IS NOT NULL): the relay failed on this row
--              relay_attempts times; relay_error says why. Kept until requeued
--              (which clears poisoned_at and relay_attempts); never deleted.
--
-- The id orders events by insert, not by commit: a lower id can commit later.
-- That is why nothing reads this table with a cursor.
CREATE TABLE IF NOT EXISTS outbox.events (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic          text        NOT NULL,
  subject        text        NOT NULL DEFAULT '',
  payload        jsonb       NOT NULL DEFAULT '{}',
  -- When the event was recorded: the clock at the insert, not now(), the
  -- start of the producer's transaction, which may have begun long before
  -- (committed_at, below). Used for display, replays, the webhook's
  -- timestamp and latency where the commit's time is not known; never to
  -- decide what to relay.
  created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  fanned_out_at  timestamptz,
  relay_attempts integer     NOT NULL DEFAULT 0,
  relay_error    text,
  poisoned_at    timestamptz,

  CONSTRAINT events_topic_format CHECK (topic ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}$'),
  CONSTRAINT events_subject_length CHECK (length(subject) <= 500),
  -- 1 MiB: an event is a fact, not a file. A larger payload fails the
  -- business transaction at once rather than every delivery later.
  CONSTRAINT events_payload_size CHECK (pg_column_size(payload) <= 1048576),
  CONSTRAINT events_relay_attempts_nonnegative CHECK (relay_attempts >= 0),
  CONSTRAINT events_fanned_or_poisoned CHECK (fanned_out_at IS NULL OR poisoned_at IS NULL)
);

-- Databases created while created_at defaulted to now().
ALTER TABLE outbox.events ALTER COLUMN created_at SET DEFAULT clock_timestamp();

-- committed_at is when the recording transaction committed, as closely as
-- PostgreSQL tells: where the time from commit to first 2xx starts
-- (webhook.go). The insert cannot know it, so it starts NULL; the first
-- change outboxd makes to the row sets it with commit_time (below), and no
-- later change alters it. That change is the relay's claim
-- (mark_fanned_out), or before it a relay failure (relay.go) or a requeue
-- (outbox.go).
ALTER TABLE outbox.events
  ADD COLUMN IF NOT EXISTS committed_at timestamptz;

-- commit_time is what committed_at becomes at a change of event row ev,
-- whose xmin is ev_xmin, read before the change replaces it:
--   - the value it has, once set;
--   - for a row nobody changed since its insert, so that its xmin is the
--     recording transaction, that transaction's commit timestamp where
--     track_commit_timestamp is on (pg_xact_commit_timestamp raises an
--     error where it is off, and answers NULL for a transaction that
--     committed before it was turned on);
--   - else created_at, the clock at the insert: a lower bound, short of
--     the commit by whatever the transaction did after its insert.
-- A row changed without committed_at set (by a release before the column)
-- has relay_attempts or relay_error set, and gets created_at: its xmin
-- is the change's, not the recording's. VOLATILE, like
-- pg_xact_commit_timestamp, so that it can be inlined into the UPDATEs.
CREATE OR REPLACE FUNCTION outbox.commit_time(ev outbox.events, ev_xmin xid)
RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
  SELECT coalesce(
    ev.committed_at,
    CASE WHEN ev.relay_attempts = 0 AND ev.relay_error IS NULL
              AND current_setting('track_commit_timestamp')::boolean
         THEN pg_xact_commit_timestamp(ev_xmin)
    END,
    ev.created_at)
$$;

-- mark_fanned_out is the relay's claim (fan_out): it claims up to in_batch
-- events with claim_unfanned, or with in_event_id that one event if it is
-- still waiting, marks them fanned out, and returns what the fan-out reads
-- of them, in the caller's transaction. Marking them, it keeps each one's
-- commit time (commit_time): the UPDATE's expressions read the row as it
-- was, its xmin still the recording transaction's. enable_seqscan = off
-- has the UPDATE fetch the claimed rows by key, where a planner that
-- thinks index reads expensive (a high random_page_cost) would scan the
-- whole backlog for 200 rows.
--
-- The claim comes first, in a statement of its own: each statement of a
-- PL/pgSQL function sees the rows committed when it began, so the UPDATE
-- sees every row the claim locked. (The other way round, a claim made by a
-- function called from the UPDATE runs later than the UPDATE's snapshot
-- and can lock a row that the UPDATE does not see.)
DROP FUNCTION IF EXISTS outbox.mark_fanned_out(integer);

DROP FUNCTION IF EXISTS outbox.mark_fanned_out(integer, bigint);

CREATE FUNCTION outbox.mark_fanned_out(in_batch integer, in_event_id bigint)
RETURNS TABLE (id bigint, topic text, subject text, payload jsonb)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
  claimed bigint[];
BEGIN
  IF in_event_id IS NULL THEN
    claimed := ARRAY(SELECT outbox.claim_unfanned(in_batch));
  ELSE
    claimed := ARRAY(
      SELECT e.id
      FROM outbox.events AS e
      WHERE e.id = in_event_id
        AND e.fanned_out_at IS NULL
        AND e.poisoned_at IS NULL
      FOR UPDATE OF e SKIP LOCKED);
  END IF;
  RETURN QUERY
  UPDATE outbox.events AS e
  SET fanned_out_at = now(),
      committed_at = outbox.commit_time(e, e.xmin)
  WHERE e.id = ANY (claimed)
  RETURNING e.id, e.topic, e.subject, e.payload;
END
$$;

-- trace_context is the W3C Trace Context a recording stores, from the
-- traceparent and tracestate its transaction set: what is valid is kept,
-- the rest dropped or cut, as the specification has a receiver do, and
-- never an error. repairs names what it did, for outbox.record to count:
--
--   traceparent_dropped     not a traceparent: a version that is not two
--                           lower-case hex digits, version ff, version 00
--                           with anything but its four fields, an id of
--                           zeros, a later version shorter than 55
--                           characters. The trace restarts at the
--                           receiver; the tracestate goes with it.
--   traceparent_downgraded  a later version, read as 00 from its first 55
--                           characters when what follows them starts with
--                           '-': its ids and the sampled bit of its flags,
--                           the only flag 00 defines.
--   tracestate_dropped      not a list of key=value members, a key twice,
--                           or no traceparent to go with.
--   tracestate_truncated    more than 32 members, or more than 512
--                           characters: whole members dropped, members
--                           over 128 characters first, then from the end.
--
-- Blanks around a traceparent and around members are optional white space;
-- empty members are dropped. Members after the 32nd are not read: they
-- would go anyway.
--
-- Its cost is added to every traced recording, so it is written in string
-- functions (length, substr, translate) and regular expressions without
-- counted repetition: PostgreSQL's regular expression engine matches a
-- pattern such as [0-9a-f]{32} or [a-z]{0,255} ten to a hundred times
-- slower than one with * (measure: a count(*) over generate_series of
-- each pattern against one tracestate member).
CREATE OR REPLACE FUNCTION outbox.trace_context(in_traceparent text, in_tracestate text,
                                                OUT traceparent text, OUT tracestate text, OUT repairs text[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  members text[] := '{}';
  keys    text[] := '{}';
  m       text;
  eq      integer;
  i       integer;
BEGIN
  repairs := '{}';
  traceparent := nullif(btrim(in_traceparent, E' \t'), '');
  IF traceparent IS NOT NULL THEN
    -- Fields at 1, 4, 37 and 54, of lower-case hex, the ids not all zeros.
    IF length(traceparent) >= 55
       AND substr(traceparent, 3, 1) = '-' AND substr(traceparent, 36, 1) = '-' AND substr(traceparent, 53, 1) = '-'
       AND translate(left(traceparent, 2) || substr(traceparent, 4, 32) || substr(traceparent, 37, 16) || substr(traceparent, 54, 2),
                     '0123456789abcdef', '') = ''
       AND substr(traceparent, 4, 32) <> '00000000000000000000000000000000'
       AND substr(traceparent, 37, 16) <> '0000000000000000'
       AND left(traceparent, 2) <> 'ff'
       AND (length(traceparent) = 55 OR (left(traceparent, 2) <> '00' AND substr(traceparent, 56, 1) = '-')) THEN
      IF left(traceparent, 2) <> '00' THEN
        traceparent := '00-' || substr(traceparent, 4, 50) || '0'
                       || CASE WHEN strpos('13579bdf', substr(traceparent, 55, 1)) > 0 THEN '1' ELSE '0' END;
        repairs := repairs || 'traceparent_downgraded'::text;
      END IF;
    ELSE
      traceparent := NULL;
      repairs := repairs || 'traceparent_dropped'::text;
    END IF;
  END IF;

  IF coalesce(btrim(in_tracestate, E' \t,'), '') = '' THEN
    RETURN; -- no member
  END IF;
  IF traceparent IS NULL THEN
    repairs := repairs || 'tracestate_dropped'::text;
    RETURN;
  END IF;
  FOREACH m IN ARRAY array_remove(string_to_array(in_tracestate, ','), '') LOOP
    m := btrim(m, E' \t');
    CONTINUE WHEN m = '';
    IF cardinality(members) = 32 THEN
      repairs := repairs || 'tracestate_truncated'::text;
      EXIT;
    END IF;
    -- A key: a lower-case letter or digit, then up to 255 of a-z 0-9 _ - *
    -- / @. A value: 1 to 256 printable ASCII characters but , and =, not
    -- ending in a space.
    eq := strpos(m, '=');
    IF NOT (eq BETWEEN 2 AND 257 AND length(m) - eq BETWEEN 1 AND 256
            AND m ~ '^[a-z0-9][a-z0-9_*/@-]*=[\x20-\x2b\x2d-\x3c\x3e-\x7e]*[\x21-\x2b\x2d-\x3c\x3e-\x7e]$')
       OR left(m, eq - 1) = ANY (keys) THEN
      repairs := repairs || 'tracestate_dropped'::text;
      RETURN;
    END IF;
    keys := keys || left(m, eq - 1);
    members := members || m;
  END LOOP;
  -- Over 512 characters: whole members go, the last of those over 128
  -- characters first, then the last.
  WHILE length(array_to_string(members, ',')) > 512 LOOP
    i := coalesce(
      (SELECT max(u.n) FROM unnest(members) WITH ORDINALITY AS u(member, n) WHERE length(u.member) > 128),
      cardinality(members));
    members := members[:i - 1] || members[i + 1:];
    IF NOT 'tracestate_truncated' = ANY (repairs) THEN
      repairs := repairs || 'tracestate_truncated'::text;
    END IF;
  END LOOP;
  tracestate := array_to_string(members, ',');
END
$$;

-- Trace context repaired is counted in one sequence per repair that
-- trace_context names, read by /metrics (outbox.go, readTraceRepairs):
-- nextval neither waits for nor holds up another transaction, and the
-- recording that repairs nothing never calls it. A sequence counts outside
-- transactions, so a repair counts even if its recording rolls back, and
-- after a crash a count may jump ahead by up to 32 (PostgreSQL logs a
-- sequence's values 32 ahead).
CREATE SEQUENCE IF NOT EXISTS outbox.trace_repairs_traceparent_dropped;

CREATE SEQUENCE IF NOT EXISTS outbox.trace_repairs_traceparent_downgraded;

CREATE SEQUENCE IF NOT EXISTS outbox.trace_repairs_tracestate_dropped;

CREATE SEQUENCE IF NOT EXISTS outbox.trace_repairs_tracestate_truncated;

-- record is the producer API. Call it inside the transaction that makes the
-- business change: the event exists if and only if that transaction commits.
--
--   BEGIN;
--   UPDATE orders SET status = 'paid' WHERE id = 42;
--   SELECT outbox.record('order.paid', '42', '{"amount": 1200}');
--   COMMIT;
--
-- It runs with the rights of its owner, outboxd's role (SECURITY DEFINER),
-- so an application role needs only EXECUTE on it, not INSERT on events,
-- and can record without reading or changing any of outboxd's tables. Its
-- search_path is pinned: no object of a caller's schema can stand in for
-- one it uses. EXECUTE is revoked from PUBLIC below, so only the roles
-- granted it can record (docs/security.md, database privileges).
--
-- The transaction's trace context, if it set one, goes through
-- trace_context, and each repair it made is counted; a recording without
-- one reads the two settings and nothing more.
--
-- PL/pgSQL, not SQL: PostgreSQL plans a SQL function's statement anew at
-- every call (a function with SECURITY DEFINER or SET is never inlined),
-- and keeps a PL/pgSQL function's plan for the session. In the producer's
-- transaction that planning is about a fifth of what a record costs.
CREATE OR REPLACE FUNCTION outbox.record(topic text, subject text, payload jsonb)
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
  INSERT INTO outbox.events (topic, subject, payload, traceparent, tracestate)
  VALUES (record.topic, coalesce(record.subject, ''), coalesce(record.payload, '{}'), tp, ts)
  RETURNING events.id INTO recorded_id;
  RETURN recorded_id;
END
$$;

-- One row per Idempotency-Key a POST /api/events carried (outbox.go,
-- recordEventOnce): the key, a SHA-256 of the request it came with
-- (topic, subject and payload) and the event it recorded. The row and its
-- event are written in one transaction, so a crash keeps both or neither;
-- a later request with the key finds the row and records nothing: the
-- same request is answered the event's id, another is refused. The
-- primary key makes concurrent requests with one key record one event:
-- the second insert waits for the first's transaction and, once that
-- commits, inserts nothing (its own event rolls back with it).
--
-- The retention sweep deletes rows older than events retention
-- (retention.go, after the events, in batches), so a key answers for as
-- long as events retention promises. No foreign key to outbox.events, as
-- for the inbox: events are pruned first, and a key that outlives its
-- event answers the id and records nothing, the safe direction.
CREATE TABLE IF NOT EXISTS outbox.idempotency_keys (
  key            text        PRIMARY KEY,
  request_digest bytea       NOT NULL,
  event_id       bigint      NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT idempotency_keys_key_length CHECK (length(key) BETWEEN 1 AND 255),
  CONSTRAINT idempotency_keys_request_digest_length CHECK (length(request_digest) = 32)
);

-- Serves the retention sweep's oldest-first delete.
CREATE INDEX IF NOT EXISTS idempotency_keys_by_created_at
  ON outbox.idempotency_keys (created_at);

-- claim_due_jobs is the workers' claim (claim.go). It takes up to batch due
-- jobs, marks them running with their next attempt number, and returns
-- each with its event and, for a delivery, its endpoint as it is at the
-- claim, so an attempt costs no second query.
--
-- Every endpoint is a lane, and so are the jobs of no endpoint (in-process
-- subscribers and outboxd's own, which have no receiver to protect).
-- Workers are shared between the lanes that have due work, round robin:
-- every lane gets its first job before any gets a second, and lanes whose
-- oldest due job has waited longest come first. An endpoint's lane takes
-- at most its room:
--
--   room = its cap (max_in_flight; 1 while its breaker is open)
--          - its deliveries running now, on any replica
--   and, under a rate limit, no more requests than fit before now + 1 s
--   at 1/rate apart (start_in_ms says when each one may start).
--
-- Inside an endpoint's lane, replayed deliveries (replay_id set) are a
-- lane of their own, behind the live ones: a lane takes its live due jobs
-- first, and replayed ones only with the room they leave, and never more
-- than replay_width(endpoint, max_in_flight) replayed ones running at
-- once: its share of the cap, or one while live deliveries flow. Behind
-- every endpoint's live ones too: endpoints with live work due are served
-- before those with replayed work alone, however long that has waited,
-- and of the jobs the lanes lock, the claim takes every live one before
-- any replayed one. A replay alone runs at its share, not at the
-- endpoint's cap: live deliveries arriving meanwhile find the rest of the
-- cap free, without waiting for replayed requests to end.
--
-- A paused or held endpoint has no room. A disabled one (whose jobs end
-- without a request) has no cap: nothing is sent. Replicas respect one cap
-- because the claims of an endpoint's jobs take turns: the first statement
-- takes a transaction-scoped advisory lock per lane it will serve, and
-- skips a lane another replica holds (pg_try_advisory_xact_lock: released
-- at commit, so safe on pooled connections; the key pair's class keeps it
-- apart from outboxd's other, single-key locks). The second statement
-- counts the running jobs in a snapshot taken after those locks were
-- granted, so it sees every job the previous holder claimed. (A first
-- version locked the endpoint row FOR NO KEY UPDATE instead: a row lock on
-- every claim, written to the table and shared with fan-out's foreign-key
-- locks of the same row as a multixact.)
--
-- Cost: two index probes per endpoint with waiting jobs (a loose scan of
-- jobs_waiting_live_by_endpoint and one of jobs_waiting_replay_by_endpoint),
-- then at most room jobs per lane, however many are waiting.
-- enable_sort = off keeps every lane's read in index order, stopping after
-- its room; enable_seqscan = off fetches claimed rows and their events by
-- key. Without them a planner that underestimates the due jobs (a table
-- not analyzed since a bulk fan-out) reads every due job and sorts them on
-- every claim. The few sorts left (of lanes and of the jobs locked, not of
-- the jobs waiting) then look as costly as the settings make them, and
-- jit = off keeps that cost from compiling the statement, which would
-- take longer than the claim. enable_bitmapscan = off makes the counts of an endpoint's running
-- jobs plain index scans: a bitmap scan visits the heap for every entry
-- of jobs_running_by_endpoint, dead ones included, and never marks them
-- dead in the index, so between two vacuums each count read more heap
-- pages (407 entries and 82 pages for one running job, a few minutes into
-- a replay beside live traffic, auto_explain); a plain index scan marks
-- the entries whose rows are dead to every snapshot, and the next count
-- skips them. The plan is made once per session (force_generic_plan): the
-- shape these settings leave does not depend on the batch or the lanes,
-- and planning the second statement anew for every claim doubled its
-- cost.
--
-- Claim, update and the reads of events and endpoints in the second
-- statement share its snapshot: a job it can see was fanned out by a
-- committed transaction, whose event it can see too.
--
-- replica is the claiming process's row in outbox.replicas (replicas.go):
-- every job claimed records it in held_by, so that when that replica stops
-- heartbeating its jobs are rescued at once rather than after the rescue
-- horizon (rescue.go). The claim first locks that row FOR KEY SHARE and
-- fails with SQLSTATE OXR01 if it is gone: the replica was declared dead,
-- its jobs rescued, and it must not claim under that id again. The lock
-- makes the declaration (which deletes the row) wait for a claim in
-- flight, so no claim commits behind the rescue of its replica's jobs.
-- NULL: the jobs are held by no one known, and only the horizon rescues
-- them (the default: tests and an operator's psql claim this way).
--
-- answered are deliveries of the claiming replica whose attempt has
-- succeeded and whose outcome its completer has not written yet
-- (claim.go, answeredJobs). They are still running in the table,
-- but hold no request to their endpoint any more, so its max_in_flight
-- does not count them: a delivery holds its place for its request, not
-- for the wait for a batch of outcomes to commit. (A failed attempt keeps
-- its place until its outcome, and what it does to the endpoint, is
-- written.) Another replica's claims count them until their outcome is
-- written, which delays, never overloads.
--
-- claimed_job is a claimed job as the workers run it: the job, its event
-- and, for a delivery, its endpoint; start_in_ms is its place in its
-- endpoint's rate limit, wake_on_outcome and replay_yields what its end
-- must do for the next claim (below). resend_window_seconds is, for a
-- delivery that may have reached its receiver before (an earlier attempt,
-- or a replay's), the dedup window the receiver advertised (NULL: none,
-- or a first delivery), and claimed_at the claim's now(), the clock of
-- created_at: a resend past the window is not sent (resend.go,
-- resendTooLate). committed_at is the event's commit time as the relay
-- kept it (events.committed_at), or its created_at where none was kept:
-- where the time to the first 2xx starts. claim_due_jobs returns it, and
-- fan_out_claiming an array of it; the workers read it as one column list
-- (claim.go, claimedColumns), by name. A later release adds attributes at
-- its end (ALTER TYPE ... ADD ATTRIBUTE), so that a previous release's
-- reads stay as they were.
DO $$
BEGIN
  IF to_regtype('outbox.claimed_job') IS NULL THEN
    CREATE TYPE outbox.claimed_job AS (
      id bigint, kind text, attempt integer, max_attempts integer,
      endpoint_id bigint,
      event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
      traceparent text, tracestate text,
      url text, secret bytea, previous_secret bytea, disabled_reason text,
      start_in_ms integer, wake_on_outcome boolean, replay_yields boolean,
      resend_window_seconds bigint, claimed_at timestamptz, committed_at timestamptz);
  END IF;
END
$$;

DROP FUNCTION IF EXISTS outbox.claim_due_jobs(integer, bigint, bigint[]);

CREATE FUNCTION outbox.claim_due_jobs(batch integer, replica bigint DEFAULT NULL, answered bigint[] DEFAULT '{}')
RETURNS SETOF outbox.claimed_job
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
        AND (SELECT count(*) FROM outbox.jobs AS r
             WHERE r.endpoint_id = ep.id AND r.state = 'running' AND r.id <> ALL (answered))
            < CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END
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
                    CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END
                      - (SELECT count(*) FROM outbox.jobs AS r
                         WHERE r.endpoint_id = ep.id AND r.state = 'running'
                           AND r.id <> ALL (answered))::integer,
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
           lf.live AS narrowed
    FROM unnest(lanes) WITH ORDINALITY AS l(id, lane_order)
    JOIN outbox.endpoints AS ep ON ep.id = l.id
    -- The width of replay_width, asked once: OFFSET 0 keeps the subquery
    -- whole, where flattened each use of live would call the function.
    CROSS JOIN LATERAL (SELECT outbox.live_flows(ep.id) AS live OFFSET 0) AS lf
  ),
  -- Each lane's due jobs, locked, in due order: the live ones first, up
  -- to its room; then the replayed ones, in the room the live ones left
  -- and the replay lane's. Two steps, each materialized: the replayed
  -- ones' limit reads how many live ones were locked, which must not read
  -- them a second time.
  live_jobs AS MATERIALIZED (
    SELECT l.id, l.lane_order, l.room, l.replay_room, l.narrowed, ARRAY(
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
    SELECT lj.id, lj.lane_order, lj.room, lj.replay_room, lj.narrowed, lj.ids AS live_ids, ARRAY(
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
    SELECT lj.id, lj.narrowed,
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
  SELECT c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id,
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
         coalesce(e.committed_at, e.created_at)
  FROM claimed AS c
  JOIN outbox.events AS e ON e.id = c.event_id
  CROSS JOIN subscribers_filled AS sf
  LEFT JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
  LEFT JOIN paced AS p ON p.id = c.id
  LEFT JOIN filled AS fl ON fl.id = c.endpoint_id;
END
$$;

-- fan_out is the relay's transaction (relay.go): it claims and marks
-- events, then enqueues one job per (event, matching subscriber) and one
-- webhook job per (event, enabled endpoint whose topics match), in one
-- statement, one round trip and one transaction. With in_event_id NULL it
-- claims a batch of up to in_batch events (mark_fanned_out); with an id,
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
--
-- A coalescing subscriber gets one job per topic and subject of the batch,
-- for its highest event id (DISTINCT ON keeps the first row of each (kind,
-- topic, subject) in the ORDER BY, id descending). Webhooks are never
-- coalesced: each event is a fact. Inserts go in id order, so the job
-- table's indexes grow at their right edge.
--
-- Each endpoint's deliveries are counted for its statistics (fanout_stats)
-- in endpoint order: relays adding to the same minute's rows lock them in
-- one order. The row also keeps when the last of them was fanned out, which
-- narrows the endpoint's replay lane while live deliveries flow
-- (replay_width). The subject index (subjects) is kept here too, in the
-- transaction that marks the events fanned out: as a job per subject it
-- would cost an insert, a claim and a completion, each a new row version
-- in every index of the job table.
--
-- Then the ordered lanes that got deliveries advance (advance_lanes), so a
-- delivery is never held behind nothing. The commit does not wait for the
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
  lane_endpoints bigint[];
  lane_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  IF in_origin <> '' THEN
    PERFORM set_config('outbox.relay_origin', in_origin, true);
  END IF;
  WITH marked AS (
    SELECT m.id, m.topic, m.subject, m.payload
    FROM outbox.mark_fanned_out(in_batch, in_event_id) AS m
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
    SELECT ep.id AS endpoint_id, ep.breaker_opened_at, ep.ordering, t.topic
    FROM outbox.endpoints AS ep
    JOIN topics AS t ON outbox.topic_matches(ep.topics, t.topic)
    WHERE ep.disabled_at IS NULL
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
    SELECT 'webhook', m.id, es.endpoint_id, in_max_attempts,
           CASE WHEN es.ordering = 'subject' THEN 'infinity'
                WHEN es.breaker_opened_at IS NULL THEN now()
                ELSE now() + make_interval(secs => in_breaker_delay) END,
           CASE WHEN es.ordering = 'subject' THEN m.subject END
    FROM marked AS m
    JOIN endpoint_subscriptions AS es ON es.topic = m.topic
    ORDER BY m.id, es.endpoint_id
    RETURNING endpoint_id, lane_key
  ),
  lanes AS (
    SELECT DISTINCT w.endpoint_id, w.lane_key FROM webhooks AS w WHERE w.lane_key IS NOT NULL
  ),
  produced AS (
    INSERT INTO outbox.fanout_stats AS f (endpoint_id, minute, deliveries, last_fanned_at)
    SELECT w.endpoint_id, date_trunc('minute', now()), count(*), now()
    FROM webhooks AS w
    GROUP BY w.endpoint_id
    ORDER BY w.endpoint_id
    ON CONFLICT (endpoint_id, minute) DO UPDATE
    SET deliveries = f.deliveries + EXCLUDED.deliveries,
        last_fanned_at = EXCLUDED.last_fanned_at
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

-- fan_out_claiming is a batch pass of fan_out and, in the same
-- transaction, a claim of up to in_claim_batch due jobs for the relay's
-- own workers (claim_due_jobs, with in_replica and in_answered), when the pass
-- enqueued jobs and was not full. A pass that is not full is the relay
-- keeping up, one to a few events a pass: its deliveries are claimed as
-- they are made, where otherwise the workers, woken after its commit, would
-- claim them in a statement and a commit of their own, a few milliseconds
-- on every event's way to its receiver. A full pass is a backlog, which
-- the workers claim at their own pace. The claim sees the pass's jobs: it
-- runs after it, in the same transaction.
DROP FUNCTION IF EXISTS outbox.fan_out_claiming(integer, jsonb, integer, double precision, text, integer, bigint, bigint[]);

CREATE FUNCTION outbox.fan_out_claiming(in_batch integer, in_subscribers jsonb, in_max_attempts integer,
                                        in_breaker_delay double precision, in_origin text,
                                        in_claim_batch integer, in_replica bigint, in_answered bigint[])
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_claimed outbox.claimed_job[])
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  SELECT f.out_fanned, f.out_jobs INTO out_fanned, out_jobs
  FROM outbox.fan_out(in_batch, NULL, in_subscribers, in_max_attempts, in_breaker_delay, in_origin) AS f;
  out_claimed := '{}';
  IF out_jobs > 0 AND out_fanned < in_batch AND in_claim_batch > 0 THEN
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
--     changes nothing;
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
    SET state = o.state::outbox.job_state,
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

-- The admin token the sessions above were signed in under, known by a
-- fingerprint (its HMAC of a fixed text, admin.go): one row. A session's
-- HMAC holds only for the token it was made under, but a token that comes
-- back would bring its sessions back with it; so a start with a token
-- other than the one recorded deletes every session, in the statement
-- that records the new one. A start with the same token keeps them.
CREATE TABLE IF NOT EXISTS outbox.panel_session_token (
  only_row    boolean     PRIMARY KEY DEFAULT true,
  fingerprint bytea       NOT NULL,
  changed_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT panel_session_token_one_row CHECK (only_row),
  CONSTRAINT panel_session_token_fingerprint_length CHECK (length(fingerprint) = 32)
);

-- One row per running outboxd process (replicas.go), so that replicas know
-- of each other: the overview lists them, and the jobs of one that died
-- are rescued within seconds instead of the rescue horizon. Its life:
--
--   register    at start, a new row and a new id: a restart, or a process
--               that finds itself declared dead and registers again, is a
--               new replica, and never claims under an id it lost.
--   heartbeat   last_seen = now() every -replica-heartbeat (3 s), with
--               what it does (swept_at: its retention sweeper's last
--               cycle, if it ran one).
--   dead        last_seen older than its own dead_after (-replica-dead-after,
--               15 s, which the process states when it registers, so that
--               replicas configured differently judge each one by its own
--               promise): any live replica deletes the row and rescues the
--               jobs it held in the same transaction (rescue.go).
--   clean stop  the process deletes its row after its workers have
--               stopped, rescuing whatever it still held the same way.
--
-- Every time is the database's clock, never a process's. Bounded: one row
-- per running process, plus rows of processes dead for less than their
-- dead_after and a heartbeat; dead rows left when no replica runs are
-- deleted by the first one that starts.
CREATE TABLE IF NOT EXISTS outbox.replicas (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  host       text        NOT NULL,
  pid        integer     NOT NULL,
  -- The release (version.go) and the VCS revision it was built from
  -- ('' when unknown): with schema_version (below), what the overview
  -- compares to flag replicas of different builds.
  version    text        NOT NULL,
  revision   text        NOT NULL DEFAULT '',
  -- What it runs: every replica relays, runs workers and may sweep; these
  -- say how many job slots (-workers), whether it LISTENs (off with
  -- -disable-listen) and when its sweeper last held the retention lock.
  workers    integer     NOT NULL,
  listens    boolean     NOT NULL,
  swept_at   timestamptz,
  dead_after interval    NOT NULL,
  started_at timestamptz NOT NULL DEFAULT now(),
  last_seen  timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT replicas_host_length CHECK (length(host) <= 255),
  CONSTRAINT replicas_version_length CHECK (length(version) BETWEEN 1 AND 100 AND length(revision) <= 100),
  CONSTRAINT replicas_workers_nonnegative CHECK (workers >= 0),
  CONSTRAINT replicas_dead_after_positive CHECK (dead_after > interval '0')
);

-- What else tells builds and processes apart, added after the table (a
-- release before them inserts rows without them, and gets the defaults):
--
--   schema_version  the schema its binary carries: the start of the
--                   checksum of schema.sql and schema_indexes.sql
--                   (migrate.go), '' from a release that did not record
--                   it. Two builds of one release and revision differ
--                   here when one was built from a tree whose schema
--                   files were changed; replicas whose schemas differ are
--                   a roll under way.
--   pid_namespace   the kernel boot and the pid namespace its pid is a
--                   number of ('' when unknown, off Linux): only a process
--                   of the same boot and namespace can look that pid up.
--   pid_start       when that process started, in clock ticks after boot
--                   (NULL when unknown): a pid used again by a later
--                   process has a later start.
--
-- With the last two, a replica starting on the same host declares dead at
-- once a registration whose process is gone (rescue.go), instead of
-- waiting out its dead_after: a restart after a crash rescues its
-- predecessor's jobs as it starts.
ALTER TABLE outbox.replicas
  ADD COLUMN IF NOT EXISTS schema_version text NOT NULL DEFAULT '',
  ADD COLUMN IF NOT EXISTS pid_namespace text NOT NULL DEFAULT '',
  ADD COLUMN IF NOT EXISTS pid_start bigint;

DO $$
BEGIN
  ALTER TABLE outbox.replicas
    ADD CONSTRAINT replicas_schema_version_length CHECK (length(schema_version) <= 64),
    ADD CONSTRAINT replicas_pid_namespace_length CHECK (length(pid_namespace) <= 200);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- 0.1.0's claim (deliver.go, claimJobsSQL), which its own
-- fan_out_and_claim also calls from its body, selecting every column: a
-- call that began before this file committed runs its body's statements
-- after, against this schema, so the function keeps 0.1.0's name and
-- exactly 0.1.0's columns, while this release's workers call
-- claim_due_jobs.
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer, bigint, bigint[]);

CREATE FUNCTION outbox.claim_jobs(batch integer, replica bigint, answered bigint[])
RETURNS TABLE (id bigint, kind text, attempt integer, max_attempts integer,
               endpoint_id bigint,
               event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
               traceparent text, tracestate text,
               url text, secret bytea, previous_secret bytea, disabled_reason text,
               start_in_ms integer, wake_on_outcome boolean, replay_yields boolean)
LANGUAGE sql VOLATILE
ROWS 100
AS $$
  SELECT c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id,
         c.event_id, c.topic, c.subject, c.payload, c.created_at,
         c.traceparent, c.tracestate,
         c.url, c.secret, c.previous_secret, c.disabled_reason,
         c.start_in_ms, c.wake_on_outcome, c.replay_yields
  FROM outbox.claim_due_jobs(batch, replica, answered) AS c
$$;

-- 0.1.0's claim of a batch of events, which its own fan_out calls from its
-- body: a call of 0.1.0's fan_out or fan_out_and_claim that began before
-- this file committed (waiting for a lock this file's transaction held)
-- runs its body's statements after, against this schema.
DROP FUNCTION IF EXISTS outbox.mark_fanned_out(integer);

CREATE FUNCTION outbox.mark_fanned_out(in_batch integer)
RETURNS TABLE (id bigint, topic text, subject text, payload jsonb)
LANGUAGE sql VOLATILE
AS $$
  SELECT m.id, m.topic, m.subject, m.payload
  FROM outbox.mark_fanned_out(in_batch, NULL) AS m
$$;

-- 0.1.0's relay pass of a batch (relay.go, relayBatchSQL): fan_out without
-- the event id.
DROP FUNCTION IF EXISTS outbox.fan_out(integer, jsonb, integer, double precision, text);

CREATE FUNCTION outbox.fan_out(in_batch integer, in_subscribers jsonb, in_max_attempts integer,
                               in_breaker_delay double precision, in_origin text)
RETURNS TABLE (out_fanned bigint, out_jobs bigint)
LANGUAGE sql VOLATILE
AS $$
  SELECT f.out_fanned, f.out_jobs
  FROM outbox.fan_out(in_batch, NULL, in_subscribers, in_max_attempts, in_breaker_delay, in_origin) AS f
$$;

-- 0.1.0's row-by-row retry after a batch failed (relay.go, relayRowSQL):
-- fan_out of that one event.
DROP FUNCTION IF EXISTS outbox.fan_out_event(bigint, jsonb, integer, double precision, text);

CREATE FUNCTION outbox.fan_out_event(in_event_id bigint, in_subscribers jsonb, in_max_attempts integer,
                                     in_breaker_delay double precision, in_origin text)
RETURNS TABLE (out_fanned bigint, out_jobs bigint)
LANGUAGE sql VOLATILE
AS $$
  SELECT f.out_fanned, f.out_jobs
  FROM outbox.fan_out(1, in_event_id, in_subscribers, in_max_attempts, in_breaker_delay, in_origin) AS f
$$;

-- 0.1.0's pass that claims for its workers (relay.go, relayClaimSQL):
-- fan_out_claiming, with a row per claimed job, each carrying the pass's
-- counts, and one row of counts and NULLs when it claimed none.
DROP FUNCTION IF EXISTS outbox.fan_out_and_claim(integer, jsonb, integer, double precision, text, integer, bigint, bigint[]);

CREATE FUNCTION outbox.fan_out_and_claim(in_batch integer, in_subscribers jsonb, in_max_attempts integer,
                                         in_breaker_delay double precision, in_origin text,
                                         in_claim_batch integer, in_replica bigint, in_answered bigint[])
RETURNS TABLE (out_fanned bigint, out_jobs bigint,
               id bigint, kind text, attempt integer, max_attempts integer,
               endpoint_id bigint,
               event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
               traceparent text, tracestate text,
               url text, secret bytea, previous_secret bytea, disabled_reason text,
               start_in_ms integer, wake_on_outcome boolean, replay_yields boolean)
LANGUAGE sql VOLATILE
AS $$
  SELECT p.out_fanned, p.out_jobs,
         c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id,
         c.event_id, c.topic, c.subject, c.payload, c.created_at,
         c.traceparent, c.tracestate,
         c.url, c.secret, c.previous_secret, c.disabled_reason,
         c.start_in_ms, c.wake_on_outcome, c.replay_yields
  FROM outbox.fan_out_claiming(in_batch, in_subscribers, in_max_attempts, in_breaker_delay, in_origin,
                               in_claim_batch, in_replica, in_answered) AS p
  LEFT JOIN LATERAL unnest(p.out_claimed) AS c ON true
$$;

-- 0.1.0's completer (outcome.go, recordOutcomesSQL): a batch of outcomes
-- as 27 parallel arrays, made into record_outcomes' rows. Its "none" for a
-- status code and a duration kept on a job is -1 where the rows say null;
-- a 0 status or endpoint in an attempt means none in both.
DROP FUNCTION IF EXISTS outbox.record_outcomes(bigint[], integer[], text[], bigint[], text[], integer[], integer[],
  bigint[], integer[], bigint[], integer[], integer[], text[], text[], boolean[], text[], bigint[], integer[], integer,
  bigint[], boolean[], integer[], bigint[], integer, bigint[], bigint[], bigint[]);

CREATE FUNCTION outbox.record_outcomes(
  in_ids bigint[], in_attempts integer[], in_states text[], in_delays bigint[], in_errors text[],
  in_statuses integer[], in_durations integer[],
  in_attempt_job_ids bigint[], in_attempt_numbers integer[], in_attempt_endpoints bigint[],
  in_attempt_durations integer[], in_attempt_statuses integer[], in_attempt_errors text[],
  in_attempt_excerpts text[], in_attempt_kept boolean[], in_attempt_classes text[],
  in_attempt_minutes bigint[], in_attempt_buckets integer[], in_buckets integer,
  in_health_ids bigint[], in_health_succeeded boolean[], in_health_failures integer[], in_health_holds bigint[],
  in_breaker_threshold integer, in_gone_ids bigint[], in_window_ids bigint[], in_window_seconds bigint[])
RETURNS void
LANGUAGE sql VOLATILE
AS $$
  SELECT outbox.record_outcomes(
    (SELECT coalesce(json_agg(o ORDER BY o.i), '[]')
     FROM (SELECT u.i, u.id, u.attempt, u.state, u.delay_ms, u.error,
                  nullif(u.status_code, -1) AS status_code, nullif(u.duration_ms, -1) AS duration_ms
           FROM unnest(in_ids, in_attempts, in_states, in_delays, in_errors, in_statuses, in_durations)
                WITH ORDINALITY AS u(id, attempt, state, delay_ms, error, status_code, duration_ms, i)) AS o),
    (SELECT coalesce(json_agg(a ORDER BY a.i), '[]')
     FROM unnest(in_attempt_job_ids, in_attempt_numbers, in_attempt_endpoints, in_attempt_durations,
                 in_attempt_statuses, in_attempt_errors, in_attempt_excerpts, in_attempt_kept,
                 in_attempt_classes, in_attempt_minutes, in_attempt_buckets)
          WITH ORDINALITY AS a(job_id, attempt, endpoint_id, duration_ms, status_code, error, excerpt, kept,
                               class, minute, bucket, i)),
    (SELECT coalesce(json_agg(h ORDER BY h.i), '[]')
     FROM unnest(in_health_ids, in_health_succeeded, in_health_failures, in_health_holds)
          WITH ORDINALITY AS h(id, succeeded, failures, hold_ms, i)),
    coalesce(in_gone_ids, '{}'),
    (SELECT coalesce(json_agg(w ORDER BY w.i), '[]')
     FROM unnest(in_window_ids, in_window_seconds) WITH ORDINALITY AS w(id, seconds, i)),
    in_breaker_threshold, in_buckets)
$$;

-- The claims of builds before 0.1.0's last: 0.1.0 kept them, nothing calls them.
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer);
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer, bigint);

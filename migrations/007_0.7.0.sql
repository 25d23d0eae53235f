-- 007_0.7.0.sql: from release 0.6.0 to 0.7.0.
--
-- One route for a delivery: the relay only fans out, and the workers'
-- claim is the one way a job starts. Gone: deliveries inserted running by
-- the relay's pass and the claim it made for its own workers
-- (fan_out_claiming). The workers' claim, claim_lane_jobs, is written in
-- named parts (waiting_lanes, lane_room, due_lanes, lock_due_jobs,
-- lane_jobs), and its claim ahead of a healthy endpoint's requests is one
-- rule in lane_room; claim_due_jobs stays its form without ahead, as
-- 0.6.0 has it. The fan-out is written in parts too (route,
-- enqueue_deliveries, enqueue_for_subscribers, index_subjects), and one
-- index holds each endpoint's waiting deliveries, live before replayed,
-- where two did.
--
-- claim_lane_jobs keeps 0.6.0's signature and row type
-- (claimed_lane_job), so 0.6.0's replicas, while they roll, call the
-- same claim as this release's. Kept for them alone: fan_out_claiming,
-- which now claims nothing for their workers; it goes in the next
-- release's migration, with the functions 0.6.0's fan-out called
-- (born_running, lock_born_lanes, has_due_live_jobs,
-- takes_deliveries_running), which a pass of 0.6.0 under way as this
-- migration commits still calls. Jobs hold only work to do: a delivered
-- job leaves outbox.jobs for the history, outbox.deliveries (below).
-- Dropped: outbox.schema_applied, which only 0.5.0 read. Every statement
-- can run again over a database that has what it made.

DROP TABLE IF EXISTS outbox.schema_applied;

-- The history: outbox.deliveries keeps every attempt of a job that
-- ended, the one that completed it included, with the job's event, kind,
-- endpoint and replay, what the attempt left its job, and when its claim
-- took it; a job that completes leaves outbox.jobs in the transaction
-- that writes its attempt here (finish_jobs). The rows the release before
-- kept, its jobs' failed attempts, are given their job's columns here. Its
-- completed jobs stay in the queue until the job cleaner deletes them,
-- 24 h after they completed, and every reader counts them as delivered.
ALTER TABLE outbox.deliveries DROP CONSTRAINT IF EXISTS deliveries_job_id_fkey;
ALTER TABLE outbox.owner_notify_slots DROP CONSTRAINT IF EXISTS owner_notify_slots_job_id_fkey;
ALTER TABLE outbox.deliveries
  ADD COLUMN IF NOT EXISTS event_id bigint,
  ADD COLUMN IF NOT EXISTS kind text,
  ADD COLUMN IF NOT EXISTS replay_id bigint,
  ADD COLUMN IF NOT EXISTS outcome outbox.job_state,
  ADD COLUMN IF NOT EXISTS attempted_at timestamptz;
UPDATE outbox.deliveries AS d
SET event_id = j.event_id,
    kind = j.kind,
    replay_id = j.replay_id,
    outcome = CASE WHEN d.attempt = j.attempt AND j.state IN ('completed', 'discarded') THEN j.state
                   WHEN d.status_code BETWEEN 200 AND 299 AND d.error = '' THEN NULL
                   ELSE 'retryable' END
FROM outbox.jobs AS j
WHERE j.id = d.job_id
  AND d.event_id IS NULL;
ALTER TABLE outbox.deliveries
  ALTER COLUMN event_id SET NOT NULL,
  ALTER COLUMN kind SET NOT NULL;
ALTER TABLE outbox.deliveries DROP CONSTRAINT IF EXISTS deliveries_outcome_final;
ALTER TABLE outbox.deliveries
  ADD CONSTRAINT deliveries_outcome_final CHECK (outcome IN ('completed', 'retryable', 'discarded'));

DROP FUNCTION IF EXISTS outbox.fan_out(integer, bigint, jsonb, integer, double precision, text, integer, bigint, bigint[], integer);
DROP FUNCTION IF EXISTS outbox.mark_claimed_fanned_out(bigint[]);

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
RETURNS SETOF outbox.events
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
BEGIN
  RETURN QUERY
  UPDATE outbox.events AS e
  SET fanned_out_at = now(),
      committed_at = outbox.commit_time(e, e.xmin)
  WHERE e.id = ANY (in_claimed)
  RETURNING e.*;
END
$$;

-- fan_out is the relay's transaction (relay.go): it claims and marks a
-- batch of events, then enqueues one job per (event, subscribing
-- in-process subscriber) and one delivery per (event, subscribing
-- endpoint), keeps the subject index, and advances the ordered lanes the
-- batch reaches; one call, one round trip, one transaction. With
-- in_event_id NULL it claims up to in_batch events (claim_to_fan_out);
-- with an id, that one event, for the row-by-row retry after a batch
-- failed (another relay may have relayed it meanwhile, and then it claims
-- nothing).
--
-- in_subscribers are the subscribers as JSON ([{"kind", "topics",
-- "per_subject"}]), in_max_attempts the jobs' max attempts, and
-- in_breaker_delay how far out (seconds) an endpoint's new deliveries are
-- scheduled while its circuit breaker is open. in_origin names the
-- process whose relay runs it, for the workers' NOTIFY (notify_jobs; ''
-- for none).
--
-- The claim is a statement of its own, before the ones that read the
-- endpoints: each statement of a PL/pgSQL function sees the rows
-- committed when it began, so the endpoints are read as they were after
-- the claim, and every endpoint committed before an event it claimed gets
-- the event. The claimed rows are read once, by the UPDATE that marks
-- them (mark_claimed_fanned_out), and handed to each part as an array.
-- Then the ordered lanes advance (advance_lanes), so a delivery is never
-- held behind nothing: those that got a delivery, and those whose event
-- the filter kept out, behind which advance_lanes held a later event of
-- the subject while this one waited to be fanned out.
--
-- The commit does not wait for the WAL to reach the disk: a crash before
-- the flush rolls the transaction back whole, and the events are claimed
-- again (database.go, beginPipelineTx, says why that loses nothing). The
-- parameters are named in_*, so that no name in a statement can be taken
-- for one of them; the plans are kept for the session
-- (force_generic_plan), the statements being the same every pass.
CREATE OR REPLACE FUNCTION outbox.fan_out(in_batch integer, in_event_id bigint, in_subscribers jsonb,
                               in_max_attempts integer, in_breaker_delay double precision, in_origin text)
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
  claimed := outbox.claim_to_fan_out(in_batch, in_event_id);
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

-- route says which endpoints get which of the events marked: every
-- enabled endpoint whose topic patterns select the event, within the
-- tenancy boundary (owner_admits: its owner's endpoints for an event
-- addressed to an owner, endpoints of no owner, and owners sharing its
-- topic, for one addressed to nobody; an event kept out so does not exist
-- for that endpoint), and whether the event passes the endpoint's filter
-- (passes: NULL for a filter the relay held after it failed a pass,
-- endpoints.filter_error_at, which is not evaluated).
--
-- Topics are matched once per distinct topic of the batch, not once per
-- event: a batch holds a handful of topics, and topic_matches is not
-- cheap. A filter is tested on the path parsed when it was stored
-- (filter_path), with silent => true: an error the payload causes (a
-- wrong type, a missing member in strict mode, a result that is not a
-- boolean) answers unknown, and unknown is no match, never a failed pass.
-- filter_problem keeps out the filters whose errors silent does not cover.
-- The held endpoints are read once (ARRAY(...) is an InitPlan, run only
-- when an event meets a filtered endpoint; as IN (SELECT ...) the planner
-- may re-run the subquery for every row).
CREATE OR REPLACE FUNCTION outbox.route(marked outbox.events[])
RETURNS TABLE (event_id bigint, subject text, endpoint_id bigint, breaker_opened_at timestamptz,
               ordering text, passes boolean)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN QUERY
  WITH topic AS (
    SELECT DISTINCT m.topic FROM unnest(marked) AS m
  ),
  subscribed AS (
    SELECT ep.id, ep.breaker_opened_at, ep.ordering, ep.filter_path, t.topic,
           o.key AS owner_key, o.allowed_topics, o.shared_topics
    FROM outbox.endpoints AS ep
    JOIN topic AS t ON outbox.topic_matches(ep.topics, t.topic)
    LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
    WHERE ep.disabled_at IS NULL
  )
  SELECT m.id, m.subject, s.id, s.breaker_opened_at, s.ordering,
         CASE WHEN s.filter_path IS NULL THEN true
              WHEN s.id = ANY (ARRAY(SELECT h.id FROM outbox.endpoints AS h WHERE h.filter_error_at IS NOT NULL))
              THEN NULL
              ELSE coalesce(jsonb_path_match(m.payload, s.filter_path, silent => true), false) END
  FROM unnest(marked) AS m
  JOIN subscribed AS s ON s.topic = m.topic
  WHERE outbox.owner_admits(m.owner, m.topic, s.owner_key, s.allowed_topics, s.shared_topics);
END
$$;

-- enqueue_deliveries inserts a delivery of each event marked to each
-- endpoint its route passes, in event order, so the job table's indexes
-- grow at their right edge: due now, or in_breaker_delay out while the
-- endpoint's breaker is open, or held in its subject's ordered lane
-- (lane_key, scheduled at 'infinity' until advance_lanes makes it due).
-- Webhooks are never coalesced: each event is a fact. It counts each
-- endpoint's deliveries, and the events its filter kept from it, for its
-- statistics (fanout_stats), in endpoint order: relays adding to the same
-- minute's rows lock them in one order. The row also keeps when the last
-- of them was fanned out, which narrows the endpoint's replay lane while
-- live deliveries flow (replay_width). It returns how many deliveries it
-- made, and the ordered lanes the events reach.
CREATE OR REPLACE FUNCTION outbox.enqueue_deliveries(marked outbox.events[], in_max_attempts integer,
                                          in_breaker_delay double precision,
                                          OUT out_jobs bigint, OUT out_lane_endpoints bigint[],
                                          OUT out_lane_keys text[])
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  WITH routed AS MATERIALIZED (
    SELECT * FROM outbox.route(marked)
  ),
  inserted AS (
    INSERT INTO outbox.jobs (kind, event_id, endpoint_id, max_attempts, scheduled_at, lane_key)
    SELECT 'webhook', r.event_id, r.endpoint_id, in_max_attempts,
           CASE WHEN r.ordering = 'subject' THEN 'infinity'
                WHEN r.breaker_opened_at IS NULL THEN now()
                ELSE now() + make_interval(secs => in_breaker_delay) END,
           CASE WHEN r.ordering = 'subject' THEN r.subject END
    FROM routed AS r
    WHERE r.passes
    ORDER BY r.event_id, r.endpoint_id
    RETURNING 1
  ),
  counted AS (
    INSERT INTO outbox.fanout_stats AS f (endpoint_id, minute, deliveries, filtered_out, filter_errors, last_fanned_at)
    SELECT r.endpoint_id, date_trunc('minute', now()),
           count(*) FILTER (WHERE r.passes), count(*) FILTER (WHERE NOT r.passes),
           count(*) FILTER (WHERE r.passes IS NULL),
           CASE WHEN bool_or(r.passes) THEN now() END
    FROM routed AS r
    GROUP BY r.endpoint_id
    ORDER BY r.endpoint_id
    ON CONFLICT (endpoint_id, minute) DO UPDATE
    SET deliveries = f.deliveries + EXCLUDED.deliveries,
        filtered_out = f.filtered_out + EXCLUDED.filtered_out,
        filter_errors = f.filter_errors + EXCLUDED.filter_errors,
        last_fanned_at = coalesce(EXCLUDED.last_fanned_at, f.last_fanned_at)
  ),
  lane AS (
    SELECT DISTINCT r.endpoint_id, r.subject FROM routed AS r WHERE r.ordering = 'subject'
  )
  SELECT (SELECT count(*) FROM inserted),
         (SELECT coalesce(array_agg(l.endpoint_id ORDER BY l.endpoint_id, l.subject), '{}') FROM lane AS l),
         (SELECT coalesce(array_agg(l.subject ORDER BY l.endpoint_id, l.subject), '{}') FROM lane AS l)
  INTO out_jobs, out_lane_endpoints, out_lane_keys;
END
$$;

-- enqueue_for_subscribers inserts the in-process subscribers' jobs of the
-- events marked: one per event and subscriber whose topics select it, and
-- for a coalescing subscriber (per_subject) one per topic and subject of
-- the batch, for its latest event. It returns how many.
CREATE OR REPLACE FUNCTION outbox.enqueue_for_subscribers(marked outbox.events[], in_subscribers jsonb, in_max_attempts integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  enqueued bigint;
BEGIN
  WITH subscription AS (
    SELECT s.kind, s.per_subject, t.topic
    FROM jsonb_to_recordset(in_subscribers) AS s(kind text, topics text[], per_subject boolean)
    JOIN (SELECT DISTINCT m.topic FROM unnest(marked) AS m) AS t ON outbox.topic_matches(s.topics, t.topic)
  ),
  job AS (
    SELECT s.kind, m.id
    FROM unnest(marked) AS m
    JOIN subscription AS s ON s.topic = m.topic AND NOT s.per_subject
    UNION ALL
    (SELECT DISTINCT ON (s.kind, m.topic, m.subject) s.kind, m.id
     FROM unnest(marked) AS m
     JOIN subscription AS s ON s.topic = m.topic AND s.per_subject
     ORDER BY s.kind, m.topic, m.subject, m.id DESC)
  ),
  inserted AS (
    INSERT INTO outbox.jobs (kind, event_id, max_attempts)
    SELECT j.kind, j.id, in_max_attempts FROM job AS j ORDER BY j.id
    RETURNING 1
  )
  SELECT count(*) INTO enqueued FROM inserted;
  RETURN enqueued;
END
$$;

-- index_subjects keeps the subject index (outbox.subjects) of the events
-- marked: the latest event of each subject and topic, in the transaction
-- that marks them fanned out. As a job per subject it would cost an
-- insert, a claim and a completion, each a new row version in every index
-- of the job table.
CREATE OR REPLACE FUNCTION outbox.index_subjects(marked outbox.events[])
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  INSERT INTO outbox.subjects AS s (subject, topic, last_event_id, payload, updated_at)
  SELECT DISTINCT ON (m.subject, m.topic) m.subject, m.topic, m.id, m.payload, now()
  FROM unnest(marked) AS m
  WHERE m.subject <> ''
  ORDER BY m.subject, m.topic, m.id DESC
  ON CONFLICT (subject, topic) DO UPDATE
  SET last_event_id = EXCLUDED.last_event_id,
      payload = EXCLUDED.payload,
      updated_at = EXCLUDED.updated_at
  WHERE s.last_event_id < EXCLUDED.last_event_id;
END
$$;

-- waiting_lanes lists each endpoint's waiting jobs as two lanes, live and
-- replayed, with the due time of the soonest (held deliveries of an
-- ordered lane wait at 'infinity'). A loose scan of
-- jobs_waiting_by_endpoint: one index probe per lane, however many jobs
-- wait in it.
CREATE OR REPLACE FUNCTION outbox.waiting_lanes()
RETURNS TABLE (endpoint_id bigint, replayed boolean, due_at timestamptz)
LANGUAGE sql STABLE
AS $$
  WITH RECURSIVE lane AS (
    (SELECT w.endpoint_id, w.replay_id IS NOT NULL AS replayed, w.scheduled_at
     FROM outbox.jobs AS w
     WHERE w.state IN ('available', 'retryable') AND w.endpoint_id IS NOT NULL
     ORDER BY w.endpoint_id, (w.replay_id IS NOT NULL), w.scheduled_at, w.id
     LIMIT 1)
    UNION ALL
    SELECT n.endpoint_id, n.replayed, n.scheduled_at
    FROM lane AS prev
    CROSS JOIN LATERAL (
      SELECT w.endpoint_id, w.replay_id IS NOT NULL AS replayed, w.scheduled_at
      FROM outbox.jobs AS w
      WHERE w.state IN ('available', 'retryable') AND w.endpoint_id IS NOT NULL
        AND (w.endpoint_id, (w.replay_id IS NOT NULL)) > (prev.endpoint_id, prev.replayed)
      ORDER BY w.endpoint_id, (w.replay_id IS NOT NULL), w.scheduled_at, w.id
      LIMIT 1
    ) AS n
  )
  SELECT l.endpoint_id, l.replayed, l.scheduled_at FROM lane AS l
$$;

-- lane_room is how many more deliveries to endpoint ep a claim may start
-- now (room), and how many of them may be replayed ones (replay_room):
--
--   room        = its cap (max_in_flight; 1 while its breaker is open)
--                 - its deliveries running now, on any replica
--                 (claiming ahead: below),
--                 and no more than worker_share - those the claiming
--                 replica holds, and, under a rate limit, no more
--                 requests than fit before now + 1 s at 1/rate apart;
--                 0 while it is paused or held (a Retry-After);
--   replay_room = replay_width(narrowed, max_in_flight)
--                 - its replayed deliveries running now.
--
-- narrowed says that live deliveries flow to it (live_flows), which
-- narrows its replay lane. Both rooms are NULL for a disabled endpoint,
-- whose jobs end without a request: nothing bounds them.
--
-- worker_share is the most of the claiming replica's workers one
-- endpoint's deliveries may hold (claim.go, workerShare, says why); NULL
-- bounds nothing (a claim by hand). With replica NULL, every running job
-- held by no replica counts as the claimer's. answered are deliveries of
-- the claiming replica whose request has ended and whose outcome its
-- completer has not written yet (claim.go, answeredJobs): they hold no
-- place. Another replica's claims count them until their outcome is
-- written, which delays, never overloads.
--
-- The claim ahead (ahead; the workers' claims pass it, claimahead.go).
-- It replaces the simple claim, the one without ahead: a delivery takes
-- its endpoint's place from its claim to the end of its request, and a
-- request ending leaves the place empty until the next claim's statement
-- has run and committed. For a receiver that answers in milliseconds
-- that wait, not the receiver, paces the endpoint: its cap's worth of
-- requests (16 by default) a claim. Claiming ahead, a registered replica
-- (replica set) holds a healthy endpoint's jobs ahead of its requests.
-- Healthy: enabled, no rate limit, its breaker closed and its last
-- attempt not failed (consecutive_failures 0), not cooling (the replica
-- released a job of it unsent within the last second: claimahead.go,
-- gateCooling), and none of its jobs the replica holds unanswered
-- claimed more than 250 ms ago (a receiver that slow would keep the jobs
-- ahead waiting past gateWait, to be released unsent). Its room is then
--
--   2 * lane_limit - own,  lane_limit = cap - others
--
-- own being the replica's running deliveries not answered, others every
-- other replica's running ones, answered or not; and within the worker
-- share, pause and hold above. lane_limit, set for every claim ahead by
-- a replica of an enabled endpoint, is the most requests the replica may
-- have in flight to it: the process starts the jobs beyond it as its
-- requests end (claimahead.go, endpointGates), so a place is held while
-- a request is in flight, not from one claim's commit to the next. The
-- cap holds over replicas because every claim, ahead or not, counts
-- another replica's running jobs whole, those waiting at its gate
-- included: a replica's requests stay within the cap less the others'
-- jobs at its latest claim, and theirs only shrink until they claim
-- again, counting its jobs. NULL ahead is a claim without ahead; NULL
-- cooling, every endpoint cooling.
--
-- PL/pgSQL, so that its plan is kept for the session (live_flows says
-- why). The count reads jobs_running_by_endpoint: at most max_in_flight
-- entries, twice that claiming ahead.
CREATE OR REPLACE FUNCTION outbox.lane_room(ep outbox.endpoints, replica bigint, answered bigint[], worker_share integer,
                                 ahead boolean, cooling bigint[],
                                 OUT room integer, OUT replay_room integer, OUT narrowed boolean,
                                 OUT lane_limit integer)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  cap     integer := CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END;
  holders integer; -- running, not answered
  others  integer; -- running, held by another replica (or by none), answered or not
  own     integer; -- running, held by the claiming replica, not answered
  slow    integer; -- own, claimed more than 250 ms ago
  replays integer; -- running replayed deliveries, not answered
BEGIN
  IF ep.disabled_at IS NOT NULL THEN
    RETURN;
  END IF;
  narrowed := outbox.live_flows(ep.id);
  SELECT count(*) FILTER (WHERE r.id <> ALL (answered)),
         count(*) FILTER (WHERE r.held_by IS DISTINCT FROM replica),
         count(*) FILTER (WHERE r.held_by IS NOT DISTINCT FROM replica AND r.id <> ALL (answered)),
         count(*) FILTER (WHERE r.held_by IS NOT DISTINCT FROM replica AND r.id <> ALL (answered)
                            AND r.attempted_at < now() - interval '250 milliseconds'),
         count(*) FILTER (WHERE r.replay_id IS NOT NULL AND r.id <> ALL (answered))
  INTO holders, others, own, slow, replays
  FROM outbox.jobs AS r
  WHERE r.endpoint_id = ep.id AND r.state = 'running';
  IF ahead AND replica IS NOT NULL THEN
    lane_limit := cap - others;
  END IF;
  room := least(CASE WHEN lane_limit IS NOT NULL AND ep.breaker_opened_at IS NULL AND ep.rate_limit_per_second IS NULL
                          AND ep.consecutive_failures = 0 AND ep.id <> ALL (cooling) AND slow = 0
                     THEN 2 * lane_limit - own
                     ELSE cap - holders
                END,
                worker_share - own,
                CASE WHEN ep.rate_limit_per_second IS NOT NULL
                     THEN 1 + floor(ep.rate_limit_per_second * extract(epoch FROM
                            now() + interval '1 second' - greatest(now(), ep.rate_next_at)))
                END,
                CASE WHEN ep.paused_at IS NOT NULL OR ep.held_until > now() THEN 0 END);
  replay_room := outbox.replay_width(narrowed, ep.max_in_flight) - replays;
END
$$;

-- due_lanes picks the endpoints a claim of batch serves: those with due
-- work and room, the ones with live work first (oldest due live job
-- first), then those with replayed work alone (oldest first), at most
-- batch. It locks each, and returns those it locked, in that order.
--
-- Replicas respect one cap because the claims of an endpoint take turns:
-- a transaction-scoped advisory lock per endpoint served, and a lane
-- another replica holds is skipped (pg_try_advisory_xact_lock: released
-- at commit, so safe on pooled connections; the key pair's class keeps it
-- apart from outboxd's other, single-key locks). The claim then counts
-- the running jobs again in a statement of its own (lane_jobs), whose
-- snapshot sees every job the previous holder claimed. (Locking the
-- endpoint's row instead would write a row lock to the table on every
-- claim, shared with the fan-out's key-share locks as a multixact.)
CREATE OR REPLACE FUNCTION outbox.due_lanes(batch integer, replica bigint, answered bigint[], worker_share integer,
                                 ahead boolean, cooling bigint[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  RETURN ARRAY(
    SELECT open.id
    FROM (
      SELECT ep.id, w.live_at, w.replay_at
      FROM (SELECT l.endpoint_id,
                   min(l.due_at) FILTER (WHERE NOT l.replayed) AS live_at,
                   min(l.due_at) FILTER (WHERE l.replayed) AS replay_at
            FROM outbox.waiting_lanes() AS l
            WHERE l.due_at <= now()
            GROUP BY l.endpoint_id) AS w
      JOIN outbox.endpoints AS ep ON ep.id = w.endpoint_id
      CROSS JOIN LATERAL outbox.lane_room(ep, replica, answered, worker_share, ahead, cooling) AS r
      WHERE ep.disabled_at IS NOT NULL
         OR (r.room > 0 AND (w.live_at IS NOT NULL OR r.replay_room > 0))
      ORDER BY w.live_at NULLS LAST, w.replay_at, ep.id
      LIMIT batch
    ) AS open
    -- After the LIMIT, so that only the lanes served are locked.
    WHERE pg_try_advisory_xact_lock(hashtext('outbox.claim_jobs'), (open.id % 2147483647)::integer)
    ORDER BY open.live_at NULLS LAST, open.replay_at, open.id);
END
$$;

-- lock_due_jobs locks up to n due jobs waiting in endpoint ep's live lane
-- or, with replayed, its replay lane (NULL: the jobs of no endpoint, of
-- the given kinds, NULL for every kind), soonest first, skipping those
-- another claim holds. PL/pgSQL, so that its plan is kept for the
-- session.
CREATE OR REPLACE FUNCTION outbox.lock_due_jobs(ep bigint, replayed boolean, n integer, kinds text[])
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF ep IS NULL THEN
    RETURN ARRAY(SELECT w.id FROM outbox.jobs AS w
                 WHERE w.endpoint_id IS NULL AND w.state IN ('available', 'retryable')
                   AND w.scheduled_at <= now() AND (kinds IS NULL OR w.kind = ANY (kinds))
                 ORDER BY w.scheduled_at, w.id
                 LIMIT greatest(n, 0)
                 FOR UPDATE SKIP LOCKED);
  END IF;
  RETURN ARRAY(SELECT w.id FROM outbox.jobs AS w
               WHERE w.endpoint_id = ep AND (w.replay_id IS NOT NULL) = replayed
                 AND w.state IN ('available', 'retryable') AND w.scheduled_at <= now()
               ORDER BY w.scheduled_at, w.id
               LIMIT greatest(n, 0)
               FOR UPDATE SKIP LOCKED);
END
$$;

-- lane_jobs locks the due jobs a claim of batch takes from the lanes it
-- locked (due_lanes, in their order): of each, its live ones up to its
-- room (lane_room, counted again now), then its replayed ones in the room
-- they leave and its replay room; and the jobs of no endpoint of the
-- given kinds. No lane locks more than twice its fair share of the batch:
-- enough for lanes with more work to take what lanes with less leave.
-- Of what is locked, at most batch, round robin: every lane's first job,
-- then every lane's second, and live before replayed. lane_limit is the
-- job's lane's, claiming ahead (lane_room).
--
-- wakes says the job's lane took all it could (its room, its replay room,
-- or the subscribers' share), so that its outcome frees a place due work
-- may be waiting for: the worker claims again when it is written (claim.go,
-- Job.wakeOnOutcome). yields marks a replayed delivery of a lane narrowed
-- by live traffic: its place is taken by the next claim the live
-- deliveries bring, or by one the worker makes after a short wait
-- (deliver.go, replayYield).
--
-- due_lanes, lane_jobs and the functions they call are PL/pgSQL, so that
-- their plans are kept for the session, made under claim_lane_jobs'
-- planner settings, the one caller.
CREATE OR REPLACE FUNCTION outbox.lane_jobs(lanes bigint[], batch integer, replica bigint, answered bigint[],
                                 worker_share integer, ahead boolean, cooling bigint[], kinds text[])
RETURNS TABLE (id bigint, wakes boolean, yields boolean, lane_limit integer)
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  RETURN QUERY
  WITH lane AS MATERIALIZED (
    SELECT l.id, l.lane_order, coalesce(r.narrowed, false) AS narrowed,
           greatest(least(coalesce(r.room, batch), batch, 2 * batch / (cardinality(lanes) + 1) + 1), 0) AS room,
           coalesce(r.replay_room, batch) AS replay_room, r.lane_limit
    FROM unnest(lanes) WITH ORDINALITY AS l(id, lane_order)
    JOIN outbox.endpoints AS ep ON ep.id = l.id
    CROSS JOIN LATERAL outbox.lane_room(ep, replica, answered, worker_share, ahead, cooling) AS r
  ),
  live AS MATERIALIZED (
    SELECT l.*, outbox.lock_due_jobs(l.id, false, l.room, NULL) AS live_ids FROM lane AS l
  ),
  locked AS MATERIALIZED (
    SELECT l.*, outbox.lock_due_jobs(l.id, true, least(l.room - cardinality(l.live_ids), l.replay_room), NULL)
             AS replay_ids
    FROM live AS l
  ),
  subscribers AS MATERIALIZED (
    SELECT least(batch, 2 * batch / (cardinality(lanes) + 1) + 1) AS share,
           outbox.lock_due_jobs(NULL, NULL, least(batch, 2 * batch / (cardinality(lanes) + 1) + 1), kinds) AS ids
  ),
  candidate AS (
    SELECT c.id, false AS replayed, c.lane_rank, l.lane_order,
           cardinality(l.live_ids) + cardinality(l.replay_ids) >= l.room AS wakes, false AS yields, l.lane_limit
    FROM locked AS l, unnest(l.live_ids) WITH ORDINALITY AS c(id, lane_rank)
    UNION ALL
    SELECT c.id, true, c.lane_rank, l.lane_order,
           cardinality(l.live_ids) + cardinality(l.replay_ids) >= l.room
             OR (cardinality(l.replay_ids) >= l.replay_room AND NOT l.narrowed),
           l.narrowed, l.lane_limit
    FROM locked AS l, unnest(l.replay_ids) WITH ORDINALITY AS c(id, lane_rank)
    UNION ALL
    SELECT c.id, false, c.lane_rank, 0, cardinality(s.ids) >= s.share, false, NULL::integer
    FROM subscribers AS s, unnest(s.ids) WITH ORDINALITY AS c(id, lane_rank)
  )
  SELECT c.id, c.wakes, c.yields, c.lane_limit
  FROM candidate AS c
  ORDER BY c.replayed, c.lane_rank, c.lane_order
  LIMIT batch;
END
$$;

-- lock_replica locks replica's row in outbox.replicas FOR KEY SHARE for
-- the caller's transaction, a claim's, and fails with SQLSTATE OXR01 if it
-- is gone: the replica was declared dead, its jobs rescued, and it must
-- not claim under that id again. The lock makes the declaration (which
-- deletes the row) wait for a claim in flight, so that no claim commits
-- behind the rescue of its replica's jobs. NULL: no replica, nothing to
-- lock.
CREATE OR REPLACE FUNCTION outbox.lock_replica(replica bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF replica IS NOT NULL THEN
    PERFORM 1 FROM outbox.replicas AS r WHERE r.id = replica FOR KEY SHARE;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'replica % is not registered: it was declared dead', replica USING ERRCODE = 'OXR01';
    END IF;
  END IF;
END
$$;

-- claim_lane_jobs is the workers' claim: it marks running what lane_jobs
-- locked, with the next attempt number, held by replica, and returns each
-- job as claimed_job, with its lane's lane_limit. Under a rate limit, a
-- lane's claimed jobs start 1/rate apart from its rate_next_at
-- (start_in_ms), and the lane's next request after them. An ordered
-- lane's delivery always wakes a claim when it ends: its outcome lets the
-- lane's next one go (advance_lanes).
--
-- replica is the claiming process's row in outbox.replicas (replicas.go):
-- every job claimed records it in held_by, so that when that replica
-- stops heartbeating its jobs are rescued at once rather than after the
-- rescue horizon (rescue.go). NULL: the jobs are held by no one known,
-- and only the horizon rescues them (tests and an operator's psql claim
-- this way).
--
-- ahead and cooling are the claim ahead of an endpoint's requests, which
-- lane_room decides: the workers of a registered replica claim ahead,
-- with the endpoints they released a job of unsent within the last
-- second as cooling (claimahead.go).
--
-- kinds are the job kinds the claiming replica runs (deliver.go): a claim
-- without 'webhook' serves no endpoint, and of the jobs of no endpoint
-- takes only those of its kinds. The others wait, due, for a replica that
-- runs them, and while no live replica does the overview says so
-- (jobs_no_runner). NULL: every kind.
--
-- Lost in a crash, a claim's jobs are claimed again: its commit need not
-- wait for the disk (database.go, beginPipelineTx); synchronous_commit is
-- set for the caller's transaction, since a SET clause would be undone
-- before the commit. It locks outbox.events before the replica's row, in
-- the order a migration locks the tables (migrate.go, schemaTablesQuery):
-- a claim that locked the row and then queued for the events behind a
-- migration would hold what the migration waits for next.
--
-- The planner settings keep every read in index order and by key,
-- whatever the statistics say: a table not analyzed since a bulk fan-out
-- would otherwise have a claim read and sort every due job. jit = off
-- keeps the cost those settings give the few sorts left from compiling
-- the statement. enable_bitmapscan = off makes the counts of running jobs
-- plain index scans, which mark the entries of dead rows dead in the
-- index, where a bitmap scan visits the heap for every one of them, on
-- every claim, until a vacuum. The plan is made once per session.
CREATE OR REPLACE FUNCTION outbox.claim_lane_jobs(batch integer, replica bigint, answered bigint[], ahead boolean,
                                       cooling bigint[], worker_share integer DEFAULT NULL,
                                       kinds text[] DEFAULT NULL)
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
  lanes bigint[] := '{}';
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  answered := coalesce(answered, '{}');
  LOCK TABLE outbox.events IN ACCESS SHARE MODE;
  PERFORM outbox.lock_replica(replica);
  IF kinds IS NULL OR 'webhook' = ANY (kinds) THEN
    lanes := outbox.due_lanes(batch, replica, answered, worker_share, ahead, cooling);
  END IF;
  RETURN QUERY
  WITH picked AS MATERIALIZED (
    SELECT * FROM outbox.lane_jobs(lanes, batch, replica, answered, worker_share, ahead, cooling, kinds)
  ),
  claimed AS (
    UPDATE outbox.jobs AS j
    SET state = 'running', attempt = j.attempt + 1, attempted_at = now(), held_by = replica
    WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked AS p))
    RETURNING j.id, j.kind, j.attempt, j.max_attempts, j.endpoint_id, j.event_id, j.replay_id,
              j.attempted_at, j.lane_key
  ),
  paced AS (
    SELECT c.id, c.endpoint_id, ep.rate_limit_per_second AS rate,
           greatest(now(), ep.rate_next_at) AS base,
           row_number() OVER (PARTITION BY c.endpoint_id ORDER BY c.id) AS place
    FROM claimed AS c
    JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
    WHERE ep.rate_limit_per_second IS NOT NULL
  ),
  paced_lanes AS (
    UPDATE outbox.endpoints AS ep
    SET rate_next_at = p.base + p.place * make_interval(secs => 1 / p.rate)
    FROM (SELECT DISTINCT ON (p.endpoint_id) p.* FROM paced AS p ORDER BY p.endpoint_id, p.place DESC) AS p
    WHERE ep.id = p.endpoint_id
  )
  SELECT j, pk.lane_limit
  FROM claimed AS c
  JOIN picked AS pk ON pk.id = c.id
  JOIN outbox.events AS e ON e.id = c.event_id
  LEFT JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
  LEFT JOIN paced AS p ON p.id = c.id
  CROSS JOIN LATERAL outbox.as_claimed_job(c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id, c.replay_id,
    c.attempted_at, e, ep,
    coalesce(ceil(extract(epoch FROM p.base + (p.place - 1) * make_interval(secs => 1 / p.rate) - now()) * 1000),
             0)::integer,
    pk.wakes OR c.lane_key IS NOT NULL, pk.yields) AS j;
END
$$;

-- traceparent_repaired is the traceparent trace_context keeps, and the
-- repair it names: a valid one of version 00 as it is; one of a later
-- version read as 00 ('traceparent_downgraded'); any other NULL
-- ('traceparent_dropped'; no repair for an empty one).
CREATE OR REPLACE FUNCTION outbox.traceparent_repaired(in_traceparent text, OUT traceparent text, OUT repair text)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
  traceparent := nullif(btrim(in_traceparent, E' \t'), '');
  IF traceparent IS NULL THEN
    RETURN;
  END IF;
  -- Fields at 1, 4, 37 and 54, of lower-case hex, the ids not all zeros.
  IF NOT (length(traceparent) >= 55
          AND substr(traceparent, 3, 1) = '-' AND substr(traceparent, 36, 1) = '-' AND substr(traceparent, 53, 1) = '-'
          AND translate(left(traceparent, 2) || substr(traceparent, 4, 32) || substr(traceparent, 37, 16)
                          || substr(traceparent, 54, 2), '0123456789abcdef', '') = ''
          AND substr(traceparent, 4, 32) <> '00000000000000000000000000000000'
          AND substr(traceparent, 37, 16) <> '0000000000000000'
          AND left(traceparent, 2) <> 'ff'
          AND (length(traceparent) = 55 OR (left(traceparent, 2) <> '00' AND substr(traceparent, 56, 1) = '-'))) THEN
    traceparent := NULL;
    repair := 'traceparent_dropped';
  ELSIF left(traceparent, 2) <> '00' THEN
    traceparent := '00-' || substr(traceparent, 4, 50) || '0'
                   || CASE WHEN strpos('13579bdf', substr(traceparent, 55, 1)) > 0 THEN '1' ELSE '0' END;
    repair := 'traceparent_downgraded';
  END IF;
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
  SELECT t.traceparent, array_remove(ARRAY[t.repair], NULL) INTO traceparent, repairs
  FROM outbox.traceparent_repaired(in_traceparent) AS t;

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

-- lock_lanes takes advance_lanes' locks of the given lanes for the
-- caller's transaction, as advance_lanes says: each endpoint's, shared
-- (exclusive past 64 of its lanes), then each lane's, and with hold the
-- endpoints' rows FOR SHARE.
CREATE OR REPLACE FUNCTION outbox.lock_lanes(endpoint_ids bigint[], lane_keys text[], hold boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
  exclusive bigint[] := '{}';
  r record;
BEGIN
  FOR r IN
    SELECT g.endpoint_id, count(DISTINCT g.lane_key) > 64 AS many
    FROM unnest(endpoint_ids, lane_keys) AS g(endpoint_id, lane_key)
    WHERE g.endpoint_id IS NOT NULL AND g.lane_key IS NOT NULL
    GROUP BY g.endpoint_id
    ORDER BY g.endpoint_id
  LOOP
    IF r.many THEN
      PERFORM pg_advisory_xact_lock(hashtext('outbox.advance_lanes'), (r.endpoint_id % 2147483647)::integer);
      exclusive := exclusive || r.endpoint_id;
    ELSE
      PERFORM pg_advisory_xact_lock_shared(hashtext('outbox.advance_lanes'), (r.endpoint_id % 2147483647)::integer);
    END IF;
  END LOOP;
  -- One statement for a lane lock each, taken in its subquery's order.
  PERFORM pg_advisory_xact_lock(hashtext('outbox.advance_lanes/lane'), k.key)
  FROM (
    SELECT DISTINCT hashtext(g.endpoint_id || '/' || g.lane_key) AS key
    FROM unnest(endpoint_ids, lane_keys) AS g(endpoint_id, lane_key)
    WHERE g.endpoint_id IS NOT NULL AND g.lane_key IS NOT NULL
      AND g.endpoint_id <> ALL (exclusive)
    ORDER BY 1
  ) AS k;
  IF hold THEN
    PERFORM 1
    FROM outbox.endpoints AS ep
    WHERE ep.id = ANY (endpoint_ids)
    ORDER BY ep.id
    FOR SHARE;
  END IF;
END
$$;

-- record_outcomes is the completer's transaction (completer.go), and an
-- in-process subscriber's batch's (deliver.go): a batch of outcomes with
-- everything they record, in one call. It takes rows, as JSON arrays of
-- objects:
--
--   in_outcomes  one per job: {id, attempt, state, delay_ms, error};
--   in_attempts  one per request or mail made: {job_id, attempt,
--                endpoint_id, duration_ms, status_code, error, excerpt,
--                class, minute, bucket}; minute is Unix seconds, bucket
--                the 0-based latency bucket of in_buckets;
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
-- wait rather than deadlock): the jobs' outcomes and their attempts in the
-- history (finish_jobs); advance_lanes for the ordered lanes whose
-- delivery finished, in the same transaction, so that there is never a
-- moment with a lane held and nothing running; the statistics
-- (count_attempts); the endpoints (record_endpoint_health).
--
-- Writing a batch again is safe: outcomes are fenced on the attempt, the
-- history is inserted ON CONFLICT DO NOTHING, and endpoint states set, not
-- toggled. Rows go in (endpoint, minute) or id order, so two completers
-- lock them in one order. The commit does not wait for the WAL to reach
-- the disk (database.go, beginPipelineTx, says why that loses nothing).
--
-- enable_bitmapscan = off, for the reason claim_lane_jobs gives: the
-- outcomes' jobs are found through jobs_running_by_attempted_at (the
-- generic plan expects few running jobs and hashes them all), and a bitmap
-- scan of it visits every entry, dead ones included, without ever marking
-- them dead, so a batch costs more the longer since the last vacuum. A
-- plain index scan marks the entries of rows dead to every snapshot, and
-- the next batch skips them (docs/performance.md, the completer's plan,
-- has the figures).
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
  lane_endpoints bigint[];
  lane_keys text[];
BEGIN
  PERFORM set_config('synchronous_commit', 'off', true);
  -- outbox.events first, in the order a migration locks the tables
  -- (migrate.go, schemaTablesQuery): a completion in an ordered lane reads
  -- events after it updates jobs (advance_lanes).
  LOCK TABLE outbox.events IN ACCESS SHARE MODE;
  SELECT array_agg(f.id), array_agg(f.attempt),
         array_agg(f.endpoint_id ORDER BY f.endpoint_id, f.lane_key) FILTER (WHERE f.lane_done),
         array_agg(f.lane_key ORDER BY f.endpoint_id, f.lane_key) FILTER (WHERE f.lane_done)
  INTO written_ids, written_attempts, lane_endpoints, lane_keys
  FROM (SELECT f.*, f.lane_key IS NOT NULL AND f.state IN ('completed', 'discarded') AS lane_done
        FROM outbox.finish_jobs(in_outcomes, in_attempts) AS f) AS f;
  IF lane_endpoints IS NOT NULL THEN
    PERFORM outbox.advance_lanes(lane_endpoints, lane_keys, false);
  END IF;
  written_ids := coalesce(written_ids, '{}');
  written_attempts := coalesce(written_attempts, '{}');
  PERFORM outbox.record_fenced_attempts(in_attempts, written_ids, written_attempts);
  PERFORM outbox.count_attempts(in_attempts, written_ids, written_attempts, in_buckets);
  PERFORM outbox.record_endpoint_health(in_health, in_gone, in_windows, in_breaker_threshold);
END
$$;

-- finish_jobs writes the outcomes, each fenced on (id, attempt, running):
-- an outcome of an attempt that is no longer its job's current one changes
-- nothing. A completed job leaves the queue; a failed one is retryable
-- after its delay or discarded, its error added to its errors. Every
-- attempt goes to the history (outbox.deliveries) with what it left its
-- job (the attempts the fence refused are record_fenced_attempts'). State
-- 'released' comes from the release before alone, for a job it claimed
-- ahead of its endpoint's requests and never sent: it goes back to the
-- queue as it was before the claim, its attempt not counted, and makes no
-- history. It returns the jobs it finished.
CREATE OR REPLACE FUNCTION outbox.finish_jobs(in_outcomes json, in_attempts json)
RETURNS TABLE (id bigint, attempt integer, endpoint_id bigint, lane_key text, state outbox.job_state)
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
              'completed'::outbox.job_state AS state, o.error, false AS released
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
              j.state, o.error, o.state = 'released'
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
  SELECT f.id, f.attempt, f.endpoint_id, f.lane_key, f.state FROM finished AS f;
END
$$;

-- count_attempts adds the attempts written (written_ids, written_attempts:
-- those whose outcome finish_jobs wrote) to the statistics, in a row of
-- delivery_stats per endpoint and minute. An attempt the fence refused (a
-- worker that lost its job to the rescuer, or this batch written again
-- after its commit's answer was lost) counts nothing, and one that made no
-- request (class 'none') neither.
CREATE OR REPLACE FUNCTION outbox.count_attempts(in_attempts json, written_ids bigint[], written_attempts integer[],
                                      in_buckets integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  WITH counted AS (
    SELECT a.endpoint_id, a.minute,
           count(*) AS attempts,
           count(*) FILTER (WHERE a.class = 'success') AS successes,
           count(*) FILTER (WHERE a.class = 'timeout') AS failed_timeout,
           count(*) FILTER (WHERE a.class = '4xx') AS failed_4xx,
           count(*) FILTER (WHERE a.class = '5xx') AS failed_5xx,
           count(*) FILTER (WHERE a.class = 'connection') AS failed_connection,
           count(*) FILTER (WHERE a.class = 'other') AS failed_other,
           array_agg(a.bucket) FILTER (WHERE a.class = 'success') AS buckets
    FROM json_to_recordset(in_attempts)
         AS a(job_id bigint, attempt integer, endpoint_id bigint, class text, minute bigint, bucket integer)
    JOIN unnest(written_ids, written_attempts) AS w(id, attempt) ON w.id = a.job_id AND w.attempt = a.attempt
    WHERE a.endpoint_id <> 0 AND a.class <> 'none'
    GROUP BY a.endpoint_id, a.minute
  )
  INSERT INTO outbox.delivery_stats AS s (endpoint_id, minute, attempts, successes, failed_timeout,
                                          failed_4xx, failed_5xx, failed_connection, failed_other, latency_buckets)
  SELECT c.endpoint_id, to_timestamp(c.minute), c.attempts, c.successes, c.failed_timeout,
         c.failed_4xx, c.failed_5xx, c.failed_connection, c.failed_other,
         ARRAY(SELECT count(b.bucket)
               FROM generate_series(0, in_buckets - 1) AS g(bucket)
               LEFT JOIN unnest(c.buckets) AS b(bucket) ON b.bucket = g.bucket
               GROUP BY g.bucket
               ORDER BY g.bucket)
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
      latency_buckets = ARRAY(SELECT a + b
                              FROM unnest(s.latency_buckets, EXCLUDED.latency_buckets) WITH ORDINALITY AS t(a, b, i)
                              ORDER BY i);
END
$$;

-- record_endpoint_health writes what a batch's attempts did to their
-- endpoints: their health (a success restarts the count of consecutive
-- failures; the count reaching in_breaker_threshold opens the breaker, and
-- a success closes it; failing_since is set by the first failure after a
-- success and cleared by a success; a hold only ever extends held_until),
-- the ones whose receiver answered 410 Gone (disabled, with failing_since,
-- in one change: one "disabled" notification, not a "failing" one first),
-- and the dedup window each receiver advertised (an unchanged one written
-- at most hourly). A healthy endpoint's row is not rewritten on every
-- delivery.
CREATE OR REPLACE FUNCTION outbox.record_endpoint_health(in_health json, in_gone bigint[], in_windows json,
                                              in_breaker_threshold integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  IF json_array_length(in_health) > 0 THEN
    UPDATE outbox.endpoints AS ep
    SET consecutive_failures = h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END,
        breaker_opened_at = CASE
          WHEN h.failures + CASE WHEN h.succeeded THEN 0 ELSE ep.consecutive_failures END >= in_breaker_threshold
          THEN coalesce(ep.breaker_opened_at, now())
        END,
        failing_since = CASE WHEN h.failures = 0 THEN NULL WHEN h.succeeded THEN now()
                             ELSE coalesce(ep.failing_since, now()) END,
        held_until = CASE WHEN h.hold_ms > 0 THEN greatest(ep.held_until, now() + h.hold_ms * interval '1 millisecond')
                          ELSE ep.held_until END
    FROM json_to_recordset(in_health) AS h(id bigint, succeeded boolean, failures integer, hold_ms bigint)
    WHERE ep.id = h.id
      AND (h.failures > 0 OR h.hold_ms > 0
           OR ep.consecutive_failures > 0 OR ep.failing_since IS NOT NULL OR ep.breaker_opened_at IS NOT NULL);
  END IF;
  IF cardinality(in_gone) > 0 THEN
    UPDATE outbox.endpoints AS ep
    SET disabled_at = now(), disabled_reason = 'the receiver answered 410 Gone', disabled_cause = 'gone',
        failing_since = coalesce(ep.failing_since, now())
    WHERE ep.id = ANY (in_gone) AND ep.disabled_at IS NULL;
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
      AND (ep.dedup_window_seconds IS DISTINCT FROM w.seconds OR ep.dedup_window_seen_at < now() - interval '1 hour');
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.events_delete_jobs() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  DELETE FROM outbox.jobs AS j WHERE j.event_id = ANY (ARRAY(SELECT g.id FROM gone_events AS g));
  DELETE FROM outbox.deliveries AS d WHERE d.event_id = ANY (ARRAY(SELECT g.id FROM gone_events AS g));
  RETURN NULL;
END
$$;

-- erase_subject erases what outboxd keeps of the payloads of subject
-- in_subject (docs/erasure.md), in the caller's transaction, and returns
-- how many events it erased: 0 when every one was erased before. Its
-- events keep their ids, topic, subject, times and outcomes and lose
-- their payload (erased_at); one not yet fanned out, or poisoned, is
-- marked fanned out with no delivery, so that no relay ever sends it.
-- What their attempts kept that may echo the payload goes: the errors'
-- texts become '(erased)' (jobs.errors, deliveries.error) and the
-- answers' excerpts empty. Their jobs not yet finished end discarded
-- with in_reason as their last error, a running one too: the completer's
-- outcome of that attempt, fenced on the state (record_outcomes), then
-- changes nothing and keeps nothing of its answer. The subject index's
-- rows of the subject lose their payload whatever events remain:
-- retention may have deleted the events whose payload they keep.
--
-- Tables in the pipeline's order (migrate.go, schemaTablesQuery): events,
-- jobs, deliveries, the endpoints of the ordered lanes whose active
-- delivery it discarded (advance_lanes), then subjects. The events are
-- found by a scan: no index serves subject, and one would cost every
-- recording for a call an operator makes now and then.
CREATE OR REPLACE FUNCTION outbox.erase_subject(in_subject text, in_reason text)
RETURNS integer
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  erased bigint[];
  lanes  record;
BEGIN
  WITH e AS (
    UPDATE outbox.events AS e
    SET payload = NULL,
        erased_at = now(),
        committed_at = outbox.commit_time(e, e.xmin),
        fanned_out_at = coalesce(e.fanned_out_at, now()),
        poisoned_at = NULL
    WHERE e.subject = in_subject
      AND e.erased_at IS NULL
    RETURNING e.id
  )
  SELECT coalesce(array_agg(e.id), '{}') INTO erased FROM e;

  UPDATE outbox.jobs AS j
  SET errors = (SELECT jsonb_agg(x.a || '{"error": "(erased)"}' ORDER BY x.n)
                FROM jsonb_array_elements(j.errors) WITH ORDINALITY AS x (a, n))
  WHERE j.event_id = ANY (erased)
    AND j.errors <> '[]';

  WITH ended AS (
    UPDATE outbox.jobs AS j
    SET state = 'discarded',
        finalized_at = now(),
        scheduled_at = least(j.scheduled_at, now()),
        errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'attempt', j.attempt, 'at', now(), 'error', in_reason))
    WHERE j.event_id = ANY (erased)
      AND j.state IN ('available', 'retryable', 'running')
    RETURNING j.endpoint_id, j.lane_key
  )
  SELECT coalesce(array_agg(endpoint_id), '{}') AS endpoint_ids, coalesce(array_agg(lane_key), '{}') AS keys
  INTO lanes FROM ended WHERE lane_key IS NOT NULL;

  UPDATE outbox.deliveries AS d
  SET error = CASE WHEN d.error = '' THEN '' ELSE '(erased)' END,
      response_excerpt = ''
  WHERE d.event_id = ANY (erased);

  PERFORM outbox.advance_lanes(lanes.endpoint_ids, lanes.keys, true);

  UPDATE outbox.subjects AS s
  SET payload = NULL
  WHERE s.subject = in_subject
    AND s.payload IS NOT NULL;

  RETURN cardinality(erased);
END
$$;

-- advance_lanes makes the next held delivery of each given lane due: the
-- one of the lowest event id, if the lane has no active delivery and no
-- earlier event of its subject that the endpoint's topics select, and the
-- tenancy boundary lets it have (owner_admits), is still waiting to be
-- fanned out. That last rule is what makes fan-out order
-- commit order: two relays can fan out a subject's events 2 and 3 at
-- once, and 3's transaction commit first; 3 then waits for 2, whose
-- relay's own call advances the lane. The un-fanned events are read once
-- per call, those below the highest held head only: in steady state, the
-- other relays' batches. (Read for every lane, unbounded, they would be
-- most of the call's time.)
--
-- Two callers can race: the relay inserting a held delivery and the
-- completer finishing the active one, each unable to see the other's
-- uncommitted row, would both leave the lane held. So every caller
-- locks the lanes first and decides in a second statement, whose
-- snapshot sees whatever the previous holder of a lane committed. The
-- locks are transaction-scoped advisory locks, one per lane, so only
-- callers of the same lane wait for each other (a lock of the endpoint's
-- row would make every completer and relay of an endpoint wait for each
-- other): a shared lock on the endpoint (first key
-- hashtext('outbox.advance_lanes'), endpoint ids in order), then the
-- lanes' (hashtext('outbox.advance_lanes/lane'), in key order). A call
-- with more than 64 lanes of one endpoint (a relay's or a replay's big
-- batch) takes that endpoint's lock exclusively instead of one per lane,
-- so that no transaction holds more advisory locks than the lock table
-- allows for (max_locks_per_transaction, 64 by default). Endpoint locks
-- all before lane locks, each in one order: no two callers wait for each
-- other in a circle.
--
-- A PATCH to ordering 'none' and a delete release an endpoint's lanes
-- (endpoints.go, releaseLanesSQL) under its row lock, and cannot see a
-- held delivery inserted or put back meanwhile. So a caller that holds
-- deliveries (fan-out, a replay, a retry by hand: hold true) also locks
-- the endpoints' rows FOR SHARE, after the advisory locks, and decides
-- after a release: the held delivery is its lane's first. The completer
-- (hold false) only finishes deliveries, which a release's own row locks
-- order, and skips it: FOR SHARE between its completions would have
-- completers of two replicas wait for each other to update the endpoint
-- (endpointHealthSQL).
-- A lane's head is its held delivery of the lowest event id, made due
-- when the lane has no active delivery. Returns how many it made due.
CREATE OR REPLACE FUNCTION outbox.advance_lanes(endpoint_ids bigint[], lane_keys text[], hold boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
  advanced integer;
BEGIN
  PERFORM outbox.lock_lanes(endpoint_ids, lane_keys, hold);
  WITH lane AS (
    SELECT DISTINCT g.endpoint_id, g.lane_key, ep.topics,
           o.key AS owner_key, o.allowed_topics, o.shared_topics
    FROM unnest(endpoint_ids, lane_keys) AS g(endpoint_id, lane_key)
    JOIN outbox.endpoints AS ep ON ep.id = g.endpoint_id
    LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
    WHERE g.lane_key IS NOT NULL
  ),
  head AS MATERIALIZED (
    SELECT h.id, h.event_id, l.lane_key, l.topics, l.owner_key, l.allowed_topics, l.shared_topics
    FROM lane AS l
    CROSS JOIN LATERAL (
      SELECT j.id, j.event_id
      FROM outbox.jobs AS j
      WHERE j.endpoint_id = l.endpoint_id AND j.lane_key = l.lane_key
        AND j.state IN ('available', 'retryable', 'running')
        AND j.scheduled_at = 'infinity'
      ORDER BY j.event_id
      LIMIT 1
    ) AS h
    WHERE NOT EXISTS (
      SELECT 1
      FROM outbox.jobs AS a
      WHERE a.endpoint_id = l.endpoint_id AND a.lane_key = l.lane_key
        AND a.state IN ('available', 'retryable', 'running')
        AND a.scheduled_at < 'infinity'
    )
  ),
  unfanned AS MATERIALIZED (
    SELECT e.id, e.subject, e.topic, e.owner
    FROM outbox.events AS e
    WHERE e.fanned_out_at IS NULL
      AND e.poisoned_at IS NULL
      AND e.id < (SELECT max(h.event_id) FROM head AS h)
  )
  UPDATE outbox.jobs AS j
  SET scheduled_at = now()
  FROM head AS h
  WHERE j.id = h.id
    AND NOT EXISTS (
      SELECT 1
      FROM unfanned AS e
      WHERE e.subject = h.lane_key
        AND e.id < h.event_id
        AND outbox.topic_matches(h.topics, e.topic)
        AND outbox.owner_admits(e.owner, e.topic, h.owner_key, h.allowed_topics, h.shared_topics)
    );
  GET DIAGNOSTICS advanced = ROW_COUNT;
  RETURN advanced;
END
$$;

-- rescue_jobs is the rescuer's (rescue.go): it ends the attempts of the
-- running jobs in_ids, locked by the caller, whose worker is gone (past
-- the rescue horizon, or of a replica declared dead), each with its error
-- of in_errors. A job is retryable now, or discarded if that was its last
-- attempt; the attempt stays spent, so a late outcome of it is fenced out
-- (finish_jobs), and goes to the history with its error. It returns each
-- job's endpoint and ordered lane, which the caller advances.
CREATE OR REPLACE FUNCTION outbox.rescue_jobs(in_ids bigint[], in_errors text[])
RETURNS TABLE (endpoint_id bigint, lane_key text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH rescued AS (
    UPDATE outbox.jobs AS j
    SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'discarded' ELSE 'retryable' END::outbox.job_state,
        scheduled_at = now(),
        finalized_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
        errors = j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', r.error))
    FROM unnest(in_ids, in_errors) AS r(id, error)
    WHERE j.id = r.id AND j.state = 'running'
    RETURNING j.id, j.attempt, j.event_id, j.kind, j.endpoint_id, j.replay_id, j.lane_key, j.state, j.attempted_at,
              r.error
  ),
  history AS (
    INSERT INTO outbox.deliveries (job_id, attempt, event_id, kind, endpoint_id, replay_id, outcome, attempted_at,
                                   duration_ms, error)
    SELECT r.id, r.attempt, r.event_id, r.kind, r.endpoint_id, r.replay_id, r.state, r.attempted_at, 0, r.error
    FROM rescued AS r
    ORDER BY r.id
    ON CONFLICT ON CONSTRAINT deliveries_pkey DO NOTHING
  )
  SELECT r.endpoint_id, r.lane_key FROM rescued AS r;
END
$$;

-- record_fenced_attempts keeps in the history the attempts of in_attempts
-- whose outcome the fence refused (not written_ids, written_attempts): a
-- worker that lost its job to the rescuer, whose request may still have
-- reached the receiver. Such an attempt has no outcome; over the row its
-- rescue wrote (rescue_jobs), its answer replaces the rescue's guess, and
-- so it is kept even once its job has left the queue. Writing a batch
-- again writes the same values.
CREATE OR REPLACE FUNCTION outbox.record_fenced_attempts(in_attempts json, written_ids bigint[], written_attempts integer[])
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  WITH fenced AS MATERIALIZED (
    SELECT a.*
    FROM json_to_recordset(in_attempts)
         AS a(job_id bigint, attempt integer, duration_ms integer, status_code integer, error text, excerpt text)
    WHERE NOT EXISTS (SELECT 1 FROM unnest(written_ids, written_attempts) AS w(id, attempt)
                      WHERE w.id = a.job_id AND w.attempt = a.attempt)
  )
  INSERT INTO outbox.deliveries AS d (job_id, attempt, event_id, kind, endpoint_id, replay_id, duration_ms,
                                      status_code, error, response_excerpt)
  SELECT a.job_id, a.attempt, k.event_id, k.kind, k.endpoint_id, k.replay_id, a.duration_ms,
         nullif(a.status_code, 0), a.error, a.excerpt
  FROM fenced AS a
  -- Its job's columns, by key: from its row in the history (its rescue's)
  -- or, without one, from the queue.
  CROSS JOIN LATERAL (
    (SELECT h.event_id, h.kind, h.endpoint_id, h.replay_id
     FROM outbox.deliveries AS h WHERE h.job_id = a.job_id AND h.attempt = a.attempt)
    UNION ALL
    (SELECT j.event_id, j.kind, j.endpoint_id, j.replay_id FROM outbox.jobs AS j WHERE j.id = a.job_id)
    LIMIT 1
  ) AS k
  ORDER BY a.job_id, a.attempt
  ON CONFLICT ON CONSTRAINT deliveries_pkey DO UPDATE
  SET status_code = EXCLUDED.status_code, duration_ms = EXCLUDED.duration_ms,
      response_excerpt = EXCLUDED.response_excerpt, finished_at = EXCLUDED.finished_at
  WHERE d.outcome IS DISTINCT FROM 'completed';
END
$$;

-- run_again puts the jobs in_ids back in the queue, to run again, by
-- hand or by a replay: due now and not finished, with their error history
-- kept; a delivery in an ordered lane is put back held, and takes its
-- turn by fan-out order (the caller advances its lane). A job that used
-- all its attempts gets one more, so the claim's attempt + 1 stays within
-- max_attempts. A finished job joins replay in_replay_id (NULL: it runs
-- live); a waiting one keeps its replay, the retry only bringing its next
-- attempt forward. A running job is left as it is. It returns each job's
-- endpoint and ordered lane.
CREATE OR REPLACE FUNCTION outbox.run_again(in_ids bigint[], in_replay_id bigint)
RETURNS TABLE (endpoint_id bigint, lane_key text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  UPDATE outbox.jobs AS j
  SET state = 'available',
      scheduled_at = CASE WHEN j.lane_key IS NULL THEN now() ELSE 'infinity' END,
      finalized_at = NULL,
      max_attempts = greatest(j.max_attempts, j.attempt + 1),
      replay_id = CASE WHEN j.state IN ('discarded', 'completed') THEN in_replay_id ELSE j.replay_id END
  WHERE j.id = ANY (in_ids)
    AND j.state <> 'running'
  RETURNING j.endpoint_id, j.lane_key;
END
$$;

-- discard_jobs ends the waiting jobs in_ids (available or retryable; a
-- running one is left to finish) without a request: discarded, with
-- in_error as their last error. A held one of an ordered lane loses its
-- 'infinity' (it no longer waits for a turn). It returns each one's
-- endpoint and ordered lane, which the caller advances.
CREATE OR REPLACE FUNCTION outbox.discard_jobs(in_ids bigint[], in_error text)
RETURNS TABLE (endpoint_id bigint, lane_key text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  UPDATE outbox.jobs AS j
  SET state = 'discarded',
      finalized_at = now(),
      scheduled_at = least(j.scheduled_at, now()),
      errors = j.errors || jsonb_build_array(jsonb_build_object('attempt', j.attempt, 'at', now(), 'error', in_error))
  WHERE j.id = ANY (in_ids)
    AND j.state IN ('available', 'retryable')
  RETURNING j.endpoint_id, j.lane_key;
END
$$;

-- fan_out_claiming is 0.6.0's relay pass that claimed for its own
-- workers: kept while 0.6.0's replicas roll, it fans out as fan_out does
-- and hands them nothing, and their workers claim what it made.
CREATE OR REPLACE FUNCTION outbox.fan_out_claiming(in_batch integer, in_subscribers jsonb, in_max_attempts integer,
                                                   in_breaker_delay double precision, in_origin text,
                                                   in_claim_batch integer, in_replica bigint, in_answered bigint[],
                                                   in_worker_share integer DEFAULT NULL, in_kinds text[] DEFAULT NULL)
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_claimed outbox.claimed_job[])
LANGUAGE sql VOLATILE
AS $$
  SELECT f.out_fanned, f.out_jobs, '{}'::outbox.claimed_job[]
  FROM outbox.fan_out(in_batch, NULL, in_subscribers, in_max_attempts, in_breaker_delay, in_origin) AS f
$$;

-- Serve the workers' claim, one lane at a time: an endpoint's waiting
-- deliveries, live ones apart from replayed ones, soonest first
-- (waiting_lanes, lock_due_jobs), and the jobs of no endpoint (in-process
-- subscribers, owner notifications, deliveries of a deleted endpoint),
-- soonest first. Partial, so they hold only the jobs waiting to run,
-- however many finished ones the table keeps. Led by the endpoint, not by
-- the due time, so that a hung endpoint's backlog does not sit in front
-- of everyone else's jobs; and live before replayed, so that a replay's
-- backlog does not sit in front of the live deliveries behind it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_waiting_by_endpoint
  ON outbox.jobs (endpoint_id, (replay_id IS NOT NULL), scheduled_at, id)
  WHERE state IN ('available', 'retryable') AND endpoint_id IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_waiting_live_by_endpoint;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_waiting_replay_by_endpoint;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_completed_by_endpoint_finalized_at;
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_failed_by_endpoint_finished_at
  ON outbox.deliveries (endpoint_id, finished_at)
  WHERE outcome IS DISTINCT FROM 'completed';
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_by_event_id
  ON outbox.deliveries (event_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_by_replay_finished_at
  ON outbox.deliveries (replay_id, finished_at)
  WHERE replay_id IS NOT NULL;

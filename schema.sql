-- schema.sql: every table, index and SQL function of outboxd, as a fresh
-- install has them, in the order an event moves through them. A new
-- database gets this file once, whole, in one transaction; a database of
-- an earlier release gets the numbered files of migrations/ instead,
-- which add up to this file. Each table is created once, whole: a
-- paragraph on its life cycle (who writes its rows, who reads them, what
-- bounds its growth, when rows go), its columns, constraints and storage
-- settings, its indexes, each named for the query it serves, and then
-- the functions and triggers that act on it.

-- Created only when missing: a managed PostgreSQL gives outboxd's role the
-- schema, empty, and no right to create schemas, which CREATE SCHEMA IF
-- NOT EXISTS asks for even when there is nothing to create
-- (docs/security.md, database privileges).
DO $$
BEGIN
  IF to_regnamespace('outbox') IS NULL THEN
    CREATE SCHEMA outbox;
  END IF;
END
$$;

COMMENT ON SCHEMA outbox IS
  'outboxd: transactional outbox, job table and inbox. Call outbox.record() inside your own transaction.';

-- migrations records each numbered file of migrations/ that this database
-- has. A fresh install records them all at once, since this file is what
-- they add up to; an upgrade records each as it applies it (migrate.go).
-- finished_at is set once a migration's online statements (indexes built
-- CONCURRENTLY, constraints validated) are done, NULL while they are not.
-- One row a migration: bounded.
CREATE TABLE outbox.migrations (
  version     integer     PRIMARY KEY CHECK (version > 0),
  name        text        NOT NULL UNIQUE,
  checksum    text        NOT NULL,
  applied_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);

--------------------------------------------------------------------------------
-- Topic patterns
--------------------------------------------------------------------------------

-- topic_matches says whether a topic is selected by a subscriber's patterns:
-- an empty list selects every topic, '*' selects every topic, 'order.*'
-- selects every topic that starts with 'order.', anything else must be equal.
-- outboxd validates patterns in Go (topicPatternValid) before storing them;
-- this is the one place they are evaluated, inside the fan-out statement.
--
-- Topics under 'outboxd.' are outboxd's own (an endpoint became failing or
-- was disabled). Only a pattern that names them selects them ('outboxd.*',
-- 'outboxd.endpoint.failing'); an empty list and '*' do not. Otherwise a
-- notification that endpoint X fails would be delivered to X as a webhook,
-- fail there, and feed on itself.
--
-- PL/pgSQL, a loop over the patterns with no query in it: a SQL function
-- would need subqueries, which keep it from being inlined, and its body
-- would be parsed and planned again in every statement that calls it, at
-- each of a relay pass's calls.
CREATE FUNCTION outbox.topic_matches(patterns text[], topic text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  own boolean := coalesce(starts_with(topic, 'outboxd.'), false);
  p text;
BEGIN
  IF patterns IS NULL THEN
    RETURN NULL;
  END IF;
  IF cardinality(patterns) = 0 THEN
    RETURN NOT own;
  END IF;
  FOREACH p IN ARRAY patterns LOOP
    IF own AND NOT starts_with(p, 'outboxd.') THEN
      CONTINUE;
    END IF;
    IF p = topic OR (p = '*' AND NOT own) OR (right(p, 2) = '.*' AND starts_with(topic, left(p, -1))) THEN
      RETURN true;
    END IF;
  END LOOP;
  RETURN false;
END
$$;

-- topic_split and topic_selected are topic_matches in two halves, for a
-- statement that tests one list of patterns against many events rather
-- than a few topics: a replay's walk of its window (replay.go,
-- replayCandidatesSQL). topic_split reads the patterns once: the names
-- they select exactly, the prefixes their '.*' patterns select ('order.'
-- for 'order.*'), and whether they select every topic but outboxd's own
-- (an empty list, or '*'). topic_selected then tests a topic with
-- operators alone: a SQL function of one expression, it is inlined into
-- the statement, where topic_matches is a PL/pgSQL call a row. Only
-- every_topic needs outboxd's own rule: a name or prefix that selects an
-- 'outboxd.' topic starts with 'outboxd.' itself. A replay's count batch
-- that walks a million events of other topics takes about half as long
-- with these as with the call a row. TestTopicMatchesAgreesWithSQL holds
-- the two forms equal.
CREATE FUNCTION outbox.topic_split(patterns text[], OUT names text[], OUT prefixes text[], OUT every_topic boolean)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  p text;
BEGIN
  IF patterns IS NULL THEN
    RETURN;
  END IF;
  names := '{}';
  prefixes := '{}';
  every_topic := cardinality(patterns) = 0;
  FOREACH p IN ARRAY patterns LOOP
    IF p = '*' THEN
      every_topic := true;
    ELSIF right(p, 2) = '.*' THEN
      prefixes := prefixes || left(p, -1);
    ELSE
      names := names || p;
    END IF;
  END LOOP;
END
$$;

CREATE FUNCTION outbox.topic_selected(topic text, names text[], prefixes text[], every_topic boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT topic = ANY(names) OR topic ^@ ANY(prefixes) OR (every_topic AND NOT topic ^@ 'outboxd.')
$$;

-- owner_admits is the tenancy boundary (docs/owners.md), written once:
-- whether an event addressed to event_owner (NULL: to no owner), of
-- topic, may reach an endpoint whose owner has key owner_key (NULL: an
-- endpoint of no owner), with that owner's allowed_topics (NULL: every
-- topic) and shared_topics (outbox.owners):
--
--   an endpoint of no owner    the events addressed to no owner;
--   an owner's endpoint        the events addressed to its owner whose
--                              topic the owner is allowed, and the events
--                              addressed to no owner whose topic the owner
--                              is shared ('{}': none).
--
-- Every statement that gives an endpoint an event tests it beside the
-- endpoint's own topics: the fan-out, a replay and its dry run, the gap
-- replay of a recovered endpoint, the ordered lanes' hold; and so does
-- every statement that shows an owner an event: the filter preview and
-- the portal's event page. An empty allowed list allows nothing, as an
-- empty shared list shares nothing: only NULL means every topic. One SQL
-- expression, so that the planner inlines it where it is called.
CREATE FUNCTION outbox.owner_admits(event_owner text, topic text, owner_key text,
                                    allowed_topics text[], shared_topics text[])
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE
    WHEN owner_key IS NULL THEN event_owner IS NULL
    WHEN event_owner IS NULL THEN cardinality(shared_topics) > 0 AND outbox.topic_matches(shared_topics, topic)
    ELSE event_owner = owner_key
         AND (allowed_topics IS NULL OR (cardinality(allowed_topics) > 0 AND outbox.topic_matches(allowed_topics, topic)))
  END
$$;

--------------------------------------------------------------------------------
-- Events: the outbox
--------------------------------------------------------------------------------

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
--
-- Every event row is updated once (fanned_out_at) and deleted once
-- (retention): a high-churn table. Vacuum it after 2% of its rows are dead
-- instead of PostgreSQL's default 20%, so the claim index stays small, and
-- after 2% of them were inserted (a bulk write, a backlog), so that the
-- first claims after it do not walk the visibility of every page. Its
-- vacuum is not throttled (cost delay 0): the relay's claims walk the dead
-- entries at the front of events_unfanned_by_id until a vacuum removes
-- them, and a throttled vacuum of a large backlog reaches them late, at
-- PostgreSQL's default pace for any table. fillfactor 90 leaves a page
-- room for the fanned-out version of its rows (the update cannot be HOT:
-- fanned_out_at is in the claim index's predicate), so the relay's update
-- dirties the page it read, not one more.
-- TestQueueTablesVacuumAggressively pins these numbers.
CREATE TABLE outbox.events (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic          text        NOT NULL,
  subject        text        NOT NULL DEFAULT '',
  -- NULL once erased (erased_at), and only then: outbox.erase_subject.
  payload        jsonb       DEFAULT '{}',
  -- owner addresses the event to one owner of endpoints (outbox.owners.key,
  -- a key the application chooses, such as its own customer id): the
  -- fan-out sends an event with an owner only to that owner's endpoints,
  -- and one without (NULL) only to endpoints of no owner and to those
  -- whose owner shares its topic (owner_admits, above). No foreign key: an
  -- event may be addressed to a key no owner has yet, and keeps its
  -- address when an owner is deleted.
  owner          text,
  -- Trace context (W3C): a producer inside a trace sets outbox.traceparent
  -- (and outbox.tracestate) for its transaction, SET LOCAL or
  -- set_config(..., true); outbox.record and the watch triggers store it
  -- with the event, and every delivery sends it as the traceparent and
  -- tracestate headers, so the receiver's trace continues from the
  -- business write. NULL: the transaction set none.
  traceparent    text,
  tracestate     text,
  -- When the event was recorded: the clock at the insert, not now(), the
  -- start of the producer's transaction, which may have begun long before
  -- (committed_at). Used for display, replays, the webhook's timestamp and
  -- latency where the commit's time is not known; never to decide what to
  -- relay.
  created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  -- When the recording transaction committed, as closely as PostgreSQL
  -- tells: where the time from commit to first 2xx starts (webhook.go).
  -- The insert cannot know it, so it starts NULL; the first change outboxd
  -- makes to the row sets it with commit_time (below), and no later change
  -- alters it. That change is the relay's claim (mark_claimed_fanned_out),
  -- or before it a relay failure (relay.go) or a requeue (outbox.go).
  committed_at   timestamptz,
  fanned_out_at  timestamptz,
  relay_attempts integer     NOT NULL DEFAULT 0,
  relay_error    text,
  poisoned_at    timestamptz,
  -- When an erasure of its subject (outbox.erase_subject) erased its
  -- payload; NULL while it has one.
  erased_at      timestamptz,
  -- true for a test send's event (topics.go, POST
  -- /api/endpoints/{id}/test): recorded by outboxd for one endpoint,
  -- already fanned out, with a job of its own (jobs.test); replays pass
  -- it by. NULL for every event an application records, so that
  -- outbox.record writes nothing more for it.
  test           boolean,

  CONSTRAINT events_topic_format CHECK (topic ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}$'),
  CONSTRAINT events_subject_length CHECK (length(subject) <= 500),
  -- 1 MiB: an event is a fact, not a file. A larger payload fails the
  -- business transaction at once rather than every delivery later.
  CONSTRAINT events_payload_size CHECK (pg_column_size(payload) <= 1048576),
  -- The owners' key's format (owners_key_format): an address no owner
  -- could have fails the recording, as a bad topic does, rather than reach
  -- nobody unseen.
  CONSTRAINT events_owner_format CHECK (owner ~ '^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$'),
  -- What a stored trace context is, which every delivery sends as it is.
  -- outbox.record passes what the transaction set through
  -- outbox.trace_context, which keeps what is valid and drops or cuts the
  -- rest, so these never fail a recording: a trace is not worth a business
  -- write. One regular expression each (the lookaheads refuse all-zero
  -- ids): a NULL, the common case, costs the check nothing, and ANDs of
  -- substr() and repeat() instead make outbox.record 1.4 times slower in
  -- bulk.
  CONSTRAINT events_traceparent_format CHECK (
    traceparent ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'
  ),
  CONSTRAINT events_tracestate_format CHECK (
    length(tracestate) <= 512 AND tracestate ~ '^[ -~]*$'
  ),
  CONSTRAINT events_relay_attempts_nonnegative CHECK (relay_attempts >= 0),
  CONSTRAINT events_fanned_or_poisoned CHECK (fanned_out_at IS NULL OR poisoned_at IS NULL),
  -- An erased event has no payload and is out of the relay's backlog: the
  -- erasure marks it fanned out, with no delivery.
  CONSTRAINT events_erased_without_payload CHECK (
    (payload IS NULL) = (erased_at IS NOT NULL) AND (erased_at IS NULL OR fanned_out_at IS NOT NULL)
  )
) WITH (
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0,
  fillfactor = 90
);

-- Serves the relay's claim (outbox.claim_unfanned): "un-fanned, not
-- poisoned, oldest first". The predicate is exactly the claim's WHERE.
CREATE INDEX events_unfanned_by_id
  ON outbox.events (id)
  WHERE fanned_out_at IS NULL AND poisoned_at IS NULL;

-- Serves the poisoned count and list on the overview.
CREATE INDEX events_poisoned_by_id
  ON outbox.events (id)
  WHERE poisoned_at IS NOT NULL;

-- Serves the search by payload (GET /api/events?payload=, the events
-- page): "the events whose payload contains this JSON object", jsonb @>.
-- jsonb_path_ops keeps one hash a path to a value, smaller and faster for
-- @> than the default operator class, which also serves the key-exists
-- operators nothing here asks. What it costs a producer is in
-- docs/performance.md.
CREATE INDEX events_by_payload
  ON outbox.events USING gin (payload jsonb_path_ops);

-- Serves events retention (retention.go): "fanned out before the cutoff,
-- oldest first". Un-fanned and poisoned rows, which retention never deletes,
-- stay out of it, so the hourly delete walks only rows it may remove instead
-- of scanning the whole table.
CREATE INDEX events_fanned_by_fanned_out_at
  ON outbox.events (fanned_out_at)
  WHERE fanned_out_at IS NOT NULL;

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
-- A row with relay_attempts or relay_error set has been changed since its
-- insert, so its xmin is that change's, not the recording's: it gets
-- created_at. VOLATILE, like pg_xact_commit_timestamp, so that it can be
-- inlined into the UPDATEs.
CREATE FUNCTION outbox.commit_time(ev outbox.events, ev_xmin xid)
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

-- claim_unfanned locks up to batch un-fanned events, oldest first, from
-- id scan_from on, for the caller's transaction: claim_to_fan_out's batch,
-- and the relay's list of rows to retry one by one after a batch failed
-- (relay.go), which must not mark them, since the marking may be what
-- fails. scan_from is the relay's scan bound (advance_relay_scan, below):
-- no event below it can be waiting. It is a function to carry SET
-- enable_sort = off, which leaves walking events_unfanned_by_id in id
-- order as the one plan, stopping after one batch. A matching index is not
-- enough: a planner that underestimates the backlog (statistics from
-- before a bulk import or an outage, or none yet) reads every un-fanned
-- row and sorts them, on every pass, however long the backlog. PL/pgSQL,
-- so that the plan is made once per session, not on every call.
CREATE FUNCTION outbox.claim_unfanned(batch integer, scan_from bigint DEFAULT 0)
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

-- advance_relay_scan moves the relay's scan bound: the id from which its
-- claim looks for events to fan out. Without one, every claim walks
-- events_unfanned_by_id from its start, and while a long transaction
-- anywhere in the database holds back the xmin horizon, the index keeps an
-- entry for every event fanned out since it began: none can be removed or
-- marked dead, and each claim reads them all. The bound skips them.
--
-- The cursor bug a bound invites: an event that commits late with an id
-- below it would never be claimed. So the bound moves in two steps, each
-- a call of this function (the relay calls it about once a second,
-- relay.go). The first names a candidate: the lowest id still waiting
-- (or, with none waiting, one past the highest id), with the snapshot's
-- xmax in the same statement. An event below the candidate that this
-- snapshot cannot see belongs to a transaction that drew its id before the
-- candidate's was drawn, so before the candidate's transaction committed,
-- and that had its xid by then (outbox.record takes one before it draws an
-- id; the ids come from an identity sequence without a cache, so they are
-- drawn in order): an xid below that xmax. A later call whose snapshot's
-- xmin has reached that xmax has seen every such transaction end: below
-- the candidate, what is waiting now is all that will ever wait, and the
-- bound moves to the lowest of it, or to the candidate. A snapshot held by
-- a transaction that wrote nothing has no xid and does not hold the
-- bound back; one that wrote does, until it ends, and the claims read the
-- entries left since.
--
-- A requeued event (poisoned, then its poisoned_at cleared: requeueEventSQL
-- in outbox.go, or an operator's UPDATE) waits again below the bound:
-- each requeue counts in outbox.events_requeued (count_requeue, below),
-- after its update took an xid, and a call that sees the count changed
-- starts over from 0. The bound lives in the relay's memory: a relay that
-- restarts starts from 0, and replicas keep their own.
CREATE SEQUENCE outbox.events_requeued;

CREATE FUNCTION outbox.count_requeue() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('outbox.events_requeued');
  RETURN NULL;
END
$$;

CREATE TRIGGER events_count_requeues
  AFTER UPDATE OF poisoned_at ON outbox.events
  FOR EACH ROW
  WHEN (OLD.poisoned_at IS NOT NULL AND NEW.poisoned_at IS NULL AND NEW.fanned_out_at IS NULL)
  EXECUTE FUNCTION outbox.count_requeue();

CREATE FUNCTION outbox.advance_relay_scan(in_from bigint, in_candidate bigint, in_candidate_xmax xid8,
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

-- claim_to_fan_out is the relay's claim (fan_out): it locks up to
-- in_batch events from in_scan_from on with claim_unfanned, or with
-- in_event_id that one event if it is still waiting, for the caller's
-- transaction, and returns their ids. fan_out calls it in a statement of its own, before the statement
-- that reads the endpoints: each statement of a PL/pgSQL function sees the
-- rows committed when it began, so the endpoints are read as they were
-- after the claim, and every endpoint committed before an event it claimed
-- gets the event. (Claimed from inside the statement that reads the
-- endpoints, an event committed after that statement began could be
-- claimed while an endpoint committed before the event was not seen: the
-- event was marked fanned out with no delivery to it.)
CREATE FUNCTION outbox.claim_to_fan_out(in_batch integer, in_event_id bigint, in_scan_from bigint DEFAULT 0)
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
CREATE FUNCTION outbox.mark_claimed_fanned_out(in_claimed bigint[])
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

-- relay_state is one row: whether a relay may be asleep waiting for a
-- notification (idle) or every relay that is awake keeps claiming without
-- one (busy). Producers notify only while it says idle. A NOTIFY is not
-- free: a transaction that sent one takes a single cluster-wide lock at
-- commit and holds it until the commit is done, so notifying commits are
-- serialized one behind another; at 16 concurrent single-row producers
-- that is most of outbox.record's cost (docs/performance.md). A
-- relay that is claiming pass after pass needs no wake-up; only one about
-- to sleep does.
--
-- Relays write it (relay.go, Run; notify.go): busy when notifications come
-- in while a pass runs and the pass found events, idle before sleeping.
-- It starts idle, and a missing row reads as idle: when in doubt, notify.
CREATE TABLE outbox.relay_state (
  singleton  boolean     PRIMARY KEY DEFAULT true,
  idle       boolean     NOT NULL DEFAULT true,
  changed_at timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT relay_state_one_row CHECK (singleton)
);

INSERT INTO outbox.relay_state DEFAULT VALUES;

-- Wake the relays: one NOTIFY per statement, and PostgreSQL folds identical
-- notifications within a transaction into one, so a transaction that records
-- 2,000 events sends a single wake-up. The payload is empty on purpose: the
-- notification is a hint, the relay claims whatever is un-fanned.
--
-- No NOTIFY while relay_state says busy. Why no event then waits for the
-- sweep (a sleeping relay with the event un-fanned):
--
--   Producer P, in its trigger: (1) takes its recording lock, the shared
--   advisory lock (1868722290, its own backend pid), held to its commit;
--   (2) reads the flag, in a statement of its own, so with a snapshot
--   taken after (1); (3) notifies if idle; commits.
--   A relay going to sleep: (a) commits idle; (b) lists the backends
--   holding a recording lock (pg_locks) and waits for each in turn, taking
--   and at once releasing that backend's lock exclusively (notify.go,
--   awaitRecorders); (c) re-checks: a relay pass; then sleeps.
--
--   If P read busy, (2)'s snapshot predates (a)'s commit, so (1) came
--   before (a) and P's lock is in pg_locks at (b) unless P already ended;
--   either way P has committed (or rolled back) before (c), whose pass
--   sees its event. If P read idle, it notifies; a notification sent by a
--   commit after the relay's LISTEN reaches it, and one before reaches
--   nobody but is followed by the listener's "look now" once it listens
--   (notify.go). Several relays, one flag: whichever relay commits idle
--   runs (b) and (c) for every producer that read busy before it; a relay
--   that set busy keeps claiming until it goes through (a) to (c) itself;
--   a stale idle costs a NOTIFY, nothing more. A relay that dies while
--   busy leaves the flag busy: events then wait for another relay's sweep,
--   which sets it idle again; latency, never an event.
--
-- The lock is per backend, not one key for all: a relay waiting for a
-- producer that keeps its transaction open (a slow business transaction
-- after its record) queues behind that one backend, while every other
-- producer's shared request on a single key would queue behind the
-- relay's exclusive one until that slow transaction ended.
--
-- Only READ COMMITTED gives (2) a snapshot after (1). A REPEATABLE READ or
-- SERIALIZABLE transaction reads with the snapshot of its first statement,
-- which may predate (a) whatever the lock says, so it always notifies.
--
-- 1868722290 is 0x6f627072, "obpr", notify.go's recordingLockClass. It is
-- the only two-key advisory lock with that first key: claim_lane_jobs' lane
-- locks use hashtext('outbox.claim_jobs'), advance_lanes' ones
-- hashtext('outbox.advance_lanes') and hashtext('outbox.advance_lanes/lane'),
-- and outboxd's one-key locks (schema, retention, owner mail) live in
-- another key space.
CREATE FUNCTION outbox.notify_events() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('transaction_isolation') = 'read committed' THEN
    PERFORM pg_advisory_xact_lock_shared(1868722290, pg_backend_pid());
    IF NOT (SELECT s.idle FROM outbox.relay_state AS s) THEN
      RETURN NULL;
    END IF;
  END IF;
  PERFORM pg_notify('outbox_events', '');
  RETURN NULL;
END
$$;

CREATE TRIGGER events_notify_relay
  AFTER INSERT ON outbox.events
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_events();

-- traceparent_repaired is the traceparent trace_context keeps, and the
-- repair it names: a valid one of version 00 as it is; one of a later
-- version read as 00 ('traceparent_downgraded'); any other NULL
-- ('traceparent_dropped'; no repair for an empty one).
CREATE FUNCTION outbox.traceparent_repaired(in_traceparent text, OUT traceparent text, OUT repair text)
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
CREATE FUNCTION outbox.trace_context(in_traceparent text, in_tracestate text,
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

-- Trace context repaired is counted in one sequence per repair that
-- trace_context names, read by /metrics (outbox.go, readTraceRepairs):
-- nextval neither waits for nor holds up another transaction, and the
-- recording that repairs nothing never calls it. A sequence counts outside
-- transactions, so a repair counts even if its recording rolls back, and
-- after a crash a count may jump ahead by up to 32 (PostgreSQL logs a
-- sequence's values 32 ahead).
CREATE SEQUENCE outbox.trace_repairs_traceparent_dropped;
CREATE SEQUENCE outbox.trace_repairs_traceparent_downgraded;
CREATE SEQUENCE outbox.trace_repairs_tracestate_dropped;
CREATE SEQUENCE outbox.trace_repairs_tracestate_truncated;

-- record is the producer API. Call it inside the transaction that makes the
-- business change: the event exists if and only if that transaction commits.
--
--   BEGIN;
--   UPDATE orders SET status = 'paid' WHERE id = 42;
--   SELECT outbox.record('order.paid', '42', '{"amount": 1200}');
--   COMMIT;
--
-- owner addresses the event to the owner with that key (events.owner,
-- owner_admits): outbox.record('invoice.paid', 'inv_7', '{...}', 'cust_42')
-- reaches only the endpoints of the owner whose key is 'cust_42'. NULL or
-- '' addresses it to no owner.
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
CREATE FUNCTION outbox.record(topic text, subject text, payload jsonb, owner text)
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

-- The three-argument form records an event addressed to no owner. A form
-- of its own, not a default of the four-argument one: grants name this
-- signature (docs/security.md, database privileges), and beside it a
-- default would make every three-argument call ambiguous. SECURITY
-- DEFINER like it, so that a role granted only this form records;
-- PL/pgSQL, whose RETURN of a call runs without planning a statement.
CREATE FUNCTION outbox.record(topic text, subject text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN outbox.record(topic, subject, payload, NULL::text);
END
$$;

-- watch_row is the trigger function behind outbox.watch(). TG_ARGV[0] is the
-- topic; then, for a watch that addresses its events (owner_column), the
-- argument 'owner=' and the column whose value is the event's owner; the
-- remaining arguments name the table's primary-key columns, whose values
-- (comma-separated) become the event's subject. The payload carries the
-- operation and the row before and after. A watch without owner_column
-- passes no 'owner=' argument, and its events are addressed to no owner.
-- Like outbox.record, it runs as its owner, so the application's writes
-- record events without any right on outboxd's tables; a table's owner
-- needs EXECUTE on it to install the triggers (outbox.watch).
CREATE FUNCTION outbox.watch_row() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  row_json  jsonb := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
  subject   text := '';
  owner     text;
  first_key integer := 1;
  i         integer;
BEGIN
  IF TG_NARGS > 1 AND starts_with(TG_ARGV[1], 'owner=') THEN
    owner := row_json ->> substr(TG_ARGV[1], length('owner=') + 1);
    first_key := 2;
  END IF;
  FOR i IN first_key .. TG_NARGS - 1 LOOP
    subject := subject || CASE WHEN i > first_key THEN ',' ELSE '' END
                       || coalesce(row_json ->> TG_ARGV[i], '');
  END LOOP;
  PERFORM outbox.record(
    TG_ARGV[0],
    subject,
    jsonb_build_object(
      'op',    lower(TG_OP),
      'table', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME,
      'old',   CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
      'new',   CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END
    ),
    owner
  );
  RETURN NULL;
END
$$;

-- Recording is a right to grant, not a default: functions are executable
-- by PUBLIC unless revoked, and these run as outboxd's role.
REVOKE EXECUTE ON FUNCTION outbox.record(text, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.record(text, text, jsonb, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.watch_row() FROM PUBLIC;

-- watch records an event with the given topic on every INSERT and DELETE of
-- tbl, and on an UPDATE only when one of the watched columns really changed
-- (NULL-safe). The check is the UPDATE trigger's WHEN clause, so a no-op
-- update never even calls the trigger function. An empty or NULL column list
-- watches every column. owner_column, when given, names the column whose
-- value addresses each event to an owner (outbox.record's owner): a
-- customer_id column makes every change of a customer's row an event for
-- that customer's endpoints alone. Calling it again with the same table
-- and topic replaces the triggers; outbox.unwatch removes them.
CREATE FUNCTION outbox.watch(tbl regclass, topic text, columns text[], owner_column text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  trigger_base text := 'outbox_watch_' || left(md5(topic), 12);
  key_columns  text[];
  missing      text;
  changed      text;
  trigger_args text;
BEGIN
  IF topic !~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,199}$' THEN
    RAISE EXCEPTION 'outbox.watch: topic % is not a valid topic', quote_literal(topic)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  SELECT c INTO missing
  FROM unnest(array_remove(coalesce(columns, '{}') || owner_column, NULL)) AS c
  WHERE NOT EXISTS (
    SELECT 1 FROM pg_attribute a
    WHERE a.attrelid = tbl AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped
  )
  LIMIT 1;
  IF missing IS NOT NULL THEN
    RAISE EXCEPTION 'outbox.watch: table % has no column %', tbl, quote_ident(missing)
      USING ERRCODE = 'undefined_column';
  END IF;

  SELECT array_agg(a.attname::text ORDER BY k.ord) INTO key_columns
  FROM pg_index i
  CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
  WHERE i.indrelid = tbl AND i.indisprimary;

  trigger_args := array_to_string(
    ARRAY(SELECT quote_literal(x)
          FROM unnest(array_remove(ARRAY[topic, 'owner=' || owner_column] || coalesce(key_columns, '{}'), NULL)) AS x),
    ', ');

  IF coalesce(cardinality(columns), 0) = 0 THEN
    changed := 'OLD.* IS DISTINCT FROM NEW.*';
  ELSE
    SELECT string_agg(format('OLD.%1$I IS DISTINCT FROM NEW.%1$I', c), ' OR ')
      INTO changed
    FROM unnest(columns) AS c;
  END IF;

  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trigger_base || '_ins_del', tbl);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trigger_base || '_upd', tbl);
  EXECUTE format(
    'CREATE TRIGGER %I AFTER INSERT OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION outbox.watch_row(%s)',
    trigger_base || '_ins_del', tbl, trigger_args);
  EXECUTE format(
    'CREATE TRIGGER %I AFTER UPDATE ON %s FOR EACH ROW WHEN (%s) EXECUTE FUNCTION outbox.watch_row(%s)',
    trigger_base || '_upd', tbl, changed, trigger_args);
END
$$;

CREATE FUNCTION outbox.unwatch(tbl regclass, topic text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  trigger_base text := 'outbox_watch_' || left(md5(topic), 12);
BEGIN
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trigger_base || '_ins_del', tbl);
  EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', trigger_base || '_upd', tbl);
END
$$;

--------------------------------------------------------------------------------
-- Topics: the event catalog
--------------------------------------------------------------------------------

-- One row per topic the admin registered (topics.go, POST /api/topics,
-- the panel's Topics page): what its events mean (description) and what
-- one looks like (example, any JSON value), for the people who subscribe
-- endpoints to it, and the payload a test send delivers (POST
-- /api/endpoints/{id}/test). The catalog documents topics; it does not
-- decide them: outbox.record takes any topic of the events' format, and
-- never reads this table, so a producer pays nothing for it. An owner
-- sees the topics its endpoints may receive (owner_admits). Bounded by
-- the API: at most 1,000 topics (topics.go, maxTopics), each example
-- at most 64 KiB (the CHECK).
CREATE TABLE outbox.topics (
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

--------------------------------------------------------------------------------
-- Idempotency keys: POST /api/events records once per key
--------------------------------------------------------------------------------

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
CREATE TABLE outbox.idempotency_keys (
  key            text        PRIMARY KEY,
  request_digest bytea       NOT NULL,
  event_id       bigint      NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT idempotency_keys_key_length CHECK (length(key) BETWEEN 1 AND 255),
  CONSTRAINT idempotency_keys_request_digest_length CHECK (length(request_digest) = 32)
);

-- Serves the retention sweep's oldest-first delete.
CREATE INDEX idempotency_keys_by_created_at
  ON outbox.idempotency_keys (created_at);

--------------------------------------------------------------------------------
-- Owners: whom endpoints belong to
--------------------------------------------------------------------------------

-- One row per owner (owners.go), created, given a new token and deleted by
-- the admin. An owner signs in to /api/ and the panel with its token, obo_
-- + a selector + a verifier: the row holds the selector, which finds it,
-- and the SHA-256 of the verifier, compared in constant time; so the table
-- holds nothing that signs in. Rotation replaces both: the old token is
-- refused from the commit on, on every replica. Bounded by the admin, who
-- creates every row. Deleting an owner leaves its endpoints to the admin
-- (endpoints.owner_id) and ends its sessions and sign-in links (below, with
-- the panel's sessions).
--
-- What an owner receives, and what it may ask for (docs/owners.md). The
-- admin sets every column; the owner's token changes none of them.
--
--   key                        the address events carry to reach this
--                              owner's endpoints (events.owner): text the
--                              admin chooses, such as the application's
--                              own customer id. An owner made without one
--                              gets 'owner-' and its id (owners_default_key).
--   allowed_topics             the topics of the events addressed to it that
--                              its endpoints may receive; NULL: every topic.
--   shared_topics              the topics of events addressed to no owner
--                              that its endpoints receive too; '{}': none.
--   max_endpoints              the most endpoints it may have.
--   max_in_flight              the highest max_in_flight its endpoints may
--                              ask for. The defaults, 10 endpoints of 8,
--                              hold at most 80 of the 128 default workers:
--                              one owner never takes them all.
--   max_rate_limit_per_second  the highest rate limit its endpoints may ask
--                              for; NULL: any, and none.
--   max_replay_window_seconds  how far back its replays may reach; NULL: as
--                              far as events retention keeps events.
--
-- The API checks an owner's endpoint against these when the owner writes
-- it (owners.go, ownerGrants.limit); the fan-out and replays test the topics
-- again (owner_admits), so that narrowing them takes effect at once.
CREATE TABLE outbox.owners (
  id                        bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  key                       text             NOT NULL,
  name                      text             NOT NULL,
  token_selector            text             NOT NULL,
  token_hash                bytea            NOT NULL,
  token_rotated_at          timestamptz      NOT NULL DEFAULT now(),
  allowed_topics            text[],
  shared_topics             text[]           NOT NULL DEFAULT '{}',
  max_endpoints             integer          NOT NULL DEFAULT 10,
  max_in_flight             integer          NOT NULL DEFAULT 8,
  max_rate_limit_per_second double precision,
  max_replay_window_seconds bigint,
  created_at                timestamptz      NOT NULL DEFAULT now(),

  CONSTRAINT owners_key_unique UNIQUE (key),
  CONSTRAINT owners_key_format CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$'),
  CONSTRAINT owners_name_length CHECK (length(name) BETWEEN 1 AND 200),
  CONSTRAINT owners_token_selector_format CHECK (token_selector ~ '^[0-9a-f]{24}$'),
  CONSTRAINT owners_token_hash_length CHECK (length(token_hash) = 32),
  CONSTRAINT owners_token_selector_unique UNIQUE (token_selector),
  CONSTRAINT owners_allowed_topics_count CHECK (cardinality(allowed_topics) <= 100),
  CONSTRAINT owners_shared_topics_count CHECK (cardinality(shared_topics) <= 100),
  CONSTRAINT owners_max_endpoints_range CHECK (max_endpoints BETWEEN 0 AND 10000),
  CONSTRAINT owners_max_in_flight_range CHECK (max_in_flight BETWEEN 1 AND 1000),
  CONSTRAINT owners_max_rate_limit_range CHECK (max_rate_limit_per_second BETWEEN 0.01 AND 10000),
  CONSTRAINT owners_max_replay_window_range CHECK (max_replay_window_seconds >= 0)
);

-- owners_default_key gives an owner made without a key 'owner-' and its
-- id, which the identity column has drawn before a BEFORE trigger runs
-- (owners.go, createOwnerSQL).
CREATE FUNCTION outbox.owners_default_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.key := coalesce(NEW.key, 'owner-' || NEW.id);
  RETURN NEW;
END
$$;

CREATE TRIGGER owners_default_key
  BEFORE INSERT ON outbox.owners
  FOR EACH ROW EXECUTE FUNCTION outbox.owners_default_key();

--------------------------------------------------------------------------------
-- Endpoints: where webhooks go
--------------------------------------------------------------------------------

-- An endpoint's filter (below) is held to the rules of filter_problem by a
-- CHECK of the table, so those functions come first.

-- filter_problem says why a parsed filter may not be stored, or NULL when
-- it may. jsonb_path_match with silent => true turns what a payload can
-- cause (a missing member, a wrong type, a division by zero) into
-- unknown, which the fan-out counts as no match; what remains are errors
-- of the filter itself, which would fail every fan-out of its topics and
-- poison the events, so they are refused here:
--   - a variable ($name): the fan-out passes none, and a missing one
--     raises;
--   - .datetime() and the other date and time methods: comparing a time
--     with a zone to one without raises unless a time zone is given
--     (jsonb_path_match_tz, which depends on the session's TimeZone);
--     ISO 8601 strings compare in order as strings;
--   - not a predicate ('$.a'): evaluated on an empty object, a predicate
--     answers exactly one true, false or unknown (null), whatever the
--     payload; a path answers its items ('$.a' none, '$' the object).
-- And what would make a filter's cost grow faster than its payload's
-- size, evaluated in the fan-out's one statement for every event of its
-- topics (docs/filters.md, "What is refused", says why each one is):
--   - .** at any level, with or without bounds;
--   - keyvalue() more than once;
--   - a subscript that is a list or an expression, not [*], a number,
--     last or a range of them;
--   - like_regex more than 8 times, or a pattern with a backreference
--     or a lookaround constraint (filter_regex_problem);
--   - $ inside a filter expression ? (...), and a comparison of two
--     paths (filter_operand_problem).
-- Every rule reads the normalised text PostgreSQL prints for the path,
-- with its string literals (member names among them) emptied first: a
-- variable prints as $"name", a member as ."name", and a keyword or a
-- method can no longer hide in a string. PL/pgSQL, so that the probe
-- runs only after the checks passed: a SQL function's CASE could be
-- folded with its constant arguments, the probe first.
-- endpoints_filter_allowed runs it on every write of a filtered
-- endpoint's row.
CREATE FUNCTION outbox.filter_problem(f jsonpath)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  printed text := f::text;
  bare text := regexp_replace(printed, '"(\\.|[^"\\])*"', '""', 'g');
  -- bare without its subscripts of bounded cost: [*], a number, last
  -- (less or more a number), or a range of them.
  unsubscripted text := regexp_replace(bare, '\[(\*|(-?[0-9]+(\.[0-9]+)?|last( [-+] [0-9]+)?)( to (-?[0-9]+(\.[0-9]+)?|last( [-+] [0-9]+)?))?)\]', '', 'g');
BEGIN
  IF f IS NULL THEN
    RETURN NULL;
  END IF;
  IF bare ~ '\$""' THEN
    RETURN 'a filter may not use variables ($name): none are passed to it';
  END IF;
  IF bare ~ '\.(datetime|date|time|time_tz|timestamp|timestamp_tz)\(' THEN
    RETURN '.datetime() is not supported, nor are the other date and time methods (comparing times with and without a time zone raises an error); compare ISO 8601 strings instead, e.g. $.at >= "2026-01-01"';
  END IF;
  IF bare ~ '\.\*\*' THEN
    RETURN '.** (any level) is not allowed: what follows it visits each value once for every value above it, quadratic in the payload''s depth; name the members instead, e.g. $.order.items[*].sku';
  END IF;
  IF bare ~ '\.keyvalue\(\).*\.keyvalue\(\)' THEN
    RETURN 'keyvalue() may appear once: applied to its own result, directly or in a filter expression, it makes three objects of each, 3^(n-1) times as many for n';
  END IF;
  IF (length(bare) - length(replace(bare, 'like_regex', ''))) / length('like_regex') > 8 THEN
    RETURN 'like_regex may appear at most 8 times: each pattern runs on every value it is given, and PostgreSQL keeps only 32 compiled patterns a connection for all the filters of a pass';
  END IF;
  IF unsubscripted ~ '\[' THEN
    RETURN 'a subscript is [*], a number, last, last - n, or a range of them (1 to last): a list such as [0,0] selects an element as often as it names it, and an expression is evaluated again for every array';
  END IF;
  RETURN coalesce(CASE WHEN bare ~ 'like_regex' THEN outbox.filter_regex_problem(printed) END,
                  outbox.filter_operand_problem(unsubscripted),
                  outbox.filter_predicate_problem(f));
END
$$;

-- filter_predicate_problem is filter_problem's last rule: not a
-- predicate. Apart, so that its probe runs only once every other rule
-- passed.
CREATE FUNCTION outbox.filter_predicate_problem(f jsonpath)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  probe jsonb := jsonb_path_query_array('{}'::jsonb, f, '{}'::jsonb, true);
BEGIN
  IF jsonb_array_length(probe) <> 1 OR jsonb_typeof(probe -> 0) NOT IN ('boolean', 'null') THEN
    RETURN 'not a predicate: it selects values rather than answering true or false (write a comparison, e.g. $.paid == true rather than $.paid)';
  END IF;
  RETURN NULL;
END
$$;

-- filter_regex_problem says which like_regex pattern of printed (a
-- filter's normalised text) may not be stored, or NULL. PostgreSQL
-- matches a pattern without backreferences in time linear in the string
-- (an automaton); a backreference (\1 to \9) makes it try the string's
-- splits, a polynomial of a degree that grows with their number, and a
-- lookaround constraint ((?=, (?!, (?<=, (?<!) runs again from every
-- position. Each pattern is read back from its printed JSON string.
CREATE FUNCTION outbox.filter_regex_problem(printed text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  pattern text;
BEGIN
  FOR pattern IN
    SELECT m[1]::jsonb #>> '{}'
    FROM regexp_matches(printed, 'like_regex ("(?:\\.|[^"\\])*")', 'g') AS m
  LOOP
    IF pattern ~ '(^|[^\\])(\\\\)*\\[1-9]' THEN
      RETURN 'a like_regex pattern may not use backreferences (\1 to \9): matching one takes time that grows as a power of the string''s length';
    END IF;
    IF pattern ~ '\(\?<?[=!]' THEN
      RETURN 'a like_regex pattern may not use lookahead or lookbehind ((?=, (?!, (?<=, (?<!): each one scans the string again from every position';
    END IF;
  END LOOP;
  RETURN NULL;
END
$$;

-- filter_operand_problem says which rule of the filter's operands
-- unsubscripted (its normalised text, string literals emptied, and its
-- subscripts taken out once filter_problem refused any but [*], a number,
-- last or a range: a list selects an element as often as it names it,
-- [0,0][0,0]... doubling the items at each step, and an expression is
-- evaluated for every array the path meets) breaks, or NULL:
--   - $ inside a filter expression ? (...): the path is evaluated again
--     for every item the filter tests;
--   - a comparison of two paths: each item of one side is compared with
--     each item of the other, and lax mode unwraps arrays, so $.a == $.b
--     costs the product of their lengths. A side that is arithmetic is a
--     single value (arithmetic takes one a side, or is unknown).
-- After the subscripts and method calls are read, each path is one
-- letter, R from $ and P from @ (a signed one too: unary minus maps over
-- the items), and the text is read a token at a time, with a stack of
-- the parentheses open: operand is what the current operand is so far
-- (none, path or other), lhs the left operand of an open comparison. A
-- filter expression keeps the path it filters a path.
CREATE FUNCTION outbox.filter_operand_problem(unsubscripted text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
  s text;
  tok text;
  depth integer := 0;
  opened text[] := '{}';
  outer_operand text[] := '{}';
  outer_lhs text[] := '{}';
  filters integer := 0;
  operand text := 'none';
  lhs text;
BEGIN
  s := regexp_replace(unsubscripted, '\.[a-z_]+\([^()]*\)', '.m', 'g');
  s := regexp_replace(s, '[-+]?\$(\.(""|\*|m))*', 'R', 'g');
  s := regexp_replace(s, '[-+]?@(\.(""|\*|m))*', 'P', 'g');
  s := regexp_replace(s, '\)(\.(""|\*|m))+', ')', 'g');
  s := regexp_replace(s, '(\?\(|[()])', ' \1 ', 'g');
  FOREACH tok IN ARRAY regexp_split_to_array(btrim(s), ' +') LOOP
    IF tok IN (')', '&&', '||') AND lhs = 'path' AND operand = 'path' THEN
      EXIT;
    END IF;
    CASE
      WHEN tok IN ('?(', '(') THEN
        depth := depth + 1;
        opened[depth] := tok;
        outer_operand[depth] := operand;
        outer_lhs[depth] := lhs;
        filters := filters + (tok = '?(')::integer;
        operand := 'none';
        lhs := NULL;
      WHEN tok = ')' THEN
        lhs := outer_lhs[depth];
        operand := CASE WHEN opened[depth] = '?(' THEN outer_operand[depth] ELSE 'other' END;
        filters := filters - (opened[depth] = '?(')::integer;
        depth := depth - 1;
      WHEN tok IN ('R', 'P') THEN
        IF tok = 'R' AND filters > 0 THEN
          RETURN '$ inside a filter expression ? (...) is not allowed: it is evaluated again for every item the filter tests; refer to the item with @';
        END IF;
        operand := CASE WHEN operand = 'none' THEN 'path' ELSE 'other' END;
      WHEN tok IN ('==', '!=', '<', '<=', '>', '>=') THEN
        lhs := operand;
        operand := 'none';
      WHEN tok IN ('&&', '||') THEN
        lhs := NULL;
        operand := 'none';
      ELSE
        operand := 'other';
    END CASE;
  END LOOP;
  IF lhs = 'path' AND operand = 'path' THEN
    RETURN 'a comparison of two paths ($.a == $.b) is not allowed: each item of one side is compared with each item of the other, and lax mode unwraps arrays; compare a path with a value, or, where each side is one value, make one side arithmetic ($.total == $.net + 0)';
  END IF;
  RETURN NULL;
END
$$;

-- An endpoint is a URL that receives every event whose topics its patterns
-- select (outbox.topic_matches; an empty list selects all), as a signed
-- webhook. Rows are written through the API (endpoints.go); the workers
-- change only failing_since, the lane's state (below: the failure count,
-- the breaker, a hold, the rate limit's next start), the receiver's dedup
-- window (below) and, on a 410, disabled_at; the prober, its recovery
-- columns (below). Its state is derived, never stored:
--
--   enabled   (disabled_at IS NULL, failing_since IS NULL)
--   failing   (disabled_at IS NULL, failing_since IS NOT NULL): a delivery
--             failed and none has succeeded since. Deliveries go on; once
--             the circuit breaker is open (below), fan-out schedules the
--             new ones FailingEndpointDelay (5 min) out and the claim lets
--             one attempt at a time through, so a dead receiver does not
--             take a burst of doomed attempts.
--   paused    (disabled_at IS NULL, paused_at IS NOT NULL): held by an
--             operator. Fan-out still enqueues for it; the claim takes
--             nothing of it until it is resumed. Nothing is discarded.
--   disabled  (disabled_at IS NOT NULL): by its owner, by a 410 Gone from
--             the receiver, or after 5 days of continuous failure;
--             disabled_reason says which, disabled_cause who (below).
--             Fan-out enqueues nothing for it, and its queued deliveries
--             end without a request. Enabling it clears disabled_* and
--             failing_since.
--
-- secret signs every delivery (HMAC-SHA256, Standard Webhooks). A rotation
-- keeps the old one as previous_secret until previous_secret_expires_at, and
-- deliveries carry both signatures until then, so a receiver can switch at
-- its own pace. Deleting an endpoint keeps its jobs (endpoint_id becomes
-- NULL): they end without a request, recorded as such. Bounded by the
-- admin and, for an owner's endpoints, by the owner's max_endpoints.
--
-- The Go side validates first (validateEndpointURL, topicPatternValid,
-- checkFilter) and answers 400 with a reason; the CHECKs keep a direct SQL
-- write honest too.
CREATE TABLE outbox.endpoints (
  id                            bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  -- An http(s) URL, or mailto: for an endpoint that receives its events
  -- as mail (mail.go).
  url                           text             NOT NULL,
  description                   text             NOT NULL DEFAULT '',
  owner_email                   text             NOT NULL DEFAULT '',
  -- The owner who may see and manage it through the portal; NULL: the
  -- admin's alone. Deleting the owner leaves it to the admin.
  owner_id                      bigint           REFERENCES outbox.owners (id) ON DELETE SET NULL,
  topics                        text[]           NOT NULL DEFAULT '{}',

  -- filter narrows what an endpoint receives beyond its topics: a SQL/JSON
  -- path predicate over the event's payload, in jsonb_path_match's syntax
  -- ('$.status == "paid" && $.amount_cents > 1000'), kept as it was written
  -- for the API to echo; NULL: every event of its topics (docs/filters.md).
  -- filter_path is it parsed, once, when it is written: the fan-out tests
  -- it against every event its topics pass, and a text would be parsed
  -- again for each. A filter that does not parse fails the write here; the
  -- Go side says why before it comes to that (filters.go, checkFilter).
  filter                        text,
  filter_path                   jsonpath         GENERATED ALWAYS AS (filter::jsonpath) STORED,
  -- filter_error says why the relay stopped evaluating the endpoint's
  -- filter, and filter_error_at since when: the filter raised an error that
  -- silent does not cover, or ran past its share of a relay pass (relay.go,
  -- holdFailingFilters). Every pass shares one statement, so a filter that
  -- fails it fails every endpoint's fan-out; held, the filter is not
  -- evaluated, and every event of the endpoint's topics counts as not
  -- matched for it (fanout_stats.filter_errors) until its filter is written
  -- again, which clears both (the same text tries it again). The relay
  -- sets them, after trying the filter alone on the events of the pass
  -- that failed; the API and the panel show them.
  filter_error                  text,
  filter_error_at               timestamptz,
  -- 'subject' makes every subject an ordered lane of the endpoint
  -- (outbox.advance_lanes, below): its deliveries run one at a time, in
  -- fan-out order. 'none' (the default): no order.
  ordering                      text             NOT NULL DEFAULT 'none',

  secret                        bytea            NOT NULL,
  previous_secret               bytea,
  previous_secret_expires_at    timestamptz,
  -- public_key says that secret is the seed of an ed25519 private key, and
  -- is its public key (32 bytes): the endpoint signs with Standard
  -- Webhooks' asymmetric scheme, v1a, and its receiver verifies with this
  -- key, which the API shows. NULL: secret is an HMAC key (v1).
  -- previous_public_key is the same of previous_secret, read only while
  -- previous_secret_expires_at is ahead: a rotation, or a switch between
  -- the schemes, moves both (signature.go, endpoints.go).
  public_key                    bytea,
  previous_public_key           bytea,

  -- The endpoint's TLS material (clientcert.go): the client certificate
  -- (PEM, leaf first) and its private key that deliveries present to a
  -- receiver asking for mutual TLS, set and removed together, with the
  -- leaf's expiry kept beside them for the overview's
  -- client_certificate_expiring alert; and ca_certificate (PEM), the only
  -- authorities the receiver's own certificate may chain to. The key is
  -- PEM text, or with -secrets-key sealed (secrets.go, sealBlob: first
  -- byte 2).
  client_certificate            text,
  client_key                    bytea,
  client_certificate_expires_at timestamptz,
  ca_certificate                text,

  -- The endpoint's own request settings (endpointrequest.go,
  -- docs/endpoints.md#retries-timeout-and-headers), each NULL for the
  -- service's default: max_attempts lowers the attempts a job stamped
  -- with -job-max-attempts may make, never raises them; a failure later
  -- than retry_window_seconds after a job's first failed attempt is not
  -- retried; timeout_seconds replaces -webhook-timeout for its requests.
  -- The workers read them with every claim (claim.go), so a change
  -- reaches the next attempt of every queued delivery.
  --
  -- headers are the static headers every request carries, as the API
  -- shows them: name to value, or to {"secret": true} for a secret one,
  -- whose value is in secret_headers alone: a JSON object of name to
  -- value, with -secrets-key sealed to the row (secrets.go, sealBlob:
  -- first byte 2), without it the JSON text ('{').
  max_attempts                  integer,
  retry_window_seconds          integer,
  timeout_seconds               integer,
  headers                       jsonb            NOT NULL DEFAULT '{}',
  secret_headers                bytea,

  -- An endpoint is a lane of its own (outbox.claim_lane_jobs): its trouble
  -- holds up its own deliveries and nobody else's. The columns the claim
  -- reads:
  --
  --   max_in_flight         at most this many of its deliveries run at once,
  --                         counted over every replica (16 by default: a
  --                         receiver that hangs holds a quarter of the 64
  --                         default workers, never all of them).
  --   rate_limit_per_second NULL: none. Else the claim spaces its requests
  --                         1/rate apart across every replica.
  --   rate_next_at          when the next request may start under the rate
  --                         limit; the claim advances it by 1/rate for every
  --                         job it takes (GCRA's theoretical arrival time).
  --   consecutive_failures  attempts failed since the last success; the
  --                         completer counts them (record_outcomes).
  --   breaker_opened_at     set by the completer when consecutive_failures
  --                         reaches -breaker-threshold (5), cleared by the
  --                         next success. While open: one attempt at a time,
  --                         and fan-out schedules new deliveries 5 min out.
  --   held_until            a 429 or 503 with Retry-After holds the whole
  --                         endpoint until then, not just the one job.
  --   paused_at             an operator's pause (POST .../pause).
  max_in_flight                 integer          NOT NULL DEFAULT 16,
  rate_limit_per_second         double precision,
  rate_next_at                  timestamptz,
  consecutive_failures          integer          NOT NULL DEFAULT 0,
  breaker_opened_at             timestamptz,
  held_until                    timestamptz,
  paused_at                     timestamptz,

  -- The receiver's dedup window, as a 2xx answer last advertised it in
  -- webhook-dedup-window (outboxd's own header, webhook.go): how long after
  -- a first delivery the receiver still recognises a second one, in
  -- seconds, and when an answer last said so. The completer writes it with
  -- the attempt (record_outcomes), on a change and at most hourly
  -- otherwise; a 2xx without the header clears it, and so does a new URL;
  -- any other answer leaves it. NULL: none advertised. Replays and retries
  -- by hand to the endpoint are clamped to it (replay.go), a delivery that
  -- may have reached the receiver before is not sent again past it
  -- (outbox.claim_lane_jobs, resend.go), and the overview alerts while it is
  -- shorter than this sender's resend horizon.
  dedup_window_seconds          bigint,
  dedup_window_seen_at          timestamptz,

  failing_since                 timestamptz,
  disabled_at                   timestamptz,
  disabled_reason               text,
  -- Who disabled the endpoint, beside the reason text:
  --
  --   operator  POST .../disable (endpoints.go). An operator's disable of
  --             an endpoint already disabled keeps its first reason and
  --             time, and becomes the cause: the endpoint stays off until
  --             enabled.
  --   gone      the receiver answered 410 Gone (record_outcomes), to a
  --             delivery or to a probe.
  --   failure   failing continuously for -endpoint-disable-after (5 days;
  --             retention.go).
  --
  -- NULL while enabled. An endpoint disabled with no cause is never
  -- probed: its cause is unknown.
  disabled_cause                text,

  -- Recovery probes: an endpoint disabled for failure, with
  -- recovery_probes on (the default; PATCH {"recovery_probes": false} opts
  -- out) and an http(s) URL, gets a signed probe (probe.go) on the schedule
  -- of outbox.probe_interval. The prober writes next_probe_at and
  -- last_probe_at when it claims a probe, before it sends it, and
  -- last_probe_error with the answer. A 2xx re-enables the endpoint with
  -- recovered_at and recovered_reason, and recovery_replay_from, the start
  -- of the replay of what it missed, which stays set until the replay's
  -- last catch-up pass has run. Probes add no rows: each one updates its
  -- endpoint's row.
  recovery_probes               boolean          NOT NULL DEFAULT true,
  next_probe_at                 timestamptz,
  last_probe_at                 timestamptz,
  last_probe_error              text,
  recovered_at                  timestamptz,
  recovered_reason              text,
  recovery_replay_from          timestamptz,

  created_at                    timestamptz      NOT NULL DEFAULT now(),
  -- The last change through the API; state changes by the workers have
  -- their own timestamps.
  updated_at                    timestamptz      NOT NULL DEFAULT now(),

  CONSTRAINT endpoints_url_scheme CHECK (url ~ '^(https?://|mailto:)' AND length(url) <= 2048),
  CONSTRAINT endpoints_description_length CHECK (length(description) <= 1000),
  CONSTRAINT endpoints_owner_email_length CHECK (length(owner_email) <= 254),
  CONSTRAINT endpoints_topics_count CHECK (cardinality(topics) <= 100),
  -- At most 4,096 bytes (filters.go, maxFilterLen): a filter is a
  -- predicate, not a program.
  CONSTRAINT endpoints_filter_length CHECK (length(filter) <= 4096),
  -- Every filter keeps filter_problem's rules, but a held one
  -- (filter_error_at), which is never evaluated. A rule added later holds
  -- the filters stored before it that it refuses, with the rule that
  -- refuses each, rather than fail: its endpoint gets no event of its
  -- topics until the filter is written again, and every other write of its
  -- row goes through (a CHECK is evaluated on every update of the row, the
  -- completer's of its health among them).
  CONSTRAINT endpoints_filter_allowed CHECK (filter_error_at IS NOT NULL OR outbox.filter_problem(filter_path) IS NULL),
  CONSTRAINT endpoints_filter_error_with_time CHECK ((filter_error IS NULL) = (filter_error_at IS NULL)),
  CONSTRAINT endpoints_filter_error_length CHECK (length(filter_error) <= 2100),
  CONSTRAINT endpoints_ordering_known CHECK (ordering IN ('none', 'subject')),
  -- 24 to 64 bytes: the range Standard Webhooks recommends. With
  -- -secrets-key, outboxd stores every secret sealed (secrets.go): exactly
  -- 98 bytes, starting with the format's version byte 1, whatever the
  -- secret's length. A database may hold both: `outboxd secrets encrypt`
  -- seals the plaintext ones.
  CONSTRAINT endpoints_secret_length CHECK (
    length(secret) BETWEEN 24 AND 64
    OR (length(secret) = 98 AND get_byte(secret, 0) = 1)
  ),
  CONSTRAINT endpoints_previous_secret_expires CHECK (
    (previous_secret IS NULL) = (previous_secret_expires_at IS NULL)
  ),
  CONSTRAINT endpoints_public_key_length CHECK (length(public_key) = 32),
  CONSTRAINT endpoints_previous_public_key_length CHECK (length(previous_public_key) = 32),
  CONSTRAINT endpoints_client_certificate_pair CHECK (
    (client_certificate IS NULL) = (client_key IS NULL)
    AND (client_certificate IS NULL) = (client_certificate_expires_at IS NULL)
  ),
  -- 32 kB each is maxPEMLen; a sealed key is 33 bytes longer.
  CONSTRAINT endpoints_client_certificate_length CHECK (length(client_certificate) <= 32768),
  CONSTRAINT endpoints_client_key_length CHECK (length(client_key) <= 32768 + 33),
  CONSTRAINT endpoints_ca_certificate_length CHECK (length(ca_certificate) <= 32768),
  -- Only TLS carries them: on an http:// or mailto: endpoint they would
  -- be kept and never used.
  CONSTRAINT endpoints_tls_material_https CHECK (
    (client_certificate IS NULL AND ca_certificate IS NULL) OR url LIKE 'https://%'
  ),
  CONSTRAINT endpoints_max_in_flight_range CHECK (max_in_flight BETWEEN 1 AND 1000),
  CONSTRAINT endpoints_rate_limit_range CHECK (rate_limit_per_second BETWEEN 0.01 AND 10000),
  CONSTRAINT endpoints_consecutive_failures_nonnegative CHECK (consecutive_failures >= 0),
  CONSTRAINT endpoints_dedup_window CHECK (
    (dedup_window_seconds IS NULL) = (dedup_window_seen_at IS NULL)
    AND dedup_window_seconds > 0
  ),
  CONSTRAINT endpoints_disabled_with_reason CHECK (
    (disabled_at IS NULL) = (disabled_reason IS NULL)
  ),
  CONSTRAINT endpoints_disabled_reason_length CHECK (length(disabled_reason) <= 500),
  CONSTRAINT endpoints_disabled_cause CHECK (
    disabled_cause IS NULL
    OR (disabled_cause IN ('operator', 'gone', 'failure') AND disabled_at IS NOT NULL)
  ),
  CONSTRAINT endpoints_last_probe_error_length CHECK (length(last_probe_error) <= 2100),
  CONSTRAINT endpoints_recovered_reason_length CHECK (length(recovered_reason) <= 1000),
  -- endpointrequest.go's bounds: never more attempts than the default
  -- schedule's 18, no window past what those 18 span (the sum of
  -- attempt^4 s for attempts 1 to 17), a timeout of 1 s to a minute.
  CONSTRAINT endpoints_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 18),
  CONSTRAINT endpoints_retry_window_range CHECK (retry_window_seconds BETWEEN 1 AND 327369),
  CONSTRAINT endpoints_timeout_range CHECK (timeout_seconds BETWEEN 1 AND 60),
  -- At most 20 headers of 8 KiB in all (maxHeadersBytes); escaped as JSON
  -- text they take at most twice that, and sealed 33 bytes more.
  CONSTRAINT endpoints_headers_object CHECK (jsonb_typeof(headers) = 'object' AND length(headers::text) <= 16384),
  CONSTRAINT endpoints_secret_headers_length CHECK (length(secret_headers) <= 16384 + 33)
);

-- Serves the fan-out: the enabled endpoints, read for every relay pass.
CREATE INDEX endpoints_enabled_by_id
  ON outbox.endpoints (id)
  WHERE disabled_at IS NULL;

-- Serves the fan-out: the endpoints whose filter is held, read once by a
-- pass that meets a filtered endpoint (outbox.fan_out, routed). Almost
-- always empty.
CREATE INDEX endpoints_filter_held
  ON outbox.endpoints (id)
  WHERE filter_error_at IS NOT NULL;

-- Serves the sweep that disables endpoints failing for too long.
CREATE INDEX endpoints_failing_by_failing_since
  ON outbox.endpoints (failing_since)
  WHERE failing_since IS NOT NULL AND disabled_at IS NULL;

-- Serves an owner's endpoint list and the ownership check of every route
-- under /api/endpoints/{id} an owner's token calls (owners.go), and the
-- SET NULL of an owner's delete.
CREATE INDEX endpoints_by_owner_id
  ON outbox.endpoints (owner_id)
  WHERE owner_id IS NOT NULL;

--------------------------------------------------------------------------------
-- Jobs: outboxd's own queue
--------------------------------------------------------------------------------

-- A job's state; the jobs table's comment (below) is its life.
CREATE TYPE outbox.job_state AS ENUM ('available', 'running', 'retryable', 'completed', 'discarded');

-- Replays come first: a job names the replay that enqueued it.
--
-- A replay is an operator's request to send an endpoint deliveries again:
-- the events of a window (kind 'replay', replay.go) or its discarded
-- deliveries (kind 'retry_discarded', jobs.go). The jobs it enqueues or
-- sets to run again carry its id (jobs.replay_id) and run in the
-- endpoint's replay lane (outbox.claim_lane_jobs): behind its live deliveries,
-- and at most replay_width(endpoint, max_in_flight) at once. Its columns:
--
--   window_from, window_to, topics  what a 'replay' selected (the window
--                   after the clamp); NULL for 'retry_discarded'.
--   jobs_total      the jobs it enqueues. A 'retry_discarded' adds them
--                   batch by batch. A 'replay' counts them when it starts,
--                   as its dry run counts (replay.go, replayCountSQL), and
--                   is set to jobs_enqueued once its last batch is
--                   enqueued, or it is cancelled: what the events and
--                   their deliveries then were may differ from the count.
--   jobs_enqueued   the jobs enqueued so far.
--   enqueue_after   a 'replay''s cursor: the last event id its enqueue
--                   has passed. A replay is enqueued lazily, a batch
--                   at a time as its lane drains (replay.go, feedReplays),
--                   not all at its start, whose burst of inserts would
--                   be the worst minute of live latency beside it. NULL
--                   for a 'retry_discarded', enqueued at once, and for a
--                   replay until its count is written. The count starts
--                   it just before the first event it found.
--   last_event_id   a 'replay''s end: the last event its count found,
--                   where its enqueue stops, so that its last batch does
--                   not walk through every event recorded since (a
--                   statement of seconds beside live traffic). Written
--                   with enqueue_after, NULL where it is.
--   enqueued_at     when its last batch was enqueued; NULL while it still
--                   enqueues, so that it is not taken for finished between
--                   two batches.
--   cancelled_at    an operator's cancel: its waiting jobs were discarded
--                   then, and no batch enqueues after it.
--   finished_at     when its last job finished, written by the first read
--                   that finds none left (replay.go, settleReplaysSQL).
--
-- Bounded: every new replay of an endpoint deletes its finished replays
-- beyond the newest 20; an unfinished one has jobs waiting or running,
-- which the job table bounds. An endpoint's delete deletes its replays.
CREATE TABLE outbox.replays (
  id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  endpoint_id   bigint      NOT NULL REFERENCES outbox.endpoints (id) ON DELETE CASCADE,
  kind          text        NOT NULL,
  window_from   timestamptz,
  window_to     timestamptz,
  topics        text[],
  jobs_total    bigint      NOT NULL DEFAULT 0,
  jobs_enqueued bigint      NOT NULL DEFAULT 0,
  enqueue_after bigint,
  last_event_id bigint,
  created_at    timestamptz NOT NULL DEFAULT now(),
  enqueued_at   timestamptz,
  cancelled_at  timestamptz,
  finished_at   timestamptz,

  CONSTRAINT replays_kind_known CHECK (kind IN ('replay', 'retry_discarded')),
  CONSTRAINT replays_jobs_total_nonnegative CHECK (jobs_total >= 0),
  CONSTRAINT replays_finished_once_enqueued CHECK (finished_at IS NULL OR enqueued_at IS NOT NULL)
);

-- Serves an endpoint's replays, newest first, and the cascade from
-- endpoints.
CREATE INDEX replays_by_endpoint
  ON outbox.replays (endpoint_id, id);

-- Serves the workers' look for replays still to enqueue (replay.go,
-- feedReplays), several times a second.
CREATE INDEX replays_enqueuing
  ON outbox.replays (id)
  WHERE enqueued_at IS NULL AND enqueue_after IS NOT NULL;

-- A job is one delivery of one event to one in-process subscriber (kind
-- 'sub:<name>') or one endpoint (kind 'webhook', endpoint_id), still to be
-- done: the queue. The relay inserts it in the transaction that marks its
-- event fanned out. Its life:
--
--   available  → running    a worker claimed it (attempt += 1, attempted_at)
--   running    → (gone)     the handler succeeded: the job leaves the table
--                           in the transaction that writes its attempt to
--                           outbox.deliveries, the history
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
-- rescuer changes nothing. The job cleaner deletes discarded jobs after 7
-- days (and 'completed' ones, which only the release before writes, after
-- 24 h).
--
-- The job table churns as the events table does: every row is updated
-- when claimed, neither that update nor a retry's HOT (state is in the
-- claim indexes' predicates), and deleted when delivered. The same vacuum
-- settings as outbox.events, for the same reasons, and fillfactor 80:
-- room on a page for a claimed row's new version.
CREATE TABLE outbox.jobs (
  id           bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind         text             NOT NULL,
  -- Its event and, for a webhook job, its endpoint. Deleting the
  -- endpoint keeps the job (endpoint_id set NULL) so that it ends visibly,
  -- discarded with "endpoint deleted", rather than vanishing; deleting its
  -- event deletes it. jobs_by_event_id and jobs_one_per_event_endpoint
  -- serve the deletions.
  event_id     bigint           NOT NULL
                                CONSTRAINT jobs_event_id_fkey REFERENCES outbox.events (id) ON DELETE CASCADE,
  endpoint_id  bigint           CONSTRAINT jobs_endpoint_id_fkey REFERENCES outbox.endpoints (id) ON DELETE SET NULL,
  -- The replay that enqueued it or set it to run again. SET NULL when its
  -- row goes: only a finished replay's row is deleted, so only finished
  -- jobs lose it (a retry by hand of one then runs live).
  replay_id    bigint           REFERENCES outbox.replays (id) ON DELETE SET NULL,
  -- Its event's subject, for a delivery to an endpoint that orders by
  -- subject: its ordered lane (below, with advance_lanes).
  lane_key     text,
  state        outbox.job_state NOT NULL DEFAULT 'available',
  attempt      integer          NOT NULL DEFAULT 0,
  max_attempts integer          NOT NULL,
  created_at   timestamptz      NOT NULL DEFAULT now(),
  scheduled_at timestamptz      NOT NULL DEFAULT now(),
  attempted_at timestamptz,
  -- The replica whose claim last marked the job running
  -- (outbox.claim_lane_jobs), meaningful while it runs: the dead-replica
  -- rescue finds a dead replica's jobs by it, among the running ones
  -- (jobs_running_by_attempted_at: no index of its own, since running jobs
  -- are at most the replicas' worker slots). No foreign key: the row goes
  -- when its replica is declared dead, and the jobs' history keeps the id.
  held_by      bigint,
  finalized_at timestamptz,
  -- One object per failed attempt: {"attempt", "at", "error"}.
  errors       jsonb            NOT NULL DEFAULT '[]',
  -- true for a test send's delivery (events.test): its attempts go to the
  -- history like any other's, and not to the statistics
  -- (record_outcomes). NULL for every job the fan-out and replays insert.
  test         boolean,

  CONSTRAINT jobs_kind_length CHECK (length(kind) BETWEEN 1 AND 100),
  CONSTRAINT jobs_endpoint_only_for_webhooks CHECK (endpoint_id IS NULL OR kind = 'webhook'),
  CONSTRAINT jobs_replay_only_for_webhooks CHECK (replay_id IS NULL OR kind = 'webhook'),
  CONSTRAINT jobs_attempt_within_max CHECK (attempt >= 0 AND attempt <= max_attempts),
  CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts > 0),
  CONSTRAINT jobs_finalized_when_final CHECK (
    (state IN ('completed', 'discarded')) = (finalized_at IS NOT NULL)
  ),
  CONSTRAINT jobs_attempted_when_running CHECK (state <> 'running' OR attempted_at IS NOT NULL)
) WITH (
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0,
  fillfactor = 80
);

-- Serve the workers' claim, one lane at a time: an endpoint's waiting
-- deliveries, live ones apart from replayed ones, soonest first
-- (waiting_lanes, lock_due_jobs), and the jobs of no endpoint (in-process
-- subscribers, owner notifications, deliveries of a deleted endpoint),
-- soonest first. Partial, so they hold only the jobs waiting to run,
-- however many finished ones the table keeps. Led by the endpoint, not by
-- the due time, so that a hung endpoint's backlog does not sit in front
-- of everyone else's jobs; and live before replayed, so that a replay's
-- backlog does not sit in front of the live deliveries behind it.
CREATE INDEX jobs_waiting_by_endpoint
  ON outbox.jobs (endpoint_id, (replay_id IS NOT NULL), scheduled_at, id)
  WHERE state IN ('available', 'retryable') AND endpoint_id IS NOT NULL;
CREATE INDEX jobs_waiting_without_endpoint
  ON outbox.jobs (scheduled_at, id)
  WHERE state IN ('available', 'retryable') AND endpoint_id IS NULL;

-- Serve the claim's counts of an endpoint's deliveries in flight, which
-- it holds below the endpoint's cap, and of its replayed ones, which it
-- holds below the replay share: at most max_in_flight entries each.
CREATE INDEX jobs_running_by_endpoint
  ON outbox.jobs (endpoint_id)
  WHERE state = 'running' AND endpoint_id IS NOT NULL;
CREATE INDEX jobs_running_replay_by_endpoint
  ON outbox.jobs (endpoint_id)
  WHERE state = 'running' AND endpoint_id IS NOT NULL AND replay_id IS NOT NULL;

-- Serves the rescuer: jobs running for longer than the rescue horizon.
CREATE INDEX jobs_running_by_attempted_at
  ON outbox.jobs (attempted_at)
  WHERE state = 'running';

-- Serves advance_lanes: a lane's held deliveries by event id, the first
-- of which is its next; whether the lane has an active one is
-- jobs_one_active_per_lane's to say. Held ones only: a delivery made due,
-- then claimed, writes no entry here, where an index of every unfinished
-- delivery would take one at each of those changes, on the ordered
-- drain's every delivery.
CREATE INDEX jobs_held_by_lane_event
  ON outbox.jobs (endpoint_id, lane_key, event_id)
  WHERE lane_key IS NOT NULL
    AND state IN ('available', 'retryable', 'running')
    AND scheduled_at = 'infinity';

-- The ordered lanes' guarantee itself, whatever a statement elsewhere
-- does: a second active delivery in a lane is refused by the database.
CREATE UNIQUE INDEX jobs_one_active_per_lane
  ON outbox.jobs (endpoint_id, lane_key)
  WHERE lane_key IS NOT NULL
    AND state IN ('available', 'retryable', 'running')
    AND scheduled_at < 'infinity';

-- One delivery job per (event, endpoint): a second fan-out of an event to
-- the same endpoint is refused by the database, not delivered twice. Also
-- serves an endpoint's delivery list and the SET NULL on endpoint delete.
CREATE UNIQUE INDEX jobs_one_per_event_endpoint
  ON outbox.jobs (endpoint_id, event_id)
  WHERE endpoint_id IS NOT NULL;

-- Serves the event's job list, the ON DELETE CASCADE from events, and
-- retention's check that no unfinished job still needs an event.
CREATE INDEX jobs_by_event_id
  ON outbox.jobs (event_id);

-- Serves a replay's progress (replay.go): its jobs waiting or running,
-- and those finished in the last minute, by state; and the SET NULL when
-- a replay's row is deleted.
CREATE INDEX jobs_by_replay_state
  ON outbox.jobs (replay_id, state, finalized_at)
  WHERE replay_id IS NOT NULL;

-- Serves the job cleaner and the count of recent completions. Partial, so
-- that only a job's last change, to completed or discarded, writes an
-- entry, not each of its three changes of state.
CREATE INDEX jobs_finished_by_state_finalized_at
  ON outbox.jobs (state, finalized_at)
  WHERE state IN ('completed', 'discarded');

-- A job's attempts in the history (outbox.deliveries) go with its event,
-- in the deleting statement: the history keeps no foreign key, since a
-- delivered job leaves the queue while its attempts stay.
CREATE FUNCTION outbox.events_delete_history() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
BEGIN
  DELETE FROM outbox.deliveries AS d WHERE d.event_id = ANY (ARRAY(SELECT g.id FROM gone_events AS g));
  RETURN NULL;
END
$$;

CREATE TRIGGER events_delete_history
  AFTER DELETE ON outbox.events
  REFERENCING OLD TABLE AS gone_events
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.events_delete_history();

-- replay_share is how many of an endpoint's deliveries its replay lane
-- may run at once: a quarter of its cap, at least 1. replayShare in
-- replay.go is the same rule, for the dry run's estimate
-- (TestReplayShareNumbers).
CREATE FUNCTION outbox.replay_share(max_in_flight integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT greatest(1, max_in_flight / 4)
$$;

-- claimed_job is a claimed job as the workers run it: the job, its event
-- and, for a delivery, its endpoint; start_in_ms is its place in its
-- endpoint's rate limit, wake_on_outcome and replay_yields what its end
-- must do for the next claim (lane_jobs, below).
-- resend_window_seconds is, for a delivery that may have reached its
-- receiver before (an earlier attempt, or a replay's), the dedup window
-- the receiver advertised (NULL: none, or a first delivery), and
-- claimed_at the claim's now(), the clock of created_at: a resend past the
-- window is not sent (resend.go, resendTooLate). committed_at is the
-- event's commit time as the relay kept it (events.committed_at), or its
-- created_at where none was kept: where the time to the first 2xx starts.
-- claim_due_jobs returns it, and claim_lane_jobs it within a
-- claimed_lane_job; the workers read it as one column list (claim.go,
-- claimedColumns), by name.
--
-- A claim's row type changes only by attributes added at its end, which
-- the release before, reading its columns by name, does not see, each in
-- the migration that makes as_claimed_job fill it: a function whose
-- result held the type in another shape would fail the sessions of the
-- release before that kept its plan ("function return row and
-- query-specified return row do not match").
-- TestRollingUpgradeFromThePreviousReleaseLosesNothing runs the release
-- before's claim across such a change. public_key and previous_public_key
-- tell how to sign with secret and previous_secret (outbox.endpoints).
CREATE TYPE outbox.claimed_job AS (
  id bigint, kind text, attempt integer, max_attempts integer,
  endpoint_id bigint,
  event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
  traceparent text, tracestate text,
  url text, secret bytea, previous_secret bytea, disabled_reason text,
  start_in_ms integer, wake_on_outcome boolean, replay_yields boolean,
  resend_window_seconds bigint, claimed_at timestamptz, committed_at timestamptz,
  public_key bytea, previous_public_key bytea);

-- as_claimed_job is the claimed job (claimed_job) that a claim returns for
-- job id, of kind, at attempt (of max_attempts), to endpoint_id (NULL: a
-- subscriber's), of replay_id (NULL: live), claimed at attempted_at: its
-- event e and endpoint ep (a NULL row for a subscriber's), and what the
-- claim decided of its start and its end. Every claim builds its rows
-- here (claim_lane_jobs).
CREATE FUNCTION outbox.as_claimed_job(id bigint, kind text, attempt integer, max_attempts integer,
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

-- claimed_lane_job is a job claim_lane_jobs claimed, with lane_limit: the
-- most requests the claiming replica may have in flight to the job's
-- endpoint, as a claim ahead counts it (lane_room; NULL from any other
-- claim). A type of its own, not an attribute added to claimed_job, whose
-- shape never changes (above).
CREATE TYPE outbox.claimed_lane_job AS (job outbox.claimed_job, lane_limit integer);

-- The workers' claim (claim.go) takes up to batch due jobs, marks them
-- running with their next attempt number, and returns each with its event
-- and, for a delivery, its endpoint as it is at the claim, so an attempt
-- costs no second query. It is four parts, each below:
--
--   waiting_lanes  which lanes have jobs waiting: one probe per lane;
--   lane_room      how many more deliveries a lane may start now, and
--                  the one place of the claim ahead of its requests;
--   due_lanes      which lanes this claim serves, locked (statement 1);
--   lane_jobs      each lane's due jobs within its room, locked
--                  (statement 2, in a snapshot taken after the locks);
--
-- and claim_lane_jobs, which marks what lane_jobs locked running.
-- claim_due_jobs is the same claim without ahead.
--
-- A lane is an endpoint: its deliveries share its cap, rate limit,
-- breaker and Retry-After hold, counted in the database over every
-- replica. Inside it, replayed deliveries (replay_id set) wait behind the
-- live ones. The jobs of no endpoint (in-process subscribers and
-- outboxd's own) are one more lane, with no receiver to protect. Workers
-- are shared between the lanes with due work, round robin: every lane
-- gets its first job before any gets a second, and lanes whose oldest
-- due job has waited longest come first.

-- waiting_lanes lists each endpoint's waiting jobs as two lanes, live and
-- replayed, with the due time of the soonest (held deliveries of an
-- ordered lane wait at 'infinity'). A loose scan of
-- jobs_waiting_by_endpoint: one index probe per lane, however many jobs
-- wait in it.
CREATE FUNCTION outbox.waiting_lanes()
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
CREATE FUNCTION outbox.lane_room(ep outbox.endpoints, replica bigint, answered bigint[], worker_share integer,
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
CREATE FUNCTION outbox.due_lanes(batch integer, replica bigint, answered bigint[], worker_share integer,
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
CREATE FUNCTION outbox.lock_due_jobs(ep bigint, replayed boolean, n integer, kinds text[])
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
CREATE FUNCTION outbox.lane_jobs(lanes bigint[], batch integer, replica bigint, answered bigint[],
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
CREATE FUNCTION outbox.lock_replica(replica bigint)
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
CREATE FUNCTION outbox.claim_lane_jobs(batch integer, replica bigint, answered bigint[], ahead boolean,
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

-- claim_due_jobs is claim_lane_jobs without ahead: every running job not
-- answered holds its endpoint's place, and every job it claims may start
-- at once. A claim by hand (psql, the tests) calls it.
CREATE FUNCTION outbox.claim_due_jobs(batch integer, replica bigint DEFAULT NULL, answered bigint[] DEFAULT '{}',
                                      worker_share integer DEFAULT NULL, kinds text[] DEFAULT NULL)
RETURNS SETOF outbox.claimed_job
LANGUAGE sql VOLATILE
ROWS 100
AS $$
  SELECT (l.job).* FROM outbox.claim_lane_jobs(batch, replica, answered, false, '{}', worker_share, kinds) AS l
$$;

--------------------------------------------------------------------------------
-- Ordered lanes: one delivery at a time per (endpoint, subject)
--------------------------------------------------------------------------------

-- A delivery to an endpoint with ordering 'subject' carries its event's
-- subject as lane_key. Of the unfinished deliveries of one lane, at most
-- one is active (available, retryable or running, with a real due time);
-- the others are held: 'available' with scheduled_at 'infinity', which no
-- claim ever finds due and which sits at the end of the endpoint's lane in
-- jobs_waiting_by_endpoint, so a
-- lane's backlog costs the claim nothing. When the active delivery
-- finishes (completed or discarded), the held one of the lowest event id
-- becomes due: advance_lanes. Fan-out, retries by hand and replays insert
-- or put back lane deliveries held, and call advance_lanes too.
--
-- A replayed delivery is its subject's delivery like any other: its turn
-- comes by event id, and while it is its lane's active one it holds the
-- lane, waiting for and then running in the endpoint's replay lane (so it
-- counts against the replay share, and the subject's later live events
-- wait for it, as they would for any earlier event of their subject).
-- Cancelling its replay discards it and advances the lane.
--
-- jobs_held_by_lane_event finds a lane's next delivery, and
-- jobs_one_active_per_lane refuses a second active one (the jobs'
-- indexes, above).

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
CREATE FUNCTION outbox.advance_lanes(endpoint_ids bigint[], lane_keys text[], hold boolean)
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

-- advance_lanes without hold is hold true, the safe side: the relay's
-- advance of a poisoned event's lanes calls it (relay.go,
-- advanceLanesOfEventSQL).
CREATE FUNCTION outbox.advance_lanes(endpoint_ids bigint[], lane_keys text[])
RETURNS integer
LANGUAGE sql VOLATILE
AS $$
  SELECT outbox.advance_lanes(endpoint_ids, lane_keys, true)
$$;

-- lock_lanes takes advance_lanes' locks of the given lanes for the
-- caller's transaction, as advance_lanes says: each endpoint's, shared
-- (exclusive past 64 of its lanes), then each lane's, and with hold the
-- endpoints' rows FOR SHARE.
CREATE FUNCTION outbox.lock_lanes(endpoint_ids bigint[], lane_keys text[], hold boolean)
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

--------------------------------------------------------------------------------
-- The fan-out: events into jobs, one relay transaction as one statement
--------------------------------------------------------------------------------

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
-- for none), and in_scan_from the relay's scan bound (advance_relay_scan).
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
CREATE FUNCTION outbox.fan_out(in_batch integer, in_event_id bigint, in_subscribers jsonb,
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
CREATE FUNCTION outbox.route(marked outbox.events[])
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
CREATE FUNCTION outbox.enqueue_deliveries(marked outbox.events[], in_max_attempts integer,
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
CREATE FUNCTION outbox.enqueue_for_subscribers(marked outbox.events[], in_subscribers jsonb, in_max_attempts integer)
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
CREATE FUNCTION outbox.index_subjects(marked outbox.events[])
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

-- Wake the workers when jobs are inserted, the same way events wake the relay.
-- The payload names the relay process whose pass inserted them (its
-- outbox.fan_out sets outbox.relay_origin for its transaction; '' for any
-- other insert): that process's listener skips it, as its relay pokes its
-- own workers (notify.go, wakeups.origin).
CREATE FUNCTION outbox.notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('outbox_jobs', coalesce(current_setting('outbox.relay_origin', true), ''));
  RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_workers
  AFTER INSERT ON outbox.jobs
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_jobs();

--------------------------------------------------------------------------------
-- Deliveries: the history of every attempt
--------------------------------------------------------------------------------

-- One row per attempt of a job that ended: what it got back and what it
-- left its job. outbox.jobs is the queue, the work still to do; this is
-- the history. A job that completes leaves the queue in the transaction
-- that writes its attempt here (record_outcomes), so the panel, the
-- statistics, an event's "delivered to n of m" and a replay's progress
-- read what was delivered from here. Its columns:
--
--   job_id, attempt  the job and its attempt (no foreign key: a
--                    delivered job has no row in outbox.jobs);
--   event_id, kind, endpoint_id, replay_id  the job's, kept with the
--                    attempt (endpoint_id NULL for a job of no endpoint);
--   outcome          what the attempt left its job: completed, retryable
--                    or discarded; NULL for an attempt whose job had been
--                    taken from it (rescued, and run again) before its
--                    outcome was written;
--   status_code      the answer's (NULL when none came: a timeout, a
--                    refused address; and for a mail or a subscriber);
--   error            why it failed, or for a job completed without its
--                    effect (a notification over its owner's cap), why
--                    nothing was sent;
--   attempted_at     when its claim took the job (NULL where not known:
--                    an attempt the fence refused), so that finished_at -
--                    attempted_at is how long it held its place;
--   duration_ms, response_excerpt  how long its request took, and the
--                    start of the answer.
--
-- Bounded per job by max_attempts and per row by the CHECKs below, and
-- deleted with its event (events_delete_history), so events retention bounds
-- it.
CREATE TABLE outbox.deliveries (
  job_id           bigint           NOT NULL,
  attempt          integer          NOT NULL,
  event_id         bigint           NOT NULL,
  kind             text             NOT NULL,
  endpoint_id      bigint,
  replay_id        bigint,
  outcome          outbox.job_state,
  attempted_at     timestamptz,
  finished_at      timestamptz      NOT NULL DEFAULT now(),
  duration_ms      integer          NOT NULL,
  status_code      integer,
  error            text             NOT NULL DEFAULT '',
  response_excerpt text             NOT NULL DEFAULT '',

  PRIMARY KEY (job_id, attempt),
  CONSTRAINT deliveries_attempt_positive CHECK (attempt > 0),
  CONSTRAINT deliveries_duration_nonnegative CHECK (duration_ms >= 0),
  CONSTRAINT deliveries_status_code_http CHECK (status_code BETWEEN 100 AND 999),
  CONSTRAINT deliveries_error_length CHECK (length(error) <= 2100),
  CONSTRAINT deliveries_response_excerpt_length CHECK (length(response_excerpt) <= 1100),
  CONSTRAINT deliveries_outcome_final CHECK (outcome IN ('completed', 'retryable', 'discarded'))
);

-- Serves an endpoint's recent attempts on the panel.
CREATE INDEX deliveries_by_endpoint_finished_at
  ON outbox.deliveries (endpoint_id, finished_at);

-- Serves an endpoint's last failed attempts (the panel's health and
-- failure groups): partial, so that a healthy endpoint's successes are
-- not walked past to find them.
CREATE INDEX deliveries_failed_by_endpoint_finished_at
  ON outbox.deliveries (endpoint_id, finished_at)
  WHERE outcome IS DISTINCT FROM 'completed';

-- Serves an event's deliveries (its page, "delivered to n of m") and
-- their deletion with the event.
CREATE INDEX deliveries_by_event_id
  ON outbox.deliveries (event_id);

-- Serves a replay's progress: its deliveries of the last minute.
CREATE INDEX deliveries_by_replay_finished_at
  ON outbox.deliveries (replay_id, finished_at)
  WHERE replay_id IS NOT NULL;

--------------------------------------------------------------------------------
-- Delivery statistics: per endpoint and minute, shared by every replica
--------------------------------------------------------------------------------

-- One row per endpoint and minute in which a request was made to it: the
-- attempts, their outcomes by class, and the time from each delivered
-- event's commit to its first 2xx, counted into fixed buckets. The
-- completers write it (record_outcomes) in the transaction
-- that records the attempts' outcomes, with one INSERT ... ON CONFLICT DO
-- UPDATE per batch that adds to the row of each endpoint and minute, so
-- every replica's workers add to the same rows and the numbers survive a
-- restart. The panel, GET /api/stats and GET /api/endpoints/{id}/stats read
-- it (stats.go). Deleted by the retention sweep once minute is older than
-- -delivery-stats-retention (7 days): at most one row per endpoint and
-- minute of that window, whatever the delivery rate.
--
-- Classes (outcome.go, attemptClass): a success is a 2xx (or a mail
-- sent); a failure is a timeout (no answer within -webhook-timeout), a 4xx,
-- a 5xx, a connection failure (refused, reset, DNS, TLS, an address the
-- SSRF guard refused) or other (a 1xx or 3xx answer). attempts is always
-- their sum (the CHECK).
--
-- latency_buckets holds 19 counts: commit→first-2xx latencies of at most
-- 1, 2.5, 5, 10, 25, 50, 100, 250, 500 ms, 1, 2.5, 5, 10, 30, 60 s,
-- 5, 30, 60 min, and above 60 min (the last). The bounds are the ones
-- /metrics uses for the in-process histogram (metrics.go, latencyBuckets),
-- from a loopback delivery to a retry hours later; p50 and p99 are read
-- from them as the bound of the bucket holding the rank (stats.go).
--
-- No foreign key to outbox.endpoints, as in outbox.deliveries: an
-- endpoint's statistics outlive its deletion until retention takes them,
-- and the completers' upsert takes no lock on the endpoint row.
--
-- A row of the current minute is updated by every outcome batch, a few
-- hundred times a minute, never in an indexed column: HOT updates, as long
-- as its page has room for the new version. fillfactor 50 keeps that room,
-- and a vacuum after 50 dead versions whatever the table's size (scale
-- factor 0) keeps the page pruned.
CREATE TABLE outbox.delivery_stats (
  endpoint_id       bigint      NOT NULL,
  minute            timestamptz NOT NULL, -- the start of the minute the answers came in
  attempts          bigint      NOT NULL,
  successes         bigint      NOT NULL,
  failed_timeout    bigint      NOT NULL,
  failed_4xx        bigint      NOT NULL,
  failed_5xx        bigint      NOT NULL,
  failed_connection bigint      NOT NULL,
  failed_other      bigint      NOT NULL,
  latency_buckets   bigint[]    NOT NULL,

  PRIMARY KEY (endpoint_id, minute),
  CONSTRAINT delivery_stats_attempts_sum CHECK (
    attempts = successes + failed_timeout + failed_4xx + failed_5xx + failed_connection + failed_other),
  CONSTRAINT delivery_stats_latency_buckets_19 CHECK (
    array_ndims(latency_buckets) = 1 AND cardinality(latency_buckets) = 19)
) WITH (
  fillfactor = 50,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 50
);
-- Serves the all-endpoints window (GET /api/stats, the overview) and the
-- retention sweep's oldest-first delete; an endpoint's window reads the
-- primary key.
CREATE INDEX delivery_stats_by_minute
  ON outbox.delivery_stats (minute);

-- One row per endpoint and minute in which the relay fanned deliveries out
-- to it, or its filter kept events from it. The relay's fan-out statement
-- (outbox.fan_out, produced) adds to it in the transaction that enqueues
-- them, by the database's clock: one row per endpoint and pass, never one
-- per event. A table of its own, not columns of delivery_stats, so that
-- relays and completers never wait on each other's rows. Read and deleted
-- with delivery_stats (stats.go), by the same retention window. Updated by
-- every relay pass, with the storage settings of delivery_stats for the
-- same reason.
CREATE TABLE outbox.fanout_stats (
  endpoint_id    bigint      NOT NULL,
  minute         timestamptz NOT NULL,
  -- The deliveries fanned out (a replay's and a retry by hand's are not
  -- counted: they send again what was produced before).
  deliveries     bigint      NOT NULL,
  -- How many of the events that the endpoint's topics selected its filter
  -- kept from it (outbox.endpoints, filter). A row of an endpoint whose
  -- filter kept every event of a pass has deliveries 0 and no
  -- last_fanned_at.
  filtered_out   bigint      NOT NULL DEFAULT 0,
  -- How many of them the endpoint did not get because its filter was held
  -- after an error (outbox.endpoints, filter_error): not matched, as
  -- filtered_out, but for a fault of the filter rather than a verdict on
  -- the payload.
  filter_errors  bigint      NOT NULL DEFAULT 0,
  -- When the relay last fanned deliveries out to the endpoint in that
  -- minute: set by the same upsert that counts them, so it costs no write
  -- of its own. live_flows reads it.
  last_fanned_at timestamptz,

  PRIMARY KEY (endpoint_id, minute)
) WITH (
  fillfactor = 50,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 50
);

-- Serves the all-endpoints window and the retention sweep, as
-- delivery_stats_by_minute does.
CREATE INDEX fanout_stats_by_minute
  ON outbox.fanout_stats (minute);

--------------------------------------------------------------------------------
-- Outcomes: a batch of attempts' results, written in one transaction
--------------------------------------------------------------------------------

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

-- finish_jobs writes the outcomes, each fenced on (id, attempt, running):
-- an outcome of an attempt that is no longer its job's current one changes
-- nothing. A completed job leaves the queue; a failed one is retryable
-- after its delay or discarded, its error added to its errors. Every
-- attempt goes to the history (outbox.deliveries) with what it left its
-- job (the attempts the fence refused are record_fenced_attempts'). State
-- 'released' is a job claimed ahead of its endpoint's requests and never
-- sent (claimahead.go, jobReleased): it goes back to the queue as it was
-- before the claim, its attempt not counted, and makes no history. It
-- returns the jobs it finished and each one's test mark.
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

-- record_fenced_attempts keeps in the history the attempts of in_attempts
-- whose outcome the fence refused (not written_ids, written_attempts): a
-- worker that lost its job to the rescuer, whose request may still have
-- reached the receiver. Such an attempt has no outcome; over the row its
-- rescue wrote (rescue_jobs), its answer replaces the rescue's guess, and
-- so it is kept even once its job has left the queue. Writing a batch
-- again writes the same values.
CREATE FUNCTION outbox.record_fenced_attempts(in_attempts json, written_ids bigint[], written_attempts integer[])
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

-- count_attempts adds the attempts written (written_ids, written_attempts:
-- those whose outcome finish_jobs wrote) to the statistics, in a row of
-- delivery_stats per endpoint and minute. An attempt the fence refused (a
-- worker that lost its job to the rescuer, or this batch written again
-- after its commit's answer was lost) counts nothing, and one that made no
-- request (class 'none') neither.
CREATE FUNCTION outbox.count_attempts(in_attempts json, written_ids bigint[], written_attempts integer[],
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
CREATE FUNCTION outbox.record_endpoint_health(in_health json, in_gone bigint[], in_windows json,
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

-- run_again puts the jobs in_ids back in the queue, to run again, by
-- hand or by a replay: due now and not finished, with their error history
-- kept; a delivery in an ordered lane is put back held, and takes its
-- turn by fan-out order (the caller advances its lane). A job that used
-- all its attempts gets one more, so the claim's attempt + 1 stays within
-- max_attempts. A finished job joins replay in_replay_id (NULL: it runs
-- live); a waiting one keeps its replay, the retry only bringing its next
-- attempt forward. A running job is left as it is. It returns each job's
-- endpoint and ordered lane.
CREATE FUNCTION outbox.run_again(in_ids bigint[], in_replay_id bigint)
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
CREATE FUNCTION outbox.discard_jobs(in_ids bigint[], in_error text)
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

-- rescue_jobs is the rescuer's (rescue.go): it ends the attempts of the
-- running jobs in_ids, locked by the caller, whose worker is gone (past
-- the rescue horizon, or of a replica declared dead), each with its error
-- of in_errors. A job is retryable now, or discarded if that was its last
-- attempt; the attempt stays spent, so a late outcome of it is fenced out
-- (finish_jobs), and goes to the history with its error. It returns each
-- job's endpoint and ordered lane, which the caller advances.
CREATE FUNCTION outbox.rescue_jobs(in_ids bigint[], in_errors text[])
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

-- live_flows says whether live deliveries flow to endpoint ep: whether
-- the relay has fanned some out to it within the last second
-- (fanout_stats, a probe of at most two rows by key). While they do, its
-- replay lane is narrowed (replay_width), and the claim lets a replayed
-- delivery's place be taken by the next claim the live ones bring
-- (outbox.claim_lane_jobs, replay_yields). The dry run's estimate (replay.go,
-- previewReplay) reads it too.
--
-- PL/pgSQL, not SQL: a SQL function whose body holds a subquery is never
-- inlined, and is parsed and planned again in every statement that calls
-- it, where PL/pgSQL keeps its plan for the session.
CREATE FUNCTION outbox.live_flows(ep bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN EXISTS (SELECT 1
                 FROM outbox.fanout_stats AS f
                 WHERE f.endpoint_id = ep
                   AND f.minute >= date_trunc('minute', now() - interval '1 second')
                   AND f.last_fanned_at > now() - interval '1 second');
END
$$;

-- replay_width is how many of endpoint ep's replayed deliveries may run
-- at once (outbox.claim_due_jobs): its replay_share of max_in_flight while it
-- is quiet, and one while live deliveries flow to it (live_flows). A
-- replay's requests compete with the live ones for more than the
-- receiver: the same workers, claims and outcome batches, the same
-- database and host. What a replay costs live deliveries on a busy host
-- is its rate, not its lane (docs/performance.md).
-- Replayed deliveries already running when live ones begin finish; the
-- lane narrows as they do. The rule is replay_width(live, max_in_flight),
-- for a caller that has asked live_flows already (outbox.claim_due_jobs); an
-- expression without a subquery, which PostgreSQL inlines.
CREATE FUNCTION outbox.replay_width(live boolean, max_in_flight integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN live THEN 1 ELSE outbox.replay_share(max_in_flight) END
$$;

CREATE FUNCTION outbox.replay_width(ep bigint, max_in_flight integer)
RETURNS integer
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN outbox.replay_width(outbox.live_flows(ep), max_in_flight);
END
$$;

--------------------------------------------------------------------------------
-- Owner notifications: an endpoint's owner hears when it fails
--------------------------------------------------------------------------------

-- endpoint_state_event records an event when an endpoint becomes failing
-- (failing_since goes from NULL to set while it is enabled) or disabled
-- (disabled_at goes from NULL to set: a 410, the 5-day sweep, an operator),
-- in the transaction that changes the state, whoever changes it. Topic
-- outboxd.endpoint.failing or outboxd.endpoint.disabled, subject the
-- endpoint id, addressed to the endpoint's owner (owner_admits): an owner's
-- endpoints may receive the news of its own endpoints, and no one else's;
-- those of the admin's endpoints reach the admin's. The relay fans these out
-- to one owner-notify job each (ownernotify.go); endpoints and subscribers
-- get them only by naming them (topic_matches). last_error is the attempt
-- that caused the change, which the webhook sender records just before, in
-- the same transaction.
CREATE FUNCTION outbox.endpoint_state_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  state text := CASE WHEN NEW.disabled_at IS NOT NULL THEN 'disabled' ELSE 'failing' END;
BEGIN
  PERFORM outbox.record(
    'outboxd.endpoint.' || state,
    NEW.id::text,
    jsonb_build_object(
      'endpoint_id',     NEW.id,
      'url',             NEW.url,
      'owner_email',     NEW.owner_email,
      'state',           state,
      'failing_since',   NEW.failing_since,
      'disabled_reason', NEW.disabled_reason,
      'last_error',      (SELECT d.error
                          FROM outbox.deliveries AS d
                          WHERE d.endpoint_id = NEW.id
                          ORDER BY d.finished_at DESC
                          LIMIT 1)
    ),
    (SELECT o.key FROM outbox.owners AS o WHERE o.id = NEW.owner_id)
  );
  RETURN NULL;
END
$$;

-- The WHEN clause is the transition: a failing endpoint failing again, or
-- a disabled one disabled again, records nothing. A 410 sets both columns
-- at once and is one "disabled" event.
CREATE TRIGGER endpoints_state_event
  AFTER UPDATE OF failing_since, disabled_at ON outbox.endpoints
  FOR EACH ROW
  WHEN ((OLD.disabled_at IS NULL AND NEW.disabled_at IS NOT NULL)
     OR (OLD.failing_since IS NULL AND NEW.failing_since IS NOT NULL AND NEW.disabled_at IS NULL))
  EXECUTE FUNCTION outbox.endpoint_state_event();

-- One row per owner notification that took a slot of its owner's hourly
-- cap (-owner-notify-per-hour, 5). Keyed by the job, so a retry of the job
-- finds its slot and does not take a second one. A notification over the
-- cap takes no slot: its job completes with a note and is counted. No
-- foreign key: a slot outlives its job, which leaves the queue once sent,
-- for the hour that counts; an owner's next notification deletes its
-- slots older than that (ownernotify.go).
CREATE TABLE outbox.owner_notify_slots (
  job_id      bigint      PRIMARY KEY,
  owner_email text        NOT NULL,
  taken_at    timestamptz NOT NULL DEFAULT now()
);

-- Serves the cap's count: an owner's slots taken in the last hour.
CREATE INDEX owner_notify_slots_by_owner_taken_at
  ON outbox.owner_notify_slots (owner_email, taken_at);

--------------------------------------------------------------------------------
-- Inbox: signed webhooks received from other senders
--------------------------------------------------------------------------------

-- An inbox source is a sender outboxd accepts webhooks from at
-- POST /webhooks/{name}, verified with its secret (the secret the sender
-- signs with: for another outboxd, its endpoint's whsec_...). A rotation
-- keeps the old secret as previous_secret until previous_secret_expires_at,
-- and either verifies meanwhile. A received webhook becomes a local event
-- with topic topic_prefix || the body's "type". Rows are written through
-- the API (inbox.go), and bounded by the admin, who creates them.
CREATE TABLE outbox.inbox_sources (
  name                       text        PRIMARY KEY,
  secret                     bytea       NOT NULL,
  previous_secret            bytea,
  previous_secret_expires_at timestamptz,
  topic_prefix               text        NOT NULL,
  -- Addresses every event the source's webhooks become to the owner with
  -- that key (events.owner): the webhooks a customer's system sends in go
  -- on to that customer's endpoints alone. NULL: to no owner.
  owner                      text,
  created_at                 timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT inbox_sources_name_format CHECK (name ~ '^[a-z0-9_-]{1,50}$'),
  CONSTRAINT inbox_sources_topic_prefix_format CHECK (topic_prefix ~ '^([A-Za-z0-9_][A-Za-z0-9_.:/-]{0,99})?$'),
  -- The events' format (events_owner_format).
  CONSTRAINT inbox_sources_owner_format CHECK (owner ~ '^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$'),
  -- Any non-empty key up to 64 bytes: a source's secret is the sender's,
  -- and senders other than outboxd choose their own sizes. Or sealed, as
  -- endpoints_secret_length allows.
  CONSTRAINT inbox_sources_secret_length CHECK (
    length(secret) BETWEEN 1 AND 64
    OR (length(secret) = 98 AND get_byte(secret, 0) = 1)
  ),
  CONSTRAINT inbox_sources_previous_secret_expires CHECK (
    (previous_secret IS NULL) = (previous_secret_expires_at IS NULL)
  )
);

-- One row per webhook received and recorded: the dedup record. A second
-- delivery of the same webhook-id from the same source (a retry, a replay,
-- a sender that lost our 2xx) finds the row and changes nothing. The row,
-- the local event and nothing else commit together, and the sender gets
-- its 2xx only after that commit.
--
-- Inbox retention (retention.go) deletes rows older than the inbox window,
-- which is longer than events retention plus the retry horizon plus the
-- sweep cadence (the dedup rule, replay.go), so every resend of a sender
-- configured alike meets the row. event_id has no foreign key on purpose:
-- events are pruned first, and the dedup record outliving its event is the
-- safe direction.
CREATE TABLE outbox.inbox (
  source      text        NOT NULL,
  webhook_id  text        NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  event_id    bigint,

  PRIMARY KEY (source, webhook_id),
  CONSTRAINT inbox_webhook_id_length CHECK (length(webhook_id) BETWEEN 1 AND 256)
);

-- Serves inbox retention: DELETE FROM outbox.inbox ... WHERE received_at <
-- cutoff, in batches.
CREATE INDEX inbox_by_received_at
  ON outbox.inbox (received_at);

-- One row per inbox source and minute: how many webhooks it received (new,
-- recorded as an event), how many were duplicates (accepted, the webhook-id
-- seen before) and how many were refused, by class, with the last refusal's
-- class, reason (truncated to 200 characters) and time, and every reason of
-- the minute counted. Refusals are counted, never stored whole. The inbox
-- (inbox.go) adds to the row: received and duplicates in the transaction
-- that records the webhook, a refusal with one statement of its own. The
-- panel's Inbox page and GET /api/sources read it.
--
-- Classes (inbox.go, refusalClass): bad_signature (no signature matches, 401),
-- stale_timestamp (more than 5 minutes old or ahead, 401), unknown_source
-- (no such source, 404), too_large (the body past its bound, 413),
-- malformed (a missing or malformed header, a webhook-id too long, a body
-- that is not a webhook, 400). A webhook for a source that does not exist
-- is counted under the one source '(unknown)', whatever name it was sent
-- to, so a flood of made-up names adds one row a minute, not one a name.
--
-- Deleted by the retention sweep once minute is older than
-- -delivery-stats-retention (7 days): at most one row per source, and one
-- for '(unknown)', per minute of that window. No foreign key to
-- outbox.inbox_sources: a source's numbers outlive its deletion until
-- retention takes them. The primary key leads with minute: it serves the
-- sweep's oldest-first delete and the pages' window of every source.
CREATE TABLE outbox.inbox_stats (
  minute              timestamptz NOT NULL, -- the start of the minute the request came in
  source              text        NOT NULL,
  received            bigint      NOT NULL DEFAULT 0,
  duplicates          bigint      NOT NULL DEFAULT 0,
  bad_signature       bigint      NOT NULL DEFAULT 0,
  stale_timestamp     bigint      NOT NULL DEFAULT 0,
  unknown_source      bigint      NOT NULL DEFAULT 0,
  too_large           bigint      NOT NULL DEFAULT 0,
  malformed           bigint      NOT NULL DEFAULT 0,
  -- The class of the minute's last refusal, beside its reason, so that the
  -- Inbox page can say which kind each recent reason was. NULL without a
  -- refusal.
  last_refusal_class  text,
  last_refusal_reason text,
  last_refused_at     timestamptz,
  -- Every refusal reason of the minute with its count, keyed by class, a
  -- space and the reason ({"bad_signature no signature matches": 3}): the
  -- last reason alone would hide the others a sender got in the same
  -- minute. At most 20 reasons a row (inbox.go, maxRefusalReasons); past
  -- them a refusal counts under its class and "(other reasons)", so that a
  -- sender varying its mistakes cannot grow the row without bound.
  refusal_reasons     jsonb       NOT NULL DEFAULT '{}',

  PRIMARY KEY (minute, source),
  CONSTRAINT inbox_stats_last_refusal_class CHECK (
    last_refusal_class IN ('bad_signature', 'stale_timestamp', 'unknown_source', 'too_large', 'malformed')
  ),
  CONSTRAINT inbox_stats_last_refusal_reason_length CHECK (length(last_refusal_reason) <= 200),
  CONSTRAINT inbox_stats_last_refusal CHECK ((last_refusal_reason IS NULL) = (last_refused_at IS NULL))
);

--------------------------------------------------------------------------------
-- Subject index: the latest event per subject and topic
--------------------------------------------------------------------------------

-- Kept by the relay's fan-out (outbox.fan_out, indexed), in the transaction
-- that marks the events fanned out: for every subject of every topic, the
-- latest event recorded for it, by event id. The topic is part of the key
-- because a subject means something only within its topic: outbox.watch
-- makes the watched row's primary key the subject, so orders and accounts
-- watched as order.changed and account.changed both have a subject '42',
-- two rows that must not overwrite each other. Its upsert never moves
-- backwards (an older event fanned out late changes nothing). Rows live as
-- long as their subject; a search by prefix serves the panel and
-- GET /api/subjects (subjects.go).
CREATE TABLE outbox.subjects (
  subject       text        NOT NULL,
  topic         text        NOT NULL,
  last_event_id bigint      NOT NULL,
  -- NULL once an erasure of the subject erased it (outbox.erase_subject).
  payload       jsonb,
  updated_at    timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT subjects_pkey PRIMARY KEY (subject, topic)
);

-- Serves the search by subject prefix (LIKE 'prefix%'), whatever the
-- database's collation.
CREATE INDEX subjects_by_subject_prefix
  ON outbox.subjects (subject text_pattern_ops);

--------------------------------------------------------------------------------
-- Erasure: a subject's payloads, on request
--------------------------------------------------------------------------------

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
CREATE FUNCTION outbox.erase_subject(in_subject text, in_reason text)
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

--------------------------------------------------------------------------------
-- Retention's last cycle: what every replica's overview alerts on
--------------------------------------------------------------------------------

-- One row, rewritten by whichever replica ran the last retention cycle
-- (retention.go), so that every replica's overview can tell that storage
-- bounds are not being enforced: a cycle that failed, or stopped at the
-- anomaly cap, says so here until a later cycle succeeds. Skipped cycles
-- (another replica held the lock) write nothing.
CREATE TABLE outbox.retention_last_cycle (
  singleton   boolean     PRIMARY KEY DEFAULT true,
  finished_at timestamptz NOT NULL,
  error       text        NOT NULL DEFAULT '',
  CONSTRAINT retention_last_cycle_one_row CHECK (singleton),
  CONSTRAINT retention_last_cycle_error_length CHECK (length(error) <= 2100)
);

--------------------------------------------------------------------------------
-- Panel sessions: revocable, and the same on every replica
--------------------------------------------------------------------------------

-- One row per browser signed in to the panel (admin.go). The cookie holds
-- a random id; the row holds only its HMAC under the admin token, so the
-- table gives away no cookie, and a new token signs every session out
-- (outbox.panel_session_token, below, for good).
-- Sign-in inserts the row, valid for 12 hours; sign-out deletes it, so a
-- copy of the cookie is refused by every replica from then on, as is an
-- expired one. The table is bounded without a sweep: each sign-in deletes
-- up to 100 expired rows, oldest first, and the oldest live ones beyond
-- the newest 1,000 (those browsers must sign in again).
CREATE TABLE outbox.panel_sessions (
  id_hash    bytea       PRIMARY KEY,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  CONSTRAINT panel_sessions_id_hash_length CHECK (length(id_hash) = 32)
);

-- Serves the sign-in's deletions: the expired rows oldest first, the live
-- ones newest first past the 1,000th.
CREATE INDEX panel_sessions_by_expires_at
  ON outbox.panel_sessions (expires_at);

-- The admin token the sessions above were signed in under, known by a
-- fingerprint (its HMAC of a fixed text, admin.go): one row. A session's
-- HMAC holds only for the token it was made under, but a token that comes
-- back would bring its sessions back with it; so a start with a token
-- other than the one recorded deletes every session, in the statement
-- that records the new one. A start with the same token keeps them.
CREATE TABLE outbox.panel_session_token (
  only_row    boolean     PRIMARY KEY DEFAULT true,
  fingerprint bytea       NOT NULL,
  changed_at  timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT panel_session_token_one_row CHECK (only_row),
  CONSTRAINT panel_session_token_fingerprint_length CHECK (length(fingerprint) = 32)
);

--------------------------------------------------------------------------------
-- Owners' sign-ins: the portal's sessions and sign-in links
--------------------------------------------------------------------------------

-- One row per browser signed in as an owner: the twin of
-- outbox.panel_sessions, in a table of its own so that every row of
-- panel_sessions is the admin's, and nothing that reads that table can take
-- an owner's session for the admin's. Bounded like it: every sign-in
-- deletes up to 100 expired rows and the live ones past the newest 1,000.
-- Rotating an owner's token or deleting the owner ends its sessions.
CREATE TABLE outbox.owner_sessions (
  id_hash    bytea       PRIMARY KEY,
  owner_id   bigint      NOT NULL REFERENCES outbox.owners (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  CONSTRAINT owner_sessions_id_hash_length CHECK (length(id_hash) = 32)
);

-- Serves the sign-in's deletions, as panel_sessions_by_expires_at does.
CREATE INDEX owner_sessions_by_expires_at
  ON outbox.owner_sessions (expires_at);

-- Serves the ending of one owner's sessions (rotation, delete's cascade).
CREATE INDEX owner_sessions_by_owner_id
  ON outbox.owner_sessions (owner_id);

-- Sign-in links the admin hands to an owner (owners.go): the link holds a
-- random code, the row its SHA-256. A link signs in once: the sign-in
-- deletes the row in the statement that reads it, so two clicks racing
-- get one session between them. It expires after -signin-link-lifetime
-- (1 h). Bounded like the sessions: every new link deletes up to 100
-- expired rows, and the live ones past the newest 1,000. Deleting the
-- owner deletes its links.
CREATE TABLE outbox.owner_signin_links (
  code_hash  bytea       PRIMARY KEY,
  owner_id   bigint      NOT NULL REFERENCES outbox.owners (id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  CONSTRAINT owner_signin_links_code_hash_length CHECK (length(code_hash) = 32)
);

-- Serves the new link's deletions of expired rows, oldest first.
CREATE INDEX owner_signin_links_by_expires_at
  ON outbox.owner_signin_links (expires_at);

--------------------------------------------------------------------------------
-- The audit trail: who changed an endpoint, an owner or a source, and when
--------------------------------------------------------------------------------

-- One row per change made through the API or the panel (audit.go): who
-- (the admin, or which owner, by id and by the name it had), what (the
-- route, and the fields a JSON body gave, never their values: a body may
-- hold a secret), to what (the subject's kind and id or name; endpoint_id
-- also for a change to an endpoint, which its owner may read; for an
-- erasure, the SHA-256 of the erased subject, never the subject itself),
-- and when.
-- Nothing references the rows, and they reference nothing, so that an
-- entry outlives what it tells of. Retention deletes rows older than
-- -audit-retention (90 days), in batches (retention.go).
CREATE TABLE outbox.audit_log (
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
  -- For an erasure (subject_kind 'erasure'), the events it erased; NULL
  -- for any other entry.
  events       bigint,

  CONSTRAINT audit_log_actor_known CHECK (actor IN ('admin', 'owner')),
  CONSTRAINT audit_log_owner_with_actor CHECK ((actor = 'owner') = (owner_id IS NOT NULL)),
  CONSTRAINT audit_log_via_known CHECK (via IN ('api', 'panel')),
  CONSTRAINT audit_log_subject_kind_known CHECK (subject_kind IN ('endpoint', 'owner', 'source', 'erasure')),
  CONSTRAINT audit_log_lengths CHECK (
    length(action) <= 200 AND length(subject) <= 200 AND length(coalesce(owner_name, '')) <= 200
    AND cardinality(fields) <= 50
  )
);

-- Serves the audit trail's pages, newest first, and its retention
-- (retention.go), oldest first.
CREATE INDEX audit_log_by_at
  ON outbox.audit_log (at, id);

-- Serves an owner's page of the audit trail: its endpoints' entries.
CREATE INDEX audit_log_by_endpoint_id
  ON outbox.audit_log (endpoint_id, id)
  WHERE endpoint_id IS NOT NULL;

--------------------------------------------------------------------------------
-- Alert acknowledgements: seen by an operator, on every replica's panel
--------------------------------------------------------------------------------

-- One row per alert name an operator acknowledged (overview.go): the level
-- the alert was at, and when. The overview shows the alert as acknowledged
-- while it stays at or below that level in the episode that was
-- acknowledged, and fires it again when it gets worse. At most one row for
-- every alert outboxd has: bounded.
CREATE TABLE outbox.alert_acks (
  name            text        PRIMARY KEY,
  level           bigint      NOT NULL,
  acknowledged_at timestamptz NOT NULL,
  CONSTRAINT alert_acks_name_length CHECK (length(name) BETWEEN 1 AND 100)
);

--------------------------------------------------------------------------------
-- Recovery probes: an endpoint disabled for failing comes back by itself
--------------------------------------------------------------------------------

-- probe_interval is the schedule of an endpoint's recovery probes
-- (probe.go; the endpoints' recovery columns, above): how long after a
-- probe made at "at" the next one is due, for an endpoint disabled at
-- disabled_at. Hourly through the first day (a receiver back after an
-- outage is found within the hour), then every 6 hours, for as long as it
-- stays disabled: 24 probes the first day, 4 a day after. The first probe
-- is due an hour after the disable.
CREATE FUNCTION outbox.probe_interval(disabled_at timestamptz, at timestamptz)
RETURNS interval
LANGUAGE sql STABLE
AS $$
  SELECT CASE WHEN at < disabled_at + interval '24 hours' THEN interval '1 hour'
              ELSE interval '6 hours' END
$$;

-- probe_due_at is when an endpoint's next probe is due, NULL if it gets
-- none. next_probe_at is left as it is by enabling and disabling; one from
-- an earlier disable lies before this one's first probe, which greatest()
-- then takes.
CREATE FUNCTION outbox.probe_due_at(disabled_cause text, recovery_probes boolean, url text,
                                    disabled_at timestamptz, next_probe_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
  SELECT CASE WHEN disabled_cause = 'failure' AND recovery_probes AND url !~ '^mailto:'
              THEN greatest(next_probe_at, disabled_at + outbox.probe_interval(disabled_at, disabled_at)) END
$$;

--------------------------------------------------------------------------------
-- Replicas: the outboxd processes that share this database
--------------------------------------------------------------------------------

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
CREATE TABLE outbox.replicas (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  host           text        NOT NULL,
  pid            integer     NOT NULL,
  -- The kernel boot and the pid namespace pid is a number of ('' when
  -- unknown, off Linux): only a process of the same boot and namespace can
  -- look that pid up. pid_start is when that process started, in clock
  -- ticks after boot (NULL when unknown): a pid used again by a later
  -- process has a later start. With them, a replica starting on the same
  -- host declares dead at once a registration whose process is gone
  -- (rescue.go), instead of waiting out its dead_after: a restart after a
  -- crash rescues its predecessor's jobs as it starts.
  pid_namespace  text        NOT NULL DEFAULT '',
  pid_start      bigint,
  -- The release (version.go) and the VCS revision it was built from
  -- ('' when unknown), and schema_version, the start of the checksum of
  -- the schema its binary carries (replicas.go, schemaVersionOf; '' when
  -- unknown): what the overview compares to flag replicas of different
  -- builds. Two builds of one release and revision differ in
  -- schema_version when one was built from a tree whose schema was
  -- changed; replicas whose schemas differ are a roll under way.
  version        text        NOT NULL,
  revision       text        NOT NULL DEFAULT '',
  schema_version text        NOT NULL DEFAULT '',
  -- What it runs: every replica relays, runs workers and may sweep; these
  -- say how many job slots (-workers), whether it LISTENs (off with
  -- -disable-listen) and when its sweeper last held the retention lock.
  workers        integer     NOT NULL,
  listens        boolean     NOT NULL,
  swept_at       timestamptz,
  -- The job kinds its workers run, sorted (deliver.go: its handlers' and
  -- its in-process subscribers'), the only ones it claims
  -- (claim_due_jobs' kinds); NULL from the release before, which did not
  -- record them and claims every kind. The overview's jobs_no_runner
  -- names the due jobs of a kind that no live replica runs.
  kinds          text[],
  dead_after     interval    NOT NULL,
  started_at     timestamptz NOT NULL DEFAULT now(),
  last_seen      timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT replicas_host_length CHECK (length(host) <= 255),
  CONSTRAINT replicas_pid_namespace_length CHECK (length(pid_namespace) <= 200),
  CONSTRAINT replicas_version_length CHECK (length(version) BETWEEN 1 AND 100 AND length(revision) <= 100),
  CONSTRAINT replicas_schema_version_length CHECK (length(schema_version) <= 64),
  CONSTRAINT replicas_workers_nonnegative CHECK (workers >= 0),
  CONSTRAINT replicas_dead_after_positive CHECK (dead_after > interval '0')
);

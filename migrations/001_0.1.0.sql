-- 001_0.1.0.sql: release 0.1.0, the first: its whole schema.
--
-- migrate.go applies it in one transaction, except its CONCURRENTLY
-- index statements and constraint validations, which run after that
-- transaction, one at a time. Written before releases recorded their
-- migrations by number: every statement can run again over a database
-- that has part of it, as a build between two releases left it.

-- schema.sql: every table, index and SQL function of outboxd, in the order an
-- event moves through them. outboxd applies this file at start (and on
-- `outboxd migrate`) inside one transaction, under an advisory lock that
-- lets one replica at a time migrate, so every statement here must be
-- idempotent. The transaction locks every table of outbox first, and its
-- lock waits together are bounded (lock_timeout); a try that runs out is
-- rolled back and retried (migrate.go): a statement that locks a hot table
-- never queues the producers behind it for long.
--
-- The indexes of the queue tables are not here: schema_indexes.sql builds
-- them CONCURRENTLY once this file has committed, outside any transaction.
-- This file keeps the indexes of the small tables (endpoints, replays,
-- owner notifications, panel sessions), which build in milliseconds.

-- Created only when missing: CREATE SCHEMA IF NOT EXISTS wants the right
-- to create schemas even when there is nothing to create, which a role
-- that was given the schema (managed PostgreSQL) does not have.
DO $$
BEGIN
  IF to_regnamespace('outbox') IS NULL THEN
    CREATE SCHEMA outbox;
  END IF;
END
$$;

-- schema_applied holds the SHA-256 of every schema.sql applied here. A
-- replica whose file is already recorded applies nothing, so restarts take
-- no lock on the hot tables. One row a release: bounded.
CREATE TABLE IF NOT EXISTS outbox.schema_applied (
  checksum   text        PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON SCHEMA outbox IS
  'outboxd: transactional outbox, job table and inbox. Call outbox.record() inside your own transaction.';

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
-- PL/pgSQL, a loop over the patterns with no query in it: as a SQL
-- function, whose subqueries keep it from being inlined, its body was
-- parsed and planned again in every statement that called it: 0.2 ms or
-- more at each of a relay pass's two calls (README, "Performance").
CREATE OR REPLACE FUNCTION outbox.topic_matches(patterns text[], topic text)
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
-- that walked 1,000,000 events of another topic took 1.26 to 1.41 s with
-- the call a row and 0.66 to 0.83 s with these (README, "Delivery lanes
-- under load"). TestTopicMatchesAgreesWithSQL holds the two forms equal.
CREATE OR REPLACE FUNCTION outbox.topic_split(patterns text[], OUT names text[], OUT prefixes text[], OUT every_topic boolean)
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

CREATE OR REPLACE FUNCTION outbox.topic_selected(topic text, names text[], prefixes text[], every_topic boolean)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT topic = ANY(names) OR topic ^@ ANY(prefixes) OR (every_topic AND NOT topic ^@ 'outboxd.')
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
CREATE TABLE IF NOT EXISTS outbox.events (
  id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic          text        NOT NULL,
  subject        text        NOT NULL DEFAULT '',
  payload        jsonb       NOT NULL DEFAULT '{}',
  -- now() is the recording transaction's start time; used for display,
  -- retention and latency, never to decide what to relay.
  created_at     timestamptz NOT NULL DEFAULT now(),
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

-- Every event row is updated once (fanned_out_at) and deleted once
-- (retention): a high-churn table. Vacuum it after 2% of its rows are dead
-- instead of PostgreSQL's default 20%, so the claim index stays small.
-- Trace context (W3C): a producer inside a trace sets outbox.traceparent
-- (and outbox.tracestate) for its transaction, SET LOCAL or set_config(...,
-- true); outbox.record and the watch triggers store it with the event, and
-- every delivery sends it as the traceparent and tracestate headers, so
-- the receiver's trace continues from the business write. Only version 00
-- with non-zero ids is stored; anything else fails the recording
-- transaction, never a delivery later. NOT VALID: rows stored before the
-- columns existed hold NULL, and need no scan of the table.
ALTER TABLE outbox.events
  ADD COLUMN IF NOT EXISTS traceparent text,
  ADD COLUMN IF NOT EXISTS tracestate text;

DO $$
BEGIN
  ALTER TABLE outbox.events
    -- One regular expression each (the lookaheads refuse all-zero ids):
    -- a NULL, the common case, costs the check nothing. Written as ANDs
    -- of substr() and repeat(), the first version made outbox.record 1.4
    -- times slower in bulk.
    ADD CONSTRAINT events_traceparent_format CHECK (
      traceparent ~ '^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'
    ) NOT VALID,
    ADD CONSTRAINT events_tracestate_format CHECK (
      length(tracestate) <= 512 AND tracestate ~ '^[ -~]*$'
    ) NOT VALID;
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

ALTER TABLE outbox.events SET (
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02
);

-- Index events_unfanned_by_id: schema_indexes.sql.

-- claim_unfanned locks up to batch un-fanned events, oldest first, for the
-- caller's transaction: mark_fanned_out's claim, and the relay's list of
-- rows to retry one by one after a batch failed (relay.go), which must not
-- mark them, since the marking may be what fails. It is a function to
-- carry SET enable_sort = off, which leaves walking events_unfanned_by_id
-- in id order as the one plan, stopping after one batch. A matching index
-- is not enough: a planner that underestimates the backlog (statistics
-- from before a bulk import or an outage, or none yet) reads every
-- un-fanned row and sorts them, which at 900,000 waiting took 625 ms a pass
-- instead of 1.4 ms. PL/pgSQL, so that the plan is made once per session,
-- not on every call.
CREATE OR REPLACE FUNCTION outbox.claim_unfanned(batch integer)
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
  ORDER BY e.id
  LIMIT batch
  FOR UPDATE OF e SKIP LOCKED;
END
$$;

-- mark_fanned_out is the relay's batch claim (relay.go): it claims up to
-- batch events with claim_unfanned, marks them fanned out, and returns what
-- the fan-out reads of them, in the caller's transaction.
-- enable_seqscan = off has the UPDATE fetch the claimed rows by key, where
-- a planner that thinks index reads expensive (a high random_page_cost)
-- would scan the whole backlog for 200 rows.
--
-- The claim comes first, in a statement of its own: each statement of a
-- PL/pgSQL function sees the rows committed when it began, so the UPDATE
-- sees every row the claim locked. (The other way round, a claim made by a
-- function called from the UPDATE runs later than the UPDATE's snapshot
-- and can lock a row that the UPDATE does not see.)
--
-- It returns the payload for the subject index, which the relay keeps in
-- the same statement. Callers name the columns they read, so a relay of the
-- previous release, which reads three, keeps working; adding the column
-- needs the DROP, which CREATE OR REPLACE cannot do.
DROP FUNCTION IF EXISTS outbox.mark_fanned_out(integer);
CREATE FUNCTION outbox.mark_fanned_out(batch integer)
RETURNS TABLE (id bigint, topic text, subject text, payload jsonb)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
  claimed bigint[] := ARRAY(SELECT outbox.claim_unfanned(batch));
BEGIN
  RETURN QUERY
  UPDATE outbox.events AS e
  SET fanned_out_at = now()
  WHERE e.id = ANY (claimed)
  RETURNING e.id, e.topic, e.subject, e.payload;
END
$$;

-- Indexes events_poisoned_by_id, events_fanned_by_fanned_out_at:
-- schema_indexes.sql.

-- relay_state is one row: whether a relay may be asleep waiting for a
-- notification (idle) or every relay that is awake keeps claiming without
-- one (busy). Producers notify only while it says idle. A NOTIFY is not
-- free: a transaction that sent one takes a single cluster-wide lock at
-- commit and holds it until the commit is done, so notifying commits are
-- serialized one behind another; at 16 concurrent single-row producers
-- that was most of outbox.record's cost (README, "Producer cost"). A
-- relay that is claiming pass after pass needs no wake-up; only one about
-- to sleep does.
--
-- Relays write it (relay.go, Run; notify.go): busy when notifications come
-- in while a pass runs and the pass found events, idle before sleeping.
-- It starts idle, and a missing row reads as idle: when in doubt, notify.
CREATE TABLE IF NOT EXISTS outbox.relay_state (
  singleton  boolean     PRIMARY KEY DEFAULT true,
  idle       boolean     NOT NULL DEFAULT true,
  changed_at timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT relay_state_one_row CHECK (singleton)
);

INSERT INTO outbox.relay_state DEFAULT VALUES ON CONFLICT DO NOTHING;

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
-- the only two-key advisory lock with that first key: claim_jobs' lane
-- locks use hashtext('outbox.claim_jobs'), advance_lanes' ones
-- hashtext('outbox.advance_lanes') and hashtext('outbox.advance_lanes/lane'),
-- and outboxd's one-key locks (schema, retention, owner mail) live in
-- another key space.
CREATE OR REPLACE FUNCTION outbox.notify_events() RETURNS trigger
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

CREATE OR REPLACE TRIGGER events_notify_relay
  AFTER INSERT ON outbox.events
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_events();

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
-- granted it can record (README, "Database privileges").
--
-- PL/pgSQL, not SQL: PostgreSQL plans a SQL function's statement anew at
-- every call (a function with SECURITY DEFINER or SET is never inlined),
-- and keeps a PL/pgSQL function's plan for the session. In the producer's
-- transaction that planning was about a fifth of what a record cost
-- (README, "Producer cost").
CREATE OR REPLACE FUNCTION outbox.record(topic text, subject text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  recorded_id bigint;
BEGIN
  INSERT INTO outbox.events (topic, subject, payload, traceparent, tracestate)
  VALUES (record.topic, coalesce(record.subject, ''), coalesce(record.payload, '{}'),
          nullif(current_setting('outbox.traceparent', true), ''),
          nullif(current_setting('outbox.tracestate', true), ''))
  RETURNING events.id INTO recorded_id;
  RETURN recorded_id;
END
$$;

-- watch_row is the trigger function behind outbox.watch(). TG_ARGV[0] is the
-- topic; the remaining arguments name the table's primary-key columns, whose
-- values (comma-separated) become the event's subject. The payload carries
-- the operation and the row before and after. Like outbox.record, it runs
-- as its owner, so the application's writes record events without any
-- right on outboxd's tables; a table's owner needs EXECUTE on it to
-- install the triggers (outbox.watch).
CREATE OR REPLACE FUNCTION outbox.watch_row() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  row_json jsonb := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
  subject  text := '';
  i        integer;
BEGIN
  FOR i IN 1 .. TG_NARGS - 1 LOOP
    subject := subject || CASE WHEN i > 1 THEN ',' ELSE '' END
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
    )
  );
  RETURN NULL;
END
$$;

-- Recording is a right to grant, not a default: functions are executable
-- by PUBLIC unless revoked, and these two run as outboxd's role.
REVOKE EXECUTE ON FUNCTION outbox.record(text, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.watch_row() FROM PUBLIC;

-- watch records an event with the given topic on every INSERT and DELETE of
-- tbl, and on an UPDATE only when one of the watched columns really changed
-- (NULL-safe). The check is the UPDATE trigger's WHEN clause, so a no-op
-- update never even calls the trigger function. An empty or NULL column list
-- watches every column. Calling it again with the same table and topic
-- replaces the triggers; outbox.unwatch removes them.
CREATE OR REPLACE FUNCTION outbox.watch(tbl regclass, topic text, columns text[])
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
  FROM unnest(coalesce(columns, '{}')) AS c
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
    ARRAY(SELECT quote_literal(x) FROM unnest(topic || coalesce(key_columns, '{}')) AS x),
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

CREATE OR REPLACE FUNCTION outbox.unwatch(tbl regclass, topic text)
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
-- Endpoints: where webhooks go
--------------------------------------------------------------------------------

-- An endpoint is a URL that receives every event whose topic its patterns
-- select (outbox.topic_matches; an empty list selects all), as a signed
-- webhook. Rows are written through the API (endpoints.go); the workers
-- change only failing_since, the lane's state (below: the failure count,
-- the breaker, a hold, the rate limit's next start), the receiver's dedup
-- window (below) and, on a 410, disabled_at; the prober, what its section
-- at the end of this file says. Its state is derived, never stored:
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
--             disabled_reason says which. Fan-out enqueues nothing for it,
--             and its queued deliveries end without a request. Enabling it
--             clears disabled_* and failing_since.
--
-- secret signs every delivery (HMAC-SHA256, Standard Webhooks). A rotation
-- keeps the old one as previous_secret until previous_secret_expires_at, and
-- deliveries carry both signatures until then, so a receiver can switch at
-- its own pace. Deleting an endpoint keeps its jobs (endpoint_id becomes
-- NULL): they end without a request, recorded as such.
CREATE TABLE IF NOT EXISTS outbox.endpoints (
  id                         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  url                        text        NOT NULL,
  description                text        NOT NULL DEFAULT '',
  owner_email                text        NOT NULL DEFAULT '',
  topics                     text[]      NOT NULL DEFAULT '{}',
  secret                     bytea       NOT NULL,
  previous_secret            bytea,
  previous_secret_expires_at timestamptz,
  failing_since              timestamptz,
  disabled_at                timestamptz,
  disabled_reason            text,
  created_at                 timestamptz NOT NULL DEFAULT now(),
  -- The last change through the API; state changes by the workers have
  -- their own timestamps.
  updated_at                 timestamptz NOT NULL DEFAULT now(),

  -- The Go side validates first (validateEndpointURL, topicPatternValid) and
  -- answers 400 with a reason; these keep a direct SQL write honest too.
  CONSTRAINT endpoints_url_scheme CHECK (url ~ '^(https?://|mailto:)' AND length(url) <= 2048),
  CONSTRAINT endpoints_description_length CHECK (length(description) <= 1000),
  CONSTRAINT endpoints_owner_email_length CHECK (length(owner_email) <= 254),
  CONSTRAINT endpoints_topics_count CHECK (cardinality(topics) <= 100),
  -- 24 to 64 bytes: the range Standard Webhooks recommends.
  CONSTRAINT endpoints_secret_length CHECK (length(secret) BETWEEN 24 AND 64),
  CONSTRAINT endpoints_previous_secret_expires CHECK (
    (previous_secret IS NULL) = (previous_secret_expires_at IS NULL)
  ),
  CONSTRAINT endpoints_disabled_with_reason CHECK (
    (disabled_at IS NULL) = (disabled_reason IS NULL)
  ),
  CONSTRAINT endpoints_disabled_reason_length CHECK (length(disabled_reason) <= 500)
);

-- A mailto: endpoint receives its events as mail (mail.go). A database made
-- before mail existed carries the http-only constraint: replace it, once.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_constraint
             WHERE conrelid = 'outbox.endpoints'::regclass AND conname = 'endpoints_url_http') THEN
    ALTER TABLE outbox.endpoints DROP CONSTRAINT endpoints_url_http;
    ALTER TABLE outbox.endpoints
      ADD CONSTRAINT endpoints_url_scheme CHECK (url ~ '^(https?://|mailto:)' AND length(url) <= 2048);
  END IF;
END
$$;

-- The receiver's dedup window, as a 2xx answer last advertised it in
-- webhook-dedup-window (outboxd's own header, webhook.go): how long after a
-- first delivery the receiver still recognises a second one, in seconds,
-- and when an answer last said so. The completer writes it with the
-- attempt (outcome.go), on a change and at most hourly otherwise; an answer
-- without the header leaves it, and a new URL clears it. NULL: never
-- advertised. Replays and retries by hand to the endpoint are clamped to it
-- (replay.go), and the overview alerts while it is shorter than this
-- sender's resend horizon.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS dedup_window_seconds bigint,
  ADD COLUMN IF NOT EXISTS dedup_window_seen_at timestamptz;

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_dedup_window CHECK (
      (dedup_window_seconds IS NULL) = (dedup_window_seen_at IS NULL)
      AND dedup_window_seconds > 0
    );
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- An endpoint is a lane of its own (outbox.claim_jobs): its trouble holds
-- up its own deliveries and nobody else's. The columns the claim reads:
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
--                         completer counts them (outcome.go).
--   breaker_opened_at     set by the completer when consecutive_failures
--                         reaches -breaker-threshold (5), cleared by the
--                         next success. While open: one attempt at a time,
--                         and fan-out schedules new deliveries 5 min out.
--   held_until            a 429 or 503 with Retry-After holds the whole
--                         endpoint until then, not just the one job.
--   paused_at             an operator's pause (POST .../pause).
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS max_in_flight integer NOT NULL DEFAULT 16,
  ADD COLUMN IF NOT EXISTS rate_limit_per_second double precision,
  ADD COLUMN IF NOT EXISTS rate_next_at timestamptz,
  ADD COLUMN IF NOT EXISTS consecutive_failures integer NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS breaker_opened_at timestamptz,
  ADD COLUMN IF NOT EXISTS held_until timestamptz,
  ADD COLUMN IF NOT EXISTS paused_at timestamptz;

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_max_in_flight_range CHECK (max_in_flight BETWEEN 1 AND 1000),
    ADD CONSTRAINT endpoints_rate_limit_range CHECK (rate_limit_per_second BETWEEN 0.01 AND 10000),
    ADD CONSTRAINT endpoints_consecutive_failures_nonnegative CHECK (consecutive_failures >= 0);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- ordering 'subject' makes every subject an ordered lane of the endpoint
-- (outbox.advance_lanes, below): its deliveries run one at a time, in
-- fan-out order. 'none' (the default): no order.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS ordering text NOT NULL DEFAULT 'none';

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_ordering_known CHECK (ordering IN ('none', 'subject'));
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- Serves the fan-out: the enabled endpoints, read for every relay pass.
CREATE INDEX IF NOT EXISTS endpoints_enabled_by_id
  ON outbox.endpoints (id)
  WHERE disabled_at IS NULL;

-- Serves the sweep that disables endpoints failing for too long.
CREATE INDEX IF NOT EXISTS endpoints_failing_by_failing_since
  ON outbox.endpoints (failing_since)
  WHERE failing_since IS NOT NULL AND disabled_at IS NULL;

--------------------------------------------------------------------------------
-- Jobs: outboxd's own queue
--------------------------------------------------------------------------------

DO $$
BEGIN
  CREATE TYPE outbox.job_state AS ENUM ('available', 'running', 'retryable', 'completed', 'discarded');
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

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
  event_id     bigint           NOT NULL REFERENCES outbox.events (id) ON DELETE CASCADE,
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

ALTER TABLE outbox.jobs SET (
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02
);

-- A webhook job names its endpoint. Deleting the endpoint keeps the job
-- (SET NULL) so that it ends visibly, discarded with "endpoint deleted",
-- rather than vanishing; its event still cascades as before.
ALTER TABLE outbox.jobs
  ADD COLUMN IF NOT EXISTS endpoint_id bigint REFERENCES outbox.endpoints (id) ON DELETE SET NULL;

DO $$
BEGIN
  ALTER TABLE outbox.jobs
    ADD CONSTRAINT jobs_endpoint_only_for_webhooks CHECK (endpoint_id IS NULL OR kind = 'webhook');
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- The attempt that completed a delivery, on its job: the answer's status
-- code (NULL for a mail) and how long the request took, written with the
-- completion itself. Such an attempt has no row in outbox.deliveries,
-- which keeps every other: the failed ones, and a success that came after
-- its job was taken from it (rescued, and run again). Nearly every
-- delivery succeeds at once, so that is a row, two index entries and a
-- foreign-key check fewer for nearly every delivery, and a deliveries
-- table as large as the failures, not the traffic. Jobs completed by a
-- release before these columns hold NULL (their success is a deliveries
-- row); readers take a success from here only where duration_ms is set.
ALTER TABLE outbox.jobs
  ADD COLUMN IF NOT EXISTS status_code integer,
  ADD COLUMN IF NOT EXISTS duration_ms integer;

-- A replay is an operator's request to send an endpoint deliveries again:
-- the events of a window (kind 'replay', replay.go) or its discarded
-- deliveries (kind 'retry_discarded', jobs.go). The jobs it enqueues or
-- sets to run again carry its id (jobs.replay_id) and run in the
-- endpoint's replay lane (outbox.claim_jobs): behind its live deliveries,
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
--                   at a time as its lane drains (replay.go, feedReplay),
--                   not all at its start: 100,000 jobs inserted in its
--                   first 28 s were the worst minute of live latency
--                   beside it (README, "Delivery lanes under load"). NULL
--                   for a 'retry_discarded', enqueued at once, and for a
--                   replay until its count is written. The count starts
--                   it just before the first event it found.
--   last_event_id   a 'replay''s end: the last event its count found,
--                   where its enqueue stops. NULL: no end, for a replay
--                   begun before the column existed.
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
CREATE TABLE IF NOT EXISTS outbox.replays (
  id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  endpoint_id  bigint      NOT NULL REFERENCES outbox.endpoints (id) ON DELETE CASCADE,
  kind         text        NOT NULL,
  window_from  timestamptz,
  window_to    timestamptz,
  topics       text[],
  jobs_total   bigint      NOT NULL DEFAULT 0,
  created_at   timestamptz NOT NULL DEFAULT now(),
  enqueued_at  timestamptz,
  cancelled_at timestamptz,
  finished_at  timestamptz,

  CONSTRAINT replays_kind_known CHECK (kind IN ('replay', 'retry_discarded')),
  CONSTRAINT replays_jobs_total_nonnegative CHECK (jobs_total >= 0),
  CONSTRAINT replays_finished_once_enqueued CHECK (finished_at IS NULL OR enqueued_at IS NOT NULL)
);

-- Serves an endpoint's replays, newest first, and the cascade from
-- endpoints.
CREATE INDEX IF NOT EXISTS replays_by_endpoint
  ON outbox.replays (endpoint_id, id);

ALTER TABLE outbox.replays
  ADD COLUMN IF NOT EXISTS jobs_enqueued bigint NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS enqueue_after bigint;

-- last_event_id (above): without it, a replay's last batch walked from
-- its last event to the end of the table, through every event recorded
-- since, in a statement of seconds beside live traffic (README,
-- "Delivery lanes under load").
ALTER TABLE outbox.replays
  ADD COLUMN IF NOT EXISTS last_event_id bigint;

-- Serves the workers' look for replays still to enqueue (replay.go,
-- feedReplays), several times a second.
CREATE INDEX IF NOT EXISTS replays_enqueuing
  ON outbox.replays (id)
  WHERE enqueued_at IS NULL AND enqueue_after IS NOT NULL;

-- A replay's jobs. SET NULL when its row goes: only a finished replay's
-- row is deleted, so only finished jobs lose it (a retry by hand of one
-- then runs live).
ALTER TABLE outbox.jobs
  ADD COLUMN IF NOT EXISTS replay_id bigint REFERENCES outbox.replays (id) ON DELETE SET NULL;

DO $$
BEGIN
  ALTER TABLE outbox.jobs
    ADD CONSTRAINT jobs_replay_only_for_webhooks CHECK (replay_id IS NULL OR kind = 'webhook');
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- Index jobs_by_replay_state: schema_indexes.sql.

-- replay_share is how many of an endpoint's deliveries its replay lane
-- may run at once: a quarter of its cap, at least 1. replayShare in
-- replay.go is the same rule, for the dry run's estimate
-- (TestReplayShareNumbers).
CREATE OR REPLACE FUNCTION outbox.replay_share(max_in_flight integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT greatest(1, max_in_flight / 4)
$$;

-- Indexes jobs_waiting_live_by_endpoint, jobs_waiting_replay_by_endpoint,
-- jobs_waiting_without_endpoint, jobs_running_by_endpoint,
-- jobs_running_replay_by_endpoint: schema_indexes.sql.

-- claim_jobs is the workers' claim (deliver.go). It takes up to batch due
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
-- jit = off keeps that cost from compiling the statement: 700 ms a claim,
-- measured. enable_bitmapscan = off makes the counts of an endpoint's running
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
-- them. claim_jobs(batch), below, is the previous release's call, kept as
-- a function of its own rather than a default of replica, so that a
-- previous release applying its own schema.sql replaces that one and
-- leaves no two functions matching claim_jobs(batch).
--
-- answered are deliveries of the claiming replica whose attempt has
-- succeeded and whose outcome its completer has not written yet
-- (deliver.go, workerPool.answered). They are still running in the table,
-- but hold no request to their endpoint any more, so its max_in_flight
-- does not count them: a delivery holds its place for its request, not
-- for the wait for a batch of outcomes to commit. (A failed attempt keeps
-- its place until its outcome, and what it does to the endpoint, is
-- written.) Another replica's claims count them until their outcome is
-- written, which delays, never overloads.
-- claim_jobs(batch, replica), below, is the previous release's call, with
-- none.
--
-- Its columns are named in the caller's SELECT, so a column added here
-- leaves a replica still running the previous release working (it calls
-- claim_jobs(batch), and ignores start_in_ms); a change of its result type
-- needs the DROP, which CREATE OR REPLACE cannot do.
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer);
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer, integer);
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer, bigint);
DROP FUNCTION IF EXISTS outbox.claim_jobs(integer, bigint, bigint[]);
CREATE FUNCTION outbox.claim_jobs(batch integer, replica bigint, answered bigint[])
RETURNS TABLE (id bigint, kind text, attempt integer, max_attempts integer,
               endpoint_id bigint,
               event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
               traceparent text, tracestate text,
               url text, secret bytea, previous_secret bytea, disabled_reason text,
               start_in_ms integer, wake_on_outcome boolean, replay_yields boolean)
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
              j.replay_id, j.lane_key
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
         c.replay_id IS NOT NULL AND coalesce(fl.narrowed, false)
  FROM claimed AS c
  JOIN outbox.events AS e ON e.id = c.event_id
  CROSS JOIN subscribers_filled AS sf
  LEFT JOIN outbox.endpoints AS ep ON ep.id = c.endpoint_id
  LEFT JOIN paced AS p ON p.id = c.id
  LEFT JOIN filled AS fl ON fl.id = c.endpoint_id;
END
$$;

-- claim_jobs(batch, replica) counts every running job against the cap:
-- the previous release's call, for replicas still running it during an
-- upgrade.
CREATE FUNCTION outbox.claim_jobs(batch integer, replica bigint)
RETURNS TABLE (id bigint, kind text, attempt integer, max_attempts integer,
               endpoint_id bigint,
               event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
               traceparent text, tracestate text,
               url text, secret bytea, previous_secret bytea, disabled_reason text,
               start_in_ms integer, wake_on_outcome boolean)
LANGUAGE sql VOLATILE
ROWS 100
AS $$
  SELECT c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id,
         c.event_id, c.topic, c.subject, c.payload, c.created_at,
         c.traceparent, c.tracestate,
         c.url, c.secret, c.previous_secret, c.disabled_reason,
         c.start_in_ms, c.wake_on_outcome
  FROM outbox.claim_jobs(batch, replica, '{}'::bigint[]) AS c
$$;

-- claim_jobs(batch) is a claim held by no replica: the call of the
-- release before that, for replicas still running it during an upgrade.
CREATE FUNCTION outbox.claim_jobs(batch integer)
RETURNS TABLE (id bigint, kind text, attempt integer, max_attempts integer,
               endpoint_id bigint,
               event_id bigint, topic text, subject text, payload jsonb, created_at timestamptz,
               traceparent text, tracestate text,
               url text, secret bytea, previous_secret bytea, disabled_reason text,
               start_in_ms integer)
LANGUAGE sql VOLATILE
ROWS 100
AS $$
  SELECT c.id, c.kind, c.attempt, c.max_attempts, c.endpoint_id,
         c.event_id, c.topic, c.subject, c.payload, c.created_at,
         c.traceparent, c.tracestate,
         c.url, c.secret, c.previous_secret, c.disabled_reason,
         c.start_in_ms
  FROM outbox.claim_jobs(batch, NULL::bigint) AS c
$$;

--------------------------------------------------------------------------------
-- Ordered lanes: one delivery at a time per (endpoint, subject)
--------------------------------------------------------------------------------

-- A delivery to an endpoint with ordering 'subject' carries its event's
-- subject as lane_key. Of the unfinished deliveries of one lane, at most
-- one is active (available, retryable or running, with a real due time);
-- the others are held: 'available' with scheduled_at 'infinity', which no
-- claim ever finds due and which sits at the end of the endpoint's lane in
-- jobs_waiting_live_by_endpoint (or jobs_waiting_replay_by_endpoint), so a
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
ALTER TABLE outbox.jobs
  ADD COLUMN IF NOT EXISTS lane_key text;

-- Indexes jobs_held_by_lane_event, jobs_one_active_per_lane:
-- schema_indexes.sql.

-- advance_lanes makes the next held delivery of each given lane due: the
-- one of the lowest event id, if the lane has no active delivery and no
-- earlier event of its subject that the endpoint's topics select is still
-- waiting to be fanned out. That last rule is what makes fan-out order
-- commit order: two relays can fan out a subject's events 2 and 3 at
-- once, and 3's transaction commit first; 3 then waits for 2, whose
-- relay's own call advances the lane. The un-fanned events are read once
-- per call, those below the highest held head only: in steady state, the
-- other relays' batches. (Read for every lane, unbounded, they were most
-- of the call's time: README, "Delivery lanes under load".)
--
-- Two callers can race: the relay inserting a held delivery and the
-- completer finishing the active one, each unable to see the other's
-- uncommitted row, would both leave the lane held. So every caller
-- locks the lanes first and decides in a second statement, whose
-- snapshot sees whatever the previous holder of a lane committed. The
-- locks are transaction-scoped advisory locks, one per lane, so only
-- callers of the same lane wait for each other (the endpoint's row, the
-- lock before, made every completer and relay of an endpoint wait for
-- each other): a shared lock on the endpoint (first key
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
-- Returns how many deliveries it made due.
CREATE OR REPLACE FUNCTION outbox.advance_lanes(endpoint_ids bigint[], lane_keys text[], hold boolean)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
DECLARE
  advanced integer;
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

  -- The head of a lane with no active delivery: its held one of the
  -- lowest event id.
  WITH lane AS (
    SELECT DISTINCT g.endpoint_id, g.lane_key, ep.topics
    FROM unnest(endpoint_ids, lane_keys) AS g(endpoint_id, lane_key)
    JOIN outbox.endpoints AS ep ON ep.id = g.endpoint_id
    WHERE g.lane_key IS NOT NULL
  ),
  head AS MATERIALIZED (
    SELECT h.id, h.event_id, l.lane_key, l.topics
    FROM lane AS l
    CROSS JOIN LATERAL (
      SELECT j.id, j.event_id
      FROM outbox.jobs AS j
      WHERE j.endpoint_id = l.endpoint_id
        AND j.lane_key = l.lane_key
        AND j.state IN ('available', 'retryable', 'running')
        AND j.scheduled_at = 'infinity'
      ORDER BY j.event_id
      LIMIT 1
    ) AS h
    WHERE NOT EXISTS (
      SELECT 1
      FROM outbox.jobs AS a
      WHERE a.endpoint_id = l.endpoint_id
        AND a.lane_key = l.lane_key
        AND a.state IN ('available', 'retryable', 'running')
        AND a.scheduled_at < 'infinity'
    )
  ),
  unfanned AS MATERIALIZED (
    SELECT e.id, e.subject, e.topic
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
    );
  GET DIAGNOSTICS advanced = ROW_COUNT;
  RETURN advanced;
END
$$;

-- The form without hold, which fan-out, replays, retries by hand and
-- rescues call, as the binaries from before hold did (their completers
-- too): hold true.
CREATE OR REPLACE FUNCTION outbox.advance_lanes(endpoint_ids bigint[], lane_keys text[])
RETURNS integer
LANGUAGE sql VOLATILE
AS $$
  SELECT outbox.advance_lanes(endpoint_ids, lane_keys, true)
$$;

-- Indexes jobs_running_by_attempted_at, jobs_by_event_id,
-- jobs_finished_by_state_finalized_at, jobs_one_per_event_endpoint:
-- schema_indexes.sql.

-- Wake the workers when jobs are inserted, the same way events wake the relay.
-- The payload names the relay process whose pass inserted them (its
-- outbox.fan_out sets outbox.relay_origin for its transaction; '' for any
-- other insert): that process's listener skips it, as its relay pokes its
-- own workers (notify.go, wakeups.origin).
CREATE OR REPLACE FUNCTION outbox.notify_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('outbox_jobs', coalesce(current_setting('outbox.relay_origin', true), ''));
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER jobs_notify_workers
  AFTER INSERT ON outbox.jobs
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_jobs();

--------------------------------------------------------------------------------
-- Deliveries: what each webhook attempt got back
--------------------------------------------------------------------------------

-- One row per webhook attempt that reached its outcome, except the one
-- that completed its job (whose status and duration are on the job,
-- outbox.jobs.status_code), for the panel: the status code (NULL when no
-- response came: a timeout, a refused address), how long it took, and the
-- start of the answer. Bounded per job by
-- max_attempts and per row by the CHECKs below, and deleted with its job
-- (ON DELETE CASCADE), so the job cleaner and events retention bound it too.
CREATE TABLE IF NOT EXISTS outbox.deliveries (
  job_id           bigint      NOT NULL REFERENCES outbox.jobs (id) ON DELETE CASCADE,
  attempt          integer     NOT NULL,
  endpoint_id      bigint,     -- no foreign key: the record outlives a deleted endpoint
  finished_at      timestamptz NOT NULL DEFAULT now(),
  duration_ms      integer     NOT NULL,
  status_code      integer,
  error            text        NOT NULL DEFAULT '',
  response_excerpt text        NOT NULL DEFAULT '',

  PRIMARY KEY (job_id, attempt),
  CONSTRAINT deliveries_attempt_positive CHECK (attempt > 0),
  CONSTRAINT deliveries_duration_nonnegative CHECK (duration_ms >= 0),
  CONSTRAINT deliveries_status_code_http CHECK (status_code BETWEEN 100 AND 999),
  CONSTRAINT deliveries_error_length CHECK (length(error) <= 2100),
  CONSTRAINT deliveries_response_excerpt_length CHECK (length(response_excerpt) <= 1100)
);

-- Index deliveries_by_endpoint_finished_at: schema_indexes.sql.

--------------------------------------------------------------------------------
-- Delivery statistics: per endpoint and minute, shared by every replica
--------------------------------------------------------------------------------

-- One row per endpoint and minute in which a request was made to it: the
-- attempts, their outcomes by class, and the time from each delivered
-- event's commit to its first 2xx, counted into fixed buckets. The
-- completers write it (outcome.go, writeDeliveryStats) in the transaction
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
CREATE TABLE IF NOT EXISTS outbox.delivery_stats (
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
);

-- Serves the all-endpoints window (GET /api/stats, the overview) and the
-- retention sweep's oldest-first delete; an endpoint's window reads the
-- primary key.
CREATE INDEX IF NOT EXISTS delivery_stats_by_minute
  ON outbox.delivery_stats (minute);

-- One row per endpoint and minute in which the relay fanned deliveries out
-- to it: how many (a replay's and a retry by hand's are not counted: they
-- send again what was produced before). The relay's fan-out statement
-- (relay.go, fanOutSQL) adds to it in the transaction that enqueues them,
-- by the database's clock. A table of its own, not a column of
-- delivery_stats, so that relays and completers never wait on each
-- other's rows. Read and deleted with delivery_stats (stats.go), by the
-- same retention window.
CREATE TABLE IF NOT EXISTS outbox.fanout_stats (
  endpoint_id bigint      NOT NULL,
  minute      timestamptz NOT NULL,
  deliveries  bigint      NOT NULL,

  PRIMARY KEY (endpoint_id, minute)
);

-- Serves the all-endpoints window and the retention sweep, as
-- delivery_stats_by_minute does.
CREATE INDEX IF NOT EXISTS fanout_stats_by_minute
  ON outbox.fanout_stats (minute);

-- last_fanned_at is when the relay last fanned deliveries out to the
-- endpoint in that minute: set by the same upsert that counts them, so
-- it costs no write of its own. NULL in rows a previous release wrote.
ALTER TABLE outbox.fanout_stats
  ADD COLUMN IF NOT EXISTS last_fanned_at timestamptz;

-- live_flows says whether live deliveries flow to endpoint ep: whether
-- the relay has fanned some out to it within the last second
-- (fanout_stats, a probe of at most two rows by key). While they do, its
-- replay lane is narrowed (replay_width), and the claim lets a replayed
-- delivery's place be taken by the next claim the live ones bring
-- (outbox.claim_jobs, replay_yields). The dry run's estimate (replay.go,
-- previewReplay) reads it too.
--
-- PL/pgSQL, not SQL: a SQL function whose body holds a subquery is never
-- inlined, and is parsed and planned again in every statement that calls
-- it. As SQL, it took a third of a claim's time in a drain (auto_explain);
-- alone, about 0.1 ms a call more than the same function in PL/pgSQL,
-- which keeps its plan for the session (pgbench).
CREATE OR REPLACE FUNCTION outbox.live_flows(ep bigint)
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
-- at once (outbox.claim_jobs): its replay_share of max_in_flight while it
-- is quiet, and one while live deliveries flow to it (live_flows). A
-- replay's requests compete with the live ones for more than the
-- receiver: the same workers, claims and outcome batches, the same
-- database and host. What a replay costs live deliveries on a busy host
-- is its rate, not its lane (README, "Delivery lanes under load").
-- Replayed deliveries already running when live ones begin finish; the
-- lane narrows as they do. The rule is replay_width(live, max_in_flight),
-- for a caller that has asked live_flows already (outbox.claim_jobs); an
-- expression without a subquery, which PostgreSQL inlines.
CREATE OR REPLACE FUNCTION outbox.replay_width(live boolean, max_in_flight integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN live THEN 1 ELSE outbox.replay_share(max_in_flight) END
$$;

CREATE OR REPLACE FUNCTION outbox.replay_width(ep bigint, max_in_flight integer)
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
-- endpoint id. The relay fans these out to one owner-notify job each
-- (ownernotify.go); endpoints and subscribers get them only by naming them
-- (topic_matches). last_error is the attempt that caused the change, which
-- the webhook sender records just before, in the same transaction.
CREATE OR REPLACE FUNCTION outbox.endpoint_state_event() RETURNS trigger
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
    )
  );
  RETURN NULL;
END
$$;

-- The WHEN clause is the transition: a failing endpoint failing again, or
-- a disabled one disabled again, records nothing. A 410 sets both columns
-- at once and is one "disabled" event.
CREATE OR REPLACE TRIGGER endpoints_state_event
  AFTER UPDATE OF failing_since, disabled_at ON outbox.endpoints
  FOR EACH ROW
  WHEN ((OLD.disabled_at IS NULL AND NEW.disabled_at IS NOT NULL)
     OR (OLD.failing_since IS NULL AND NEW.failing_since IS NOT NULL AND NEW.disabled_at IS NULL))
  EXECUTE FUNCTION outbox.endpoint_state_event();

-- One row per owner notification that took a slot of its owner's hourly
-- cap (-owner-notify-per-hour, 5). Keyed by the job, so a retry of the job
-- finds its slot and does not take a second one. A notification over the
-- cap takes no slot: its job completes with a note and is counted. Rows
-- go with their job (the job cleaner deletes completed jobs after 24 h,
-- long after the hour that counts).
CREATE TABLE IF NOT EXISTS outbox.owner_notify_slots (
  job_id      bigint      PRIMARY KEY REFERENCES outbox.jobs (id) ON DELETE CASCADE,
  owner_email text        NOT NULL,
  taken_at    timestamptz NOT NULL DEFAULT now()
);

-- Serves the cap's count: an owner's slots taken in the last hour.
CREATE INDEX IF NOT EXISTS owner_notify_slots_by_owner_taken_at
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
-- the API (inbox.go).
CREATE TABLE IF NOT EXISTS outbox.inbox_sources (
  name                       text        PRIMARY KEY,
  secret                     bytea       NOT NULL,
  previous_secret            bytea,
  previous_secret_expires_at timestamptz,
  topic_prefix               text        NOT NULL,
  created_at                 timestamptz NOT NULL DEFAULT now(),

  CONSTRAINT inbox_sources_name_format CHECK (name ~ '^[a-z0-9_-]{1,50}$'),
  CONSTRAINT inbox_sources_topic_prefix_format CHECK (topic_prefix ~ '^([A-Za-z0-9_][A-Za-z0-9_.:/-]{0,99})?$'),
  -- Any non-empty key up to 64 bytes: a source's secret is the sender's,
  -- and senders other than outboxd choose their own sizes.
  CONSTRAINT inbox_sources_secret_length CHECK (length(secret) BETWEEN 1 AND 64),
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
-- configured alike meets the row. event_id has no foreign key on purpose: events are pruned
-- first, and the dedup record outliving its event is the safe direction.
CREATE TABLE IF NOT EXISTS outbox.inbox (
  source      text        NOT NULL,
  webhook_id  text        NOT NULL,
  received_at timestamptz NOT NULL DEFAULT now(),
  event_id    bigint,

  PRIMARY KEY (source, webhook_id),
  CONSTRAINT inbox_webhook_id_length CHECK (length(webhook_id) BETWEEN 1 AND 256)
);

-- Index inbox_by_received_at: schema_indexes.sql.

-- One row per inbox source and minute: how many webhooks it received (new,
-- recorded as an event), how many were duplicates (accepted, the webhook-id
-- seen before) and how many were refused, by class, with the last refusal's
-- reason (truncated to 200 characters) and time. Refusals are counted,
-- never stored whole. The inbox (inbox.go) adds to the row: received and
-- duplicates in the transaction that records the webhook, a refusal with
-- one statement of its own. The panel's Inbox page and GET /api/sources
-- read it.
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
CREATE TABLE IF NOT EXISTS outbox.inbox_stats (
  minute              timestamptz NOT NULL, -- the start of the minute the request came in
  source              text        NOT NULL,
  received            bigint      NOT NULL DEFAULT 0,
  duplicates          bigint      NOT NULL DEFAULT 0,
  bad_signature       bigint      NOT NULL DEFAULT 0,
  stale_timestamp     bigint      NOT NULL DEFAULT 0,
  unknown_source      bigint      NOT NULL DEFAULT 0,
  too_large           bigint      NOT NULL DEFAULT 0,
  malformed           bigint      NOT NULL DEFAULT 0,
  last_refusal_reason text,
  last_refused_at     timestamptz,

  PRIMARY KEY (minute, source),
  CONSTRAINT inbox_stats_last_refusal_reason_length CHECK (length(last_refusal_reason) <= 200),
  CONSTRAINT inbox_stats_last_refusal CHECK ((last_refusal_reason IS NULL) = (last_refused_at IS NULL))
);

-- The class of the minute's last refusal, beside its reason, so that the
-- Inbox page can say which kind each recent reason was. NULL in the rows
-- counted before the column existed, and without a refusal.
ALTER TABLE outbox.inbox_stats
  ADD COLUMN IF NOT EXISTS last_refusal_class text
    CONSTRAINT inbox_stats_last_refusal_class CHECK (
      last_refusal_class IN ('bad_signature', 'stale_timestamp', 'unknown_source', 'too_large', 'malformed')
    );

--------------------------------------------------------------------------------
-- Subject index: the latest event per subject (an in-process subscriber)
--------------------------------------------------------------------------------

-- Kept by the built-in subscriber "subjects" (subjects.go): for every
-- subject of every topic, the latest event recorded for it, by event id.
-- The topic is part of the key because a subject means something only
-- within its topic: outbox.watch makes the watched row's primary key the
-- subject, so orders and accounts watched as order.changed and
-- account.changed both have a subject '42', two rows that must not
-- overwrite each other. Its upsert never moves backwards (an older event
-- delivered late changes nothing), which also makes a second delivery of
-- the same event a no-op. Its jobs are coalesced per topic and subject
-- within one relay pass. Rows live as long as their subject; a search by
-- prefix serves the panel and GET /api/subjects.
CREATE TABLE IF NOT EXISTS outbox.subjects (
  subject       text        NOT NULL,
  topic         text        NOT NULL,
  last_event_id bigint      NOT NULL,
  payload       jsonb       NOT NULL,
  updated_at    timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT subjects_pkey PRIMARY KEY (subject, topic)
);

-- An index made before the topic joined the key was keyed by subject
-- alone; its rows are unique by (subject, topic) too, so the new key is
-- built over them as they are.
DO $$
BEGIN
  IF (SELECT array_length(conkey, 1) FROM pg_constraint
      WHERE conname = 'subjects_pkey' AND conrelid = 'outbox.subjects'::regclass) = 1 THEN
    ALTER TABLE outbox.subjects
      DROP CONSTRAINT subjects_pkey,
      ADD CONSTRAINT subjects_pkey PRIMARY KEY (subject, topic);
  END IF;
END
$$;

-- Index subjects_by_subject_prefix: schema_indexes.sql.

--------------------------------------------------------------------------------
-- Retention's last cycle: what every replica's overview alerts on
--------------------------------------------------------------------------------

-- One row, rewritten by whichever replica ran the last retention cycle
-- (retention.go), so that every replica's overview can tell that storage
-- bounds are not being enforced: a cycle that failed, or stopped at the
-- anomaly cap, says so here until a later cycle succeeds. Skipped cycles
-- (another replica held the lock) write nothing.
CREATE TABLE IF NOT EXISTS outbox.retention_last_cycle (
  singleton   boolean     PRIMARY KEY DEFAULT true,
  finished_at timestamptz NOT NULL,
  error       text        NOT NULL DEFAULT '',
  CONSTRAINT retention_last_cycle_one_row CHECK (singleton),
  CONSTRAINT retention_last_cycle_error_length CHECK (length(error) <= 2100)
);

--------------------------------------------------------------------------------
-- Secrets at rest
--------------------------------------------------------------------------------

-- With -secrets-key, outboxd stores every secret sealed (secrets.go):
-- exactly 98 bytes, starting with the format's version byte 1, whatever
-- the secret's length. The length CHECKs above allow plaintext secrets
-- only; these replace them, allowing either. Plaintext rows stay as they
-- are: `outboxd secrets encrypt` seals them, never a migration.
ALTER TABLE outbox.endpoints
  DROP CONSTRAINT IF EXISTS endpoints_secret_length,
  ADD CONSTRAINT endpoints_secret_length CHECK (
    length(secret) BETWEEN 24 AND 64
    OR (length(secret) = 98 AND get_byte(secret, 0) = 1)
  );

ALTER TABLE outbox.inbox_sources
  DROP CONSTRAINT IF EXISTS inbox_sources_secret_length,
  ADD CONSTRAINT inbox_sources_secret_length CHECK (
    length(secret) BETWEEN 1 AND 64
    OR (length(secret) = 98 AND get_byte(secret, 0) = 1)
  );

--------------------------------------------------------------------------------
-- Panel sessions: revocable, and the same on every replica
--------------------------------------------------------------------------------

-- One row per browser signed in to the panel (admin.go). The cookie holds
-- a random id; the row holds only its HMAC under the admin token, so the
-- table gives away no cookie, and a new token signs every session out.
-- Sign-in inserts the row, valid for 12 hours; sign-out deletes it, so a
-- copy of the cookie is refused by every replica from then on, as is an
-- expired one. The table is bounded without a sweep: each sign-in deletes
-- up to 100 expired rows, oldest first, and the oldest live ones beyond
-- the newest 1,000 (those browsers must sign in again).
CREATE TABLE IF NOT EXISTS outbox.panel_sessions (
  id_hash    bytea       PRIMARY KEY,
  created_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  CONSTRAINT panel_sessions_id_hash_length CHECK (length(id_hash) = 32)
);

-- Serves the sign-in's deletions: the expired rows oldest first, the live
-- ones newest first past the 1,000th.
CREATE INDEX IF NOT EXISTS panel_sessions_by_expires_at
  ON outbox.panel_sessions (expires_at);

--------------------------------------------------------------------------------
-- Alert acknowledgements: seen by an operator, on every replica's panel
--------------------------------------------------------------------------------

-- One row per alert name an operator acknowledged (overview.go): the level
-- the alert was at, and when. The overview shows the alert as acknowledged
-- while it stays at or below that level in the episode that was
-- acknowledged, and fires it again when it gets worse. At most one row for
-- every alert outboxd has: bounded.
CREATE TABLE IF NOT EXISTS outbox.alert_acks (
  name            text        PRIMARY KEY,
  level           bigint      NOT NULL,
  acknowledged_at timestamptz NOT NULL,
  CONSTRAINT alert_acks_name_length CHECK (length(name) BETWEEN 1 AND 100)
);

--------------------------------------------------------------------------------
-- Recovery probes: an endpoint disabled for failing comes back by itself
--------------------------------------------------------------------------------

-- disabled_cause says who disabled an endpoint, beside the reason text:
--
--   operator  POST .../disable (endpoints.go). An operator's disable of an
--             endpoint already disabled keeps its first reason and time,
--             and becomes the cause: the endpoint stays off until enabled.
--   gone      the receiver answered 410 Gone (outcome.go), to a delivery or
--             to a probe.
--   failure   failing continuously for -endpoint-disable-after (5 days;
--             retention.go).
--
-- NULL while enabled, and on endpoints disabled before this column
-- existed, which are never probed: their cause is unknown.
--
-- An endpoint disabled for failure, with recovery_probes on (the default;
-- PATCH {"recovery_probes": false} opts out) and an http(s) URL, gets a
-- signed probe (probe.go) on the schedule of outbox.probe_interval. The
-- prober writes next_probe_at and last_probe_at when it claims a probe,
-- before it sends it, and last_probe_error with the answer. A 2xx
-- re-enables the endpoint with recovered_at and recovered_reason, and
-- recovery_replay_from, the start of the replay of what it missed, which
-- stays set until the replay's last catch-up pass has run. Probes add no
-- rows: each one updates its endpoint's row.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS disabled_cause text,
  ADD COLUMN IF NOT EXISTS recovery_probes boolean NOT NULL DEFAULT true,
  ADD COLUMN IF NOT EXISTS next_probe_at timestamptz,
  ADD COLUMN IF NOT EXISTS last_probe_at timestamptz,
  ADD COLUMN IF NOT EXISTS last_probe_error text,
  ADD COLUMN IF NOT EXISTS recovered_at timestamptz,
  ADD COLUMN IF NOT EXISTS recovered_reason text,
  ADD COLUMN IF NOT EXISTS recovery_replay_from timestamptz;

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_disabled_cause CHECK (
      disabled_cause IS NULL
      OR (disabled_cause IN ('operator', 'gone', 'failure') AND disabled_at IS NOT NULL)
    ),
    ADD CONSTRAINT endpoints_last_probe_error_length CHECK (length(last_probe_error) <= 2100),
    ADD CONSTRAINT endpoints_recovered_reason_length CHECK (length(recovered_reason) <= 1000);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- probe_interval is the schedule: how long after a probe made at "at" the
-- next one is due, for an endpoint disabled at disabled_at. Hourly through
-- the first day (a receiver back after an outage is found within the
-- hour), then every 6 hours, for as long as it stays disabled: 24 probes
-- the first day, 4 a day after. The first probe is due an hour after the
-- disable.
CREATE OR REPLACE FUNCTION outbox.probe_interval(disabled_at timestamptz, at timestamptz)
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
CREATE OR REPLACE FUNCTION outbox.probe_due_at(disabled_cause text, recovery_probes boolean, url text,
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
CREATE TABLE IF NOT EXISTS outbox.replicas (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  host       text        NOT NULL,
  pid        integer     NOT NULL,
  -- The release (version.go) and the VCS revision it was built from
  -- ('' when unknown): the overview flags replicas of different releases.
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

-- held_by is the replica whose claim last marked the job running
-- (outbox.claim_jobs), meaningful while it runs: the dead-replica rescue
-- finds a dead replica's jobs by it, among the running ones
-- (jobs_running_by_attempted_at: no index of its own, since running jobs
-- are at most the replicas' worker slots). No foreign key: the row goes
-- when its replica is declared dead, and the jobs' history keeps the id.
ALTER TABLE outbox.jobs
  ADD COLUMN IF NOT EXISTS held_by bigint;

-- The indexes of the queue tables, built CONCURRENTLY.

-- schema_indexes.sql: the indexes of the queue tables (events, jobs,
-- deliveries, inbox, subjects), the tables that grow with the traffic.
-- migrate (database.go) applies this file after schema.sql has committed,
-- one statement at a time and outside any transaction, because a CREATE
-- INDEX inside the migration's transaction holds a lock that blocks every
-- INSERT, UPDATE and DELETE of its table until the whole build is done: on
-- a table of millions of rows, a stall of producers for as long as that
-- takes. A build CONCURRENTLY takes a lock that lets writes go on.
--
-- Only two forms are allowed here, and migrate refuses any other:
--
--   CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ON outbox.table ...
--   DROP INDEX CONCURRENTLY IF EXISTS outbox.name
--
-- An index that exists and is valid is skipped without a statement sent.
-- One left invalid by a concurrent build that did not finish (a crash, a
-- cancel, a lock timeout, a duplicate refused by a unique index) is
-- dropped and built again. Names and definitions are those the queries
-- were planned against (the pinned plan tests): change one and it is a new
-- index, with its own name.
--
-- Every index of the queue tables belongs here, not in schema.sql: a test
-- (TestSchemaBuildsNoQueueTableIndexInItsTransaction) refuses one there.

-- Serves the relay's claim (outbox.claim_unfanned): "un-fanned, not
-- poisoned, oldest first". The predicate is exactly the claim's WHERE.
CREATE INDEX CONCURRENTLY IF NOT EXISTS events_unfanned_by_id
  ON outbox.events (id)
  WHERE fanned_out_at IS NULL AND poisoned_at IS NULL;

-- Serves the poisoned count and list on the overview.
CREATE INDEX CONCURRENTLY IF NOT EXISTS events_poisoned_by_id
  ON outbox.events (id)
  WHERE poisoned_at IS NOT NULL;

-- Serves events retention (retention.go): "fanned out before the cutoff,
-- oldest first". Un-fanned and poisoned rows, which retention never deletes,
-- stay out of it, so the hourly delete walks only rows it may remove instead
-- of scanning the whole table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS events_fanned_by_fanned_out_at
  ON outbox.events (fanned_out_at)
  WHERE fanned_out_at IS NOT NULL;

-- Serves a replay's progress (replay.go): its jobs waiting or running,
-- and those finished in the last minute, by state; and the SET NULL when
-- a replay's row is deleted.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_by_replay_state
  ON outbox.jobs (replay_id, state, finalized_at)
  WHERE replay_id IS NOT NULL;

-- Serve the workers' claim (outbox.claim_jobs), one lane at a time:
-- an endpoint's live waiting jobs, soonest first; its replayed ones, the
-- same way; and the jobs of no endpoint (in-process subscribers, owner
-- notifications, deliveries of a deleted endpoint), soonest first.
-- Partial, so they hold only the jobs waiting to run, however many
-- finished ones the table keeps. They replace one index of every waiting
-- job by due time, in which a hung endpoint's backlog sat in front of
-- everyone else's jobs; and one of an endpoint's waiting jobs, live and
-- replayed together, in which a replay's backlog sat in front of the live
-- deliveries behind it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_waiting_live_by_endpoint
  ON outbox.jobs (endpoint_id, scheduled_at, id)
  WHERE state IN ('available', 'retryable') AND endpoint_id IS NOT NULL AND replay_id IS NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_waiting_replay_by_endpoint
  ON outbox.jobs (endpoint_id, scheduled_at, id)
  WHERE state IN ('available', 'retryable') AND endpoint_id IS NOT NULL AND replay_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_waiting_without_endpoint
  ON outbox.jobs (scheduled_at, id)
  WHERE state IN ('available', 'retryable') AND endpoint_id IS NULL;

-- Serve the claim's counts of an endpoint's deliveries in flight, which
-- it holds below the endpoint's cap, and of its replayed ones, which it
-- holds below the replay share: at most max_in_flight entries each.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_running_by_endpoint
  ON outbox.jobs (endpoint_id)
  WHERE state = 'running' AND endpoint_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_running_replay_by_endpoint
  ON outbox.jobs (endpoint_id)
  WHERE state = 'running' AND endpoint_id IS NOT NULL AND replay_id IS NOT NULL;

-- Serves advance_lanes: a lane's held deliveries by event id, the first
-- of which is its next; whether the lane has an active one is
-- jobs_one_active_per_lane's to say. Held ones only: a delivery made due,
-- then claimed, writes no entry here, where in jobs_unfinished_by_lane_event
-- (every unfinished delivery, active first) each of those versions wrote
-- one, on the ordered drain's every delivery.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_held_by_lane_event
  ON outbox.jobs (endpoint_id, lane_key, event_id)
  WHERE lane_key IS NOT NULL
    AND state IN ('available', 'retryable', 'running')
    AND scheduled_at = 'infinity';

-- The guarantee itself, whatever a statement elsewhere does: a second
-- active delivery in a lane is refused by the database.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_one_active_per_lane
  ON outbox.jobs (endpoint_id, lane_key)
  WHERE lane_key IS NOT NULL
    AND state IN ('available', 'retryable', 'running')
    AND scheduled_at < 'infinity';

-- Serves the rescuer: jobs running for longer than the rescue horizon.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_running_by_attempted_at
  ON outbox.jobs (attempted_at)
  WHERE state = 'running';

-- Serves the event's job list, the ON DELETE CASCADE from events, and
-- retention's check that no unfinished job still needs an event.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_by_event_id
  ON outbox.jobs (event_id);

-- Serves the job cleaner and the count of recent completions. Partial, so
-- that only a job's last change, to completed or discarded, writes an entry:
-- the first index of this name held every job and took an entry at every
-- state change, three per job.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_finished_by_state_finalized_at
  ON outbox.jobs (state, finalized_at)
  WHERE state IN ('completed', 'discarded');

-- One delivery job per (event, endpoint): a second fan-out of an event to
-- the same endpoint is refused by the database, not delivered twice. Also
-- serves an endpoint's delivery list and the SET NULL on endpoint delete.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_one_per_event_endpoint
  ON outbox.jobs (endpoint_id, event_id)
  WHERE endpoint_id IS NOT NULL;

-- Serves an endpoint's recent attempts on the panel.
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_by_endpoint_finished_at
  ON outbox.deliveries (endpoint_id, finished_at);

-- Serves an endpoint's recent attempts beside the one above: those that
-- completed their jobs, which have no deliveries row. Partial, so that only
-- a delivery's completion writes an entry.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_completed_by_endpoint_finalized_at
  ON outbox.jobs (endpoint_id, finalized_at)
  WHERE state = 'completed' AND endpoint_id IS NOT NULL;

-- Serves inbox retention: DELETE FROM outbox.inbox ... WHERE received_at <
-- cutoff, in batches.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_by_received_at
  ON outbox.inbox (received_at);

-- Serves the search by subject prefix (LIKE 'prefix%'), whatever the
-- database's collation.
CREATE INDEX CONCURRENTLY IF NOT EXISTS subjects_by_subject_prefix
  ON outbox.subjects (subject text_pattern_ops);

-- Indexes replaced by the ones above, dropped after their replacements
-- exist, so no query goes without one: jobs_due_by_scheduled_at and
-- jobs_waiting_by_endpoint by the claim's lanes, jobs_unfinished_by_lane by
-- jobs_unfinished_by_lane_event and that by jobs_held_by_lane_event with
-- jobs_one_active_per_lane, jobs_by_state_finalized_at (every job, an
-- entry at every state change) by jobs_finished_by_state_finalized_at.
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_due_by_scheduled_at;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_waiting_by_endpoint;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_unfinished_by_lane;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_unfinished_by_lane_event;
DROP INDEX CONCURRENTLY IF EXISTS outbox.jobs_by_state_finalized_at;

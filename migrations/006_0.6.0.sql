-- 006_0.6.0.sql: from release 0.5.0 to 0.6.0.
--
-- migrate.go applies it in one transaction, except its CONCURRENTLY
-- index statements and constraint validations, which run after that
-- transaction, one at a time. Written before releases recorded their
-- migrations by number: every statement can run again over a database
-- that has part of it, as a build between two releases left it.

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
CREATE OR REPLACE FUNCTION outbox.owner_admits(event_owner text, topic text, owner_key text,
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

-- owner addresses the event to one owner of endpoints (outbox.owners.key,
-- a key the application chooses, such as its own customer id): the
-- fan-out sends an event with an owner only to that owner's endpoints,
-- and one without (NULL) only to endpoints of no owner and to those whose
-- owner shares its topic (owner_admits, above). No foreign key: an event
-- may be addressed to a key no owner has yet, and keeps its address when
-- an owner is deleted. Its format is the owners' key's (owners_key_format):
-- an address no owner could have fails the recording, as a bad topic does,
-- rather than reach nobody unseen. NOT VALID: rows stored before the column hold
-- NULL, and need no scan of the table.
ALTER TABLE outbox.events
  ADD COLUMN IF NOT EXISTS owner text;

DO $$
BEGIN
  ALTER TABLE outbox.events
    ADD CONSTRAINT events_owner_format CHECK (owner ~ '^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$') NOT VALID;
EXCEPTION WHEN duplicate_object THEN
  NULL;
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
DROP FUNCTION IF EXISTS outbox.mark_claimed_fanned_out(bigint[]);

CREATE FUNCTION outbox.mark_claimed_fanned_out(in_claimed bigint[])
RETURNS TABLE (id bigint, topic text, subject text, payload jsonb, owner text)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
BEGIN
  RETURN QUERY
  UPDATE outbox.events AS e
  SET fanned_out_at = now(),
      committed_at = outbox.commit_time(e, e.xmin)
  WHERE e.id = ANY (in_claimed)
  RETURNING e.id, e.topic, e.subject, e.payload, e.owner;
END
$$;

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
DO $$
BEGIN
  -- Whether this migration makes the four-argument form, whose grants
  -- are then copied from the three-argument one (below).
  PERFORM set_config('outbox.record_owner_is_new',
                     (to_regprocedure('outbox.record(text, text, jsonb, text)') IS NULL)::text, true);
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

-- The three-argument form records an event addressed to no owner: every
-- call written before owners had keys, and the readiness check of a
-- replica of the release before (which looks this signature up). Not a
-- default of the four-argument form: beside this one, a default would
-- make every three-argument call ambiguous. SECURITY DEFINER like it, so
-- that a role granted only this form (as roles were before the owner
-- argument) keeps recording; PL/pgSQL, whose RETURN of a call runs
-- without planning a statement.
CREATE OR REPLACE FUNCTION outbox.record(topic text, subject text, payload jsonb)
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
-- operation and the row before and after. Triggers installed before
-- watches took an owner have no 'owner=' argument, and record as before.
-- Like outbox.record, it runs as its owner, so the application's writes
-- record events without any right on outboxd's tables; a table's owner
-- needs EXECUTE on it to install the triggers (outbox.watch).
CREATE OR REPLACE FUNCTION outbox.watch_row() RETURNS trigger
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

REVOKE EXECUTE ON FUNCTION outbox.record(text, text, jsonb, text) FROM PUBLIC;

-- A role granted the three-argument form before the four-argument one
-- existed is granted that one too, once, as it is made: the
-- three-argument form calls it, and an application that records keeps
-- recording across the upgrade.
DO $$
DECLARE
  grantee text;
BEGIN
  IF current_setting('outbox.record_owner_is_new', true) = 'true' THEN
    FOR grantee IN
      SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
      FROM pg_proc AS p, aclexplode(p.proacl) AS a
      WHERE p.oid = 'outbox.record(text, text, jsonb)'::regprocedure
        AND a.privilege_type = 'EXECUTE'
        AND a.grantee <> p.proowner
    LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.record(text, text, jsonb, text) TO %s', grantee);
    END LOOP;
  END IF;
END
$$;

-- watch records an event with the given topic on every INSERT and DELETE of
-- tbl, and on an UPDATE only when one of the watched columns really changed
-- (NULL-safe). The check is the UPDATE trigger's WHEN clause, so a no-op
-- update never even calls the trigger function. An empty or NULL column list
-- watches every column. owner_column, when given, names the column whose
-- value addresses each event to an owner (outbox.record's owner): a
-- customer_id column makes every change of a customer's row an event for
-- that customer's endpoints alone. Calling it again with the same table
-- and topic replaces the triggers; outbox.unwatch removes them.
DROP FUNCTION IF EXISTS outbox.watch(regclass, text, text[]);

CREATE OR REPLACE FUNCTION outbox.watch(tbl regclass, topic text, columns text[], owner_column text DEFAULT NULL)
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

-- filter_error says why the relay stopped evaluating the endpoint's
-- filter, and filter_error_at since when: the filter raised an error that
-- silent does not cover, or ran past its share of a relay pass (relay.go,
-- holdFailingFilters). Every pass shares one statement, so a filter that
-- fails it fails every endpoint's fan-out; held, the filter is not
-- evaluated, and every event of the endpoint's topics counts as not
-- matched for it (fanout_stats.filter_errors) until its filter is written
-- again, which clears both (the same text tries it again). The relay
-- sets them, after trying the filter alone on the events of the pass that
-- failed, and so does the migration for a filter an earlier release
-- stored that filter_problem's rules refuse (below); the API and the
-- panel show them.
ALTER TABLE outbox.endpoints
  ADD COLUMN IF NOT EXISTS filter_error text,
  ADD COLUMN IF NOT EXISTS filter_error_at timestamptz;

DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_filter_error_with_time CHECK ((filter_error IS NULL) = (filter_error_at IS NULL)),
    ADD CONSTRAINT endpoints_filter_error_length CHECK (length(filter_error) <= 2100);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

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
-- folded with its constant arguments, the probe first. About 0.1 ms for
-- a filter of a few conditions (0.02 ms before the cost rules), a few
-- milliseconds for one of 4,096 bytes; endpoints_filter_allowed runs it
-- on every write of a filtered endpoint's row.
CREATE OR REPLACE FUNCTION outbox.filter_problem(f jsonpath)
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
CREATE OR REPLACE FUNCTION outbox.filter_predicate_problem(f jsonpath)
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
CREATE OR REPLACE FUNCTION outbox.filter_regex_problem(printed text)
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
DROP FUNCTION IF EXISTS outbox.filter_operand_problem(text);

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

-- At most 4,096 bytes (filters.go, maxFilterLen): a filter is a
-- predicate, not a program.
DO $$
BEGIN
  ALTER TABLE outbox.endpoints
    ADD CONSTRAINT endpoints_filter_length CHECK (length(filter) <= 4096);
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

-- endpoints_filter_allowed holds every filter to filter_problem's rules,
-- but a held one (filter_error_at), which is never evaluated. A filter
-- stored under earlier rules that today's refuse is held here, as the
-- schema changes, with the rule that refuses it: its endpoint gets no
-- event of its topics until the filter is written again, and every other
-- write of its row goes through (a CHECK is evaluated on every update of
-- the row, the completer's of its health among them). A database made
-- before filters were held carries the constraint without the hold:
-- replaced, once.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_constraint
             WHERE conrelid = 'outbox.endpoints'::regclass AND conname = 'endpoints_filter_allowed'
               AND pg_get_constraintdef(oid) NOT LIKE '%filter_error_at%') THEN
    ALTER TABLE outbox.endpoints DROP CONSTRAINT endpoints_filter_allowed;
  END IF;
  UPDATE outbox.endpoints
  SET filter_error = 'stored under earlier rules, which today''s refuse: ' || outbox.filter_problem(filter_path),
      filter_error_at = now()
  WHERE filter_path IS NOT NULL
    AND filter_error_at IS NULL
    AND outbox.filter_problem(filter_path) IS NOT NULL;
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                 WHERE conrelid = 'outbox.endpoints'::regclass AND conname = 'endpoints_filter_allowed') THEN
    ALTER TABLE outbox.endpoints
      ADD CONSTRAINT endpoints_filter_allowed CHECK (filter_error_at IS NOT NULL OR outbox.filter_problem(filter_path) IS NULL);
  END IF;
END
$$;

-- Serves the fan-out: the endpoints whose filter is held, read once by a
-- pass that meets a filtered endpoint (outbox.fan_out, routed). Almost
-- always empty.
CREATE INDEX IF NOT EXISTS endpoints_filter_held
  ON outbox.endpoints (id)
  WHERE filter_error_at IS NOT NULL;

DROP FUNCTION IF EXISTS outbox.claim_lane_jobs(integer, bigint, bigint[], boolean);

DROP FUNCTION IF EXISTS outbox.claim_lane_jobs(integer, bigint, bigint[], boolean, bigint[]);

DROP FUNCTION IF EXISTS outbox.claim_lane_jobs(integer, bigint, bigint[], boolean, bigint[], integer);

-- claim_due_jobs is claim_lane_jobs without ahead: every running job not
-- answered holds its endpoint's place, so that every job it claims may
-- start at once. The relay's claim (fan_out_claiming) and the releases
-- before claim_lane_jobs call it.
DROP FUNCTION IF EXISTS outbox.claim_due_jobs(integer, bigint, bigint[]);

DROP FUNCTION IF EXISTS outbox.claim_due_jobs(integer, bigint, bigint[], integer);

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
-- the filters whose errors silent does not cover. A filter the relay held
-- after it failed a pass anyway (endpoints.filter_error_at) is not
-- evaluated: passes is NULL, no delivery, counted in filter_errors. The
-- held endpoints are read once per statement (ARRAY(...) is an InitPlan,
-- run when first needed: only when an event meets a filtered endpoint);
-- as IN (SELECT ...) the planner may re-run the subquery for every row.
-- An event reaches an endpoint only within the tenancy boundary
-- (owner_admits): its owner's endpoints for an event addressed to an
-- owner, endpoints of no owner (and owners sharing its topic) for one
-- addressed to nobody. An event kept out so is no delivery and no
-- filtered_out: for that endpoint it does not exist.
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
-- deliveries, other replicas' included, but in_answered) and, of
-- in_replica's workers, in_worker_share leaves (claim_lane_jobs'
-- worker_share; NULL: no bound), counted under the lane's claim lock
-- (lock_born_lanes) in a statement after it, as a claim counts; no more
-- than in_claim_batch in all, each endpoint's by event id, the endpoints
-- taking turns. A lane another claim holds gets none. What a claim would have told the worker of each comes with it
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

DROP FUNCTION IF EXISTS outbox.fan_out(integer, bigint, jsonb, integer, double precision, text, integer, bigint, bigint[], integer);

CREATE FUNCTION outbox.fan_out(in_batch integer, in_event_id bigint, in_subscribers jsonb,
                               in_max_attempts integer, in_breaker_delay double precision, in_origin text,
                               in_claim_batch integer DEFAULT 0, in_replica bigint DEFAULT NULL,
                               in_answered bigint[] DEFAULT '{}', in_worker_share integer DEFAULT NULL)
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
    SELECT m.id, m.topic, m.subject, m.payload, m.owner
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
    SELECT ep.id AS endpoint_id, ep.breaker_opened_at, ep.ordering, ep.filter_path, t.topic,
           o.key AS owner_key, o.allowed_topics, o.shared_topics
    FROM outbox.endpoints AS ep
    JOIN topics AS t ON outbox.topic_matches(ep.topics, t.topic)
    LEFT JOIN outbox.owners AS o ON o.id = ep.owner_id
    WHERE ep.disabled_at IS NULL
  ),
  routed AS (
    SELECT m.id, m.subject, es.endpoint_id, es.breaker_opened_at, es.ordering,
           CASE WHEN es.filter_path IS NULL THEN true
                WHEN es.endpoint_id = ANY (ARRAY(SELECT h.id FROM outbox.endpoints AS h WHERE h.filter_error_at IS NOT NULL))
                THEN NULL
                ELSE coalesce(jsonb_path_match(m.payload, es.filter_path, silent => true), false) END AS passes
    FROM marked AS m
    JOIN endpoint_subscriptions AS es ON es.topic = m.topic
    WHERE outbox.owner_admits(m.owner, m.topic, es.owner_key, es.allowed_topics, es.shared_topics)
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
           (SELECT least(ep.max_in_flight - count(*),
                         in_worker_share - count(*) FILTER (WHERE r.held_by = in_replica))
            FROM outbox.jobs AS r
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
-- in_answered and in_worker_share as the workers' claim takes them): the
-- deliveries fan_out made running as it inserted them or, when it made
-- none so and the pass enqueued jobs and was not full, a claim of due jobs
-- (claim_due_jobs) in the same transaction, after the fan-out, whose jobs
-- it sees: a subscriber's, an ordered lane's made due, a rate-limited
-- endpoint's. A pass that is not full is the relay keeping up, one to a
-- few events a pass: its deliveries start as they are made, where
-- otherwise the workers, woken after its commit, would claim them in a
-- statement and a commit of their own, a few milliseconds on every event's
-- way to its receiver. A full pass is a backlog, which the workers claim
-- at their own pace. A pass that made deliveries running claims nothing
-- more: the jobs it left are the workers' to claim, and the relay wakes
-- them for those (relay.go, drain).
DROP FUNCTION IF EXISTS outbox.fan_out_claiming(integer, jsonb, integer, double precision, text, integer, bigint, bigint[]);

DROP FUNCTION IF EXISTS outbox.fan_out_claiming(integer, jsonb, integer, double precision, text, integer, bigint, bigint[], integer);

-- filter_errors is how many of them the endpoint did not get because its
-- filter was held after an error (outbox.endpoints, filter_error): not
-- matched, as filtered_out, but for a fault of the filter rather than a
-- verdict on the payload.
ALTER TABLE outbox.fanout_stats
  ADD COLUMN IF NOT EXISTS filter_errors bigint NOT NULL DEFAULT 0;

-- endpoint_state_event records an event when an endpoint becomes failing
-- (failing_since goes from NULL to set while it is enabled) or disabled
-- (disabled_at goes from NULL to set: a 410, the 5-day sweep, an operator),
-- in the transaction that changes the state, whoever changes it. Topic
-- outboxd.endpoint.failing or outboxd.endpoint.disabled, subject the
-- endpoint id, addressed to the endpoint's owner (owner_admits): an
-- owner's endpoints may receive the news of its own endpoints, and no
-- one else's; those of the admin's endpoints reach the admin's. The relay
-- fans these out to one owner-notify job each (ownernotify.go); endpoints
-- and subscribers get them only by naming them (topic_matches). last_error is the attempt that caused the change, which
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
    ),
    (SELECT o.key FROM outbox.owners AS o WHERE o.id = NEW.owner_id)
  );
  RETURN NULL;
END
$$;

-- owner addresses every event a source's webhooks become to the owner
-- with that key (events.owner): the webhooks a customer's system sends in
-- go on to that customer's endpoints alone. NULL: to no owner. The
-- format is the events' (events_owner_format).
ALTER TABLE outbox.inbox_sources
  ADD COLUMN IF NOT EXISTS owner text;

DO $$
BEGIN
  ALTER TABLE outbox.inbox_sources
    ADD CONSTRAINT inbox_sources_owner_format CHECK (owner ~ '^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$');
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

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
-- it (owners.go, ownerLimits); the fan-out and replays test the topics
-- again (owner_admits), so that narrowing them takes effect at once.
ALTER TABLE outbox.owners
  ADD COLUMN IF NOT EXISTS key text,
  ADD COLUMN IF NOT EXISTS allowed_topics text[],
  ADD COLUMN IF NOT EXISTS shared_topics text[] NOT NULL DEFAULT '{}',
  ADD COLUMN IF NOT EXISTS max_endpoints integer NOT NULL DEFAULT 10,
  ADD COLUMN IF NOT EXISTS max_in_flight integer NOT NULL DEFAULT 8,
  ADD COLUMN IF NOT EXISTS max_rate_limit_per_second double precision,
  ADD COLUMN IF NOT EXISTS max_replay_window_seconds bigint;

-- owners_default_key gives an owner made without a key 'owner-' and its
-- id, which the identity column has drawn before a BEFORE trigger runs:
-- also for a replica of the release before keys, which inserts none.
CREATE OR REPLACE FUNCTION outbox.owners_default_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.key := coalesce(NEW.key, 'owner-' || NEW.id);
  RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER owners_default_key
  BEFORE INSERT ON outbox.owners
  FOR EACH ROW EXECUTE FUNCTION outbox.owners_default_key();

UPDATE outbox.owners SET key = 'owner-' || id WHERE key IS NULL;

ALTER TABLE outbox.owners ALTER COLUMN key SET NOT NULL;

DO $$
BEGIN
  ALTER TABLE outbox.owners
    ADD CONSTRAINT owners_key_unique UNIQUE (key),
    ADD CONSTRAINT owners_key_format CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9_.:@/+=-]{0,199}$'),
    ADD CONSTRAINT owners_allowed_topics_count CHECK (cardinality(allowed_topics) <= 100),
    ADD CONSTRAINT owners_shared_topics_count CHECK (cardinality(shared_topics) <= 100),
    ADD CONSTRAINT owners_max_endpoints_range CHECK (max_endpoints BETWEEN 0 AND 10000),
    ADD CONSTRAINT owners_max_in_flight_range CHECK (max_in_flight BETWEEN 1 AND 1000),
    ADD CONSTRAINT owners_max_rate_limit_range CHECK (max_rate_limit_per_second BETWEEN 0.01 AND 10000),
    ADD CONSTRAINT owners_max_replay_window_range CHECK (max_replay_window_seconds >= 0);
EXCEPTION WHEN duplicate_object OR duplicate_table THEN
  NULL;
END
$$;

-- Nothing calls it: fan_out claims and marks in statements of its own.
DROP FUNCTION IF EXISTS outbox.mark_fanned_out(integer, bigint);

-- The numbered migrations this database has (schema.sql says what each
-- column holds). migrate.go fills it in the transaction that creates it,
-- with every migration up to this one. outbox.schema_applied stays until
-- the next release's migration: a replica of 0.5.0 looks its own schema up
-- there when it restarts during a rolling upgrade.
CREATE TABLE IF NOT EXISTS outbox.migrations (
  version     integer     PRIMARY KEY CHECK (version > 0),
  name        text        NOT NULL UNIQUE,
  checksum    text        NOT NULL,
  applied_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);

-- The formats of the trace context and of the owner's key were added
-- with their columns, NOT VALID, so that adding them scanned nothing:
-- every row stored before holds NULL. Validating them reads the table
-- under a lock that lets producers write.
ALTER TABLE outbox.events VALIDATE CONSTRAINT events_traceparent_format;
ALTER TABLE outbox.events VALIDATE CONSTRAINT events_tracestate_format;
ALTER TABLE outbox.events VALIDATE CONSTRAINT events_owner_format;

-- The search by payload (GET /api/events?payload=): built online, as
-- every index of a queue table is.
CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_payload ON outbox.events USING gin (payload jsonb_path_ops);

--------------------------------------------------------------------------------
-- Erasure by subject (docs/erasure.md)
--------------------------------------------------------------------------------

-- An erased event has no payload (schema.sql says what each column
-- holds). The check is added NOT VALID, scanning nothing, and validated
-- online below.
ALTER TABLE outbox.events
  ADD COLUMN IF NOT EXISTS erased_at timestamptz,
  ALTER COLUMN payload DROP NOT NULL;

DO $$
BEGIN
  ALTER TABLE outbox.events
    ADD CONSTRAINT events_erased_without_payload CHECK (
      (payload IS NULL) = (erased_at IS NOT NULL) AND (erased_at IS NULL OR fanned_out_at IS NOT NULL)
    ) NOT VALID;
EXCEPTION WHEN duplicate_object THEN
  NULL;
END
$$;

ALTER TABLE outbox.subjects ALTER COLUMN payload DROP NOT NULL;

ALTER TABLE outbox.audit_log
  ADD COLUMN IF NOT EXISTS events bigint,
  DROP CONSTRAINT IF EXISTS audit_log_subject_kind_known,
  ADD CONSTRAINT audit_log_subject_kind_known CHECK (subject_kind IN ('endpoint', 'owner', 'source', 'erasure'));

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
  FROM outbox.jobs AS j
  WHERE j.event_id = ANY (erased)
    AND d.job_id = j.id;

  PERFORM outbox.advance_lanes(lanes.endpoint_ids, lanes.keys, true);

  UPDATE outbox.subjects AS s
  SET payload = NULL
  WHERE s.subject = in_subject
    AND s.payload IS NOT NULL;

  RETURN cardinality(erased);
END
$$;

ALTER TABLE outbox.events VALIDATE CONSTRAINT events_erased_without_payload;

-- A replica claims only the job kinds it runs (schema.sql, claim_lane_jobs'
-- kinds). The claims take the kinds as a last parameter with a default of
-- every kind, which the release before's calls, without it, keep.
DROP FUNCTION IF EXISTS outbox.claim_lane_jobs(integer, bigint, bigint[], boolean, bigint[], integer);

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
      WHERE kinds IS NULL OR 'webhook' = ANY (kinds)
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
        AND (SELECT least(
                      CASE WHEN ahead AND replica IS NOT NULL AND ep.breaker_opened_at IS NULL
                              AND ep.rate_limit_per_second IS NULL AND ep.consecutive_failures = 0
                              AND ep.id <> ALL (cooling)
                              AND count(*) FILTER (WHERE r.held_by = replica AND r.id <> ALL (answered)
                                                     AND r.attempted_at < now() - interval '250 milliseconds') = 0
                         THEN 2 * (ep.max_in_flight - count(*) FILTER (WHERE r.held_by IS DISTINCT FROM replica))
                              - count(*) FILTER (WHERE r.held_by = replica AND r.id <> ALL (answered))
                         ELSE CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END
                              - count(*) FILTER (WHERE r.id <> ALL (answered))
                      END,
                      worker_share - count(*) FILTER (WHERE r.held_by IS NOT DISTINCT FROM replica
                                                        AND r.id <> ALL (answered)))
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
      SELECT least(CASE WHEN ahead AND replica IS NOT NULL AND ep.breaker_opened_at IS NULL
                             AND ep.rate_limit_per_second IS NULL AND ep.consecutive_failures = 0
                             AND ep.id <> ALL (cooling) AND n.slow = 0
                        THEN 2 * (n.cap - n.others) - n.own
                        ELSE n.cap - n.holders
                   END,
                   worker_share - n.own) AS room,
             CASE WHEN ahead AND replica IS NOT NULL AND ep.disabled_at IS NULL
                  THEN n.cap - n.others
             END AS lane_limit
      FROM (SELECT CASE WHEN ep.breaker_opened_at IS NULL THEN ep.max_in_flight ELSE 1 END AS cap,
                   count(*) FILTER (WHERE r.id <> ALL (answered))::integer AS holders,
                   count(*) FILTER (WHERE r.held_by IS DISTINCT FROM replica)::integer AS others,
                   count(*) FILTER (WHERE r.held_by IS NOT DISTINCT FROM replica
                                      AND r.id <> ALL (answered))::integer AS own,
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
        AND (kinds IS NULL OR w.kind = ANY (kinds))
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

DROP FUNCTION IF EXISTS outbox.claim_due_jobs(integer, bigint, bigint[], integer);

CREATE OR REPLACE FUNCTION outbox.claim_due_jobs(batch integer, replica bigint DEFAULT NULL, answered bigint[] DEFAULT '{}',
                                                 worker_share integer DEFAULT NULL, kinds text[] DEFAULT NULL)
RETURNS SETOF outbox.claimed_job
LANGUAGE sql VOLATILE
ROWS 100
AS $$
  SELECT (l.job).* FROM outbox.claim_lane_jobs(batch, replica, answered, false, '{}', worker_share, kinds) AS l
$$;

DROP FUNCTION IF EXISTS outbox.fan_out_claiming(integer, jsonb, integer, double precision, text, integer, bigint, bigint[], integer);

CREATE OR REPLACE FUNCTION outbox.fan_out_claiming(in_batch integer, in_subscribers jsonb, in_max_attempts integer,
                                                   in_breaker_delay double precision, in_origin text,
                                                   in_claim_batch integer, in_replica bigint, in_answered bigint[],
                                                   in_worker_share integer DEFAULT NULL, in_kinds text[] DEFAULT NULL)
RETURNS TABLE (out_fanned bigint, out_jobs bigint, out_claimed outbox.claimed_job[])
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
  SELECT f.out_fanned, f.out_jobs, f.out_claimed INTO out_fanned, out_jobs, out_claimed
  FROM outbox.fan_out(in_batch, NULL, in_subscribers, in_max_attempts, in_breaker_delay, in_origin,
                      CASE WHEN in_kinds IS NULL OR 'webhook' = ANY (in_kinds) THEN in_claim_batch ELSE 0 END,
                      in_replica, in_answered, in_worker_share) AS f;
  IF cardinality(out_claimed) = 0 AND out_jobs > 0 AND out_fanned < in_batch AND in_claim_batch > 0 THEN
    out_claimed := ARRAY(SELECT c FROM outbox.claim_due_jobs(in_claim_batch, in_replica, in_answered,
                                                             in_worker_share, in_kinds) AS c);
  END IF;
  RETURN NEXT;
END
$$;

-- A replica names in its row the job kinds it runs, so that the overview
-- can say when due jobs wait for a kind no live replica runs
-- (jobs_no_runner). NULL in the rows of the release before.
ALTER TABLE outbox.replicas
  ADD COLUMN IF NOT EXISTS kinds text[];

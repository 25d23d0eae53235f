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

-- Serve the workers' claim (outbox.claim_due_jobs), one lane at a time:
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

-- Named queries. A block starts with `-- name: <name>` and runs to the next one.
-- Every statement here is a single round trip; multi-row writes are CTEs, so each is atomic
-- without an explicit BEGIN/COMMIT (and works behind PgBouncer in transaction mode).

-- name: ensure_run
-- A start message from any producer creates its run; a second start is a no-op. The run's
-- classification ($6) and region ($7, NULL: the default store) are fixed here for good. A
-- worker runs this insert inside start_and_load or start_keyed_and_load (below); alone, it is
-- what the benchmarks time those against (bench/start_costs.py) and how they seed runs.
INSERT INTO workflow_runs (workflow_id, workflow, schema_version, input, current_phase,
                           classification, region)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING workflow_id;

-- name: start_and_load
-- A start message's ensure_run and load_for_phase in one round trip (migration 0032): the run
-- created if a producer only enqueued it, then loaded (a pending run claimed) as
-- load_for_phase does. $1-$7 as ensure_run's, $8 the message's seq.
SELECT * FROM phasegate_start_and_load($1, $2, $3, $4::jsonb, $5, $6, $7, $8);

-- name: start_keyed
-- A keyed workflow's start as the release before 0034 sent it (bench/start_costs.py):
-- ensure_run and flow.sql's take_slot in one round trip (migration 0033), the load after it. $1-$7 as ensure_run's; $8-$14 as take_slot's $3-$9. The
-- run's status after the decision; NULL when the run does not exist.
SELECT phasegate_start_keyed($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9::integer, $10, $11, $12,
                             $13::integer, $14::double precision) AS status;

-- name: start_keyed_and_load
-- A keyed workflow's start_keyed and, unless the run was queued, its load_for_phase in one
-- round trip (migration 0034). $1-$14 as start_keyed's, $15 the message's seq. One row:
-- `taken` (start_keyed's result) and load_for_phase's columns (NULL when queued or no run).
-- $8 NULL (a message without the input): the run's own key, or `taken` = 'unkeyed' and
-- nothing written when the run has none.
SELECT * FROM phasegate_start_keyed_and_load($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9::integer,
                                             $10, $11, $12, $13::integer,
                                             $14::double precision, $15);

-- name: start_run
-- The run row and its first message in one statement: a crash can lose neither alone.
-- $9/$10: the run's classification and region, as in ensure_run. No row when the id existed;
-- else the outbox row's id and the run as created, in control.sql get_run's columns (the
-- API answers a start with it: no read after the write).
WITH run AS (
    INSERT INTO workflow_runs (workflow_id, workflow, schema_version, input, current_phase,
                               classification, region)
    VALUES ($1, $2, $3, $4::jsonb, $5, $9, $10)
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING workflow_id, workflow, status, next_seq, base_seq, epoch, current_phase,
              schema_version, tier, tier_label, attempts, error, created_at, updated_at,
              finished_at, classification, region, due_at, waiting_for
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', 0, $6, $7, $8 FROM run
    RETURNING outbox_id
)
SELECT ob.outbox_id, run.* FROM run, ob;

-- name: start_keyed_run
-- start_run for a workflow with a concurrency key (migration 0034): the run, its slot taken
-- ($11 the key, $12 its limit, $13-$15 the admission message, $16/$17 the rate) and, unless it
-- was queued, its start message ($6-$8) in the outbox. No row when the id existed; else the
-- outbox row's id (NULL when queued) and the run as created, as start_run's.
SELECT * FROM phasegate_start_keyed_run($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $11,
                                        $12::integer, $13, $14, $15, $16::integer,
                                        $17::double precision);

-- name: load_for_phase
-- Check + claim + load in one round trip: the run row (moved pending -> running, or waiting
-- -> running by the message of the seq it waits for: $3), the state committed at the
-- previous door, the latest in-phase progress for the seq about to run, and the payload of
-- the signal delivered to that seq (0010; NULL: none).
-- The statement is the server function of that name (migrations/0018_hot_path.sql:
-- its plans are kept per server connection, even behind a transaction-mode pooler).
SELECT * FROM phasegate_load_for_phase($1, $2, $3);

-- name: load_for_phases
-- Group load (phasegate/group_commit.py): load_for_phase for many messages in ONE statement.
-- $1/$2/$3: arrays of workflow ids, branches and seqs, one element per message. Returns one
-- row per message whose run exists, with its ordinal `i` (1-based). Per message, as
-- load_for_phase: a pending run is claimed; a waiting run only by a main-branch message of the
-- seq it waits for (its due time and wait cleared); the signal delivered to next_seq comes
-- back. The same run named twice (a duplicate delivery) is claimed once and returned for both.
-- The statement is the server function of that name (migrations/0018_hot_path.sql:
-- its plans are kept per server connection, even behind a transaction-mode pooler).
SELECT * FROM phasegate_load_for_phases($1, $2, $3);

-- name: commit_phase
-- THE commit: checkpoint + run position + successor message, conditional on the run still
-- being at this seq and running. First commit wins; a late duplicate changes nothing.
-- $18-$21 are null for a phase that simply advanced; a below-tier retry/escalation or a
-- re-run sets the checkpoint's outcome and rerun_of and the run's error/review.
-- $22-$24 (0010, phasegate/waits.py) are null unless the phase asked for a wait: a delay in
-- seconds or a moment, and a signal's name. The successor's row is then due at that time
-- (database time) and the run is `waiting`; a signal already kept for the run is matched
-- here (it makes the row due now). outbox_id comes back only for a row due now: the worker
-- sends those, the relay sends the others when they fall due. $25-$26: local continuation
-- (worker/continuation.py; null/0 without it, never together with a wait): the worker that
-- runs the successor itself and its lease, kept on the run's position instead of an outbox
-- row (0020: no row, no outbox_id). $27 is always null (a row to delete, for workers of an
-- earlier release). The statement is the server function of that name
-- (migrations/0018_hot_path.sql: its plans are kept per server connection, even behind a
-- transaction-mode pooler; 0020).
SELECT * FROM phasegate_commit_phase(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
    $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27);

-- name: commit_phases
-- Group commit (phasegate/group_commit.py): commit_phase for many runs in ONE statement. $1-$27
-- are arrays of commit_phase's arguments, one element per commit. Each row's condition is
-- checked on its own: a stale commit (run moved on, or not running) only loses its own row.
-- Two commits of one run and seq in a batch (a duplicate delivery) update the run once; the
-- one whose ordinal the UPDATE returns wins, and only its checkpoint and outbox row are
-- written. Returns one row per winning commit: its ordinal (1-based), commit time, outbox id.
-- Leases and a consumed row ($25-$27) are written per row as commit_phase does. Waits
-- ($22-$24: a due time, a kept signal matched, the run `waiting`) are NOT implemented here:
-- the store sends a commit with a wait alone (commit_phase), and a row with one makes this
-- statement fail (a cast in its first CTE), so its batch falls back to commit_phase row by
-- row.
-- The statement is the server function of that name (migrations/0018_hot_path.sql:
-- its plans are kept per server connection, even behind a transaction-mode pooler).
SELECT * FROM phasegate_commit_phases(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
    $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27);

-- name: continue_phase
-- A continued hop's commit (local continuation, worker/continuation.py): commit_phase for a
-- phase that advanced and whose successor this worker runs itself. The run stays `running`;
-- $18 holds the chain lease on its position for $19 seconds; $20 is the successor's
-- traceparent. No outbox row, no wait. Returns the checkpoint's time, NULL when the run was
-- no longer at this seq and running. Sent for a hop that commits alone; grouped hops are rows
-- of commit_phases (phasegate/store.py). The statement is the server function of that name
-- (migrations/0021_continued_commit.sql).
SELECT phasegate_continue_phase(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20
) AS committed_at;

-- name: advance_phase
-- A plain advance's commit (the phase advanced, the run stays running, its successor goes
-- through the outbox now: no wait, no chain lease): commit_phase for that case alone, with the
-- same writes under the same condition. $18-$20: the successor's dedup id, group id and body.
-- Returns the checkpoint's time and the outbox row's id; no row when the run was no longer at
-- this seq and running. Sent for a plain advance that commits alone; grouped, it is a row of
-- commit_phases (phasegate/store.py). The statement is the server function of that name
-- (migrations/0027_plain_advance_commit.sql).
SELECT * FROM phasegate_advance_phase(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20);

-- name: continue_phases
-- Group commit of continued hops (phasegate/group_commit.py): continue_phase for many runs in
-- ONE statement, sent when every commit of a batch is a continued hop (a batch with any other
-- commit goes through commit_phases). $1-$20 are arrays of continue_phase's arguments, one
-- element per hop; each row's condition is checked on its own, and of two hops of one run and
-- seq only one writes. Returns one row per hop that committed: its ordinal (1-based) and the
-- checkpoint's time. The statement is the server function of that name
-- (migrations/0024_continued_group_commit.sql).
SELECT * FROM phasegate_continue_phases(
    $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20);

-- name: record_failure
-- A phase raised: count the attempt; at the limit the run is failed with the error kept. The
-- attempt itself is kept too (0015, phase_attempts: the console's timeline) by this same
-- statement, so only a failure pays for it. $5: the phase, $6: the worker.
WITH run AS (
    UPDATE workflow_runs
       SET attempts = attempts + 1, error = $3, updated_at = now(),
           status = CASE WHEN attempts + 1 >= $4 THEN 'failed' ELSE status END,
           finished_at = CASE WHEN attempts + 1 >= $4 THEN now() ELSE finished_at END
     WHERE workflow_id = $1 AND next_seq = $2 AND status = 'running'
    RETURNING attempts, status
), kept AS (
    INSERT INTO phase_attempts (workflow_id, branch, seq, phase, attempt, outcome, error,
                                worker_id)
    SELECT $1, 'main', $2, $5::text, attempts,
           CASE WHEN status = 'failed' THEN 'failed' ELSE 'retry' END, $3, $6::text
      FROM run
)
SELECT attempts, status FROM run;

-- name: halt_run
-- Stop a run where it stands (needs_restart, checkpoint_corrupt): never a crash, never silent.
UPDATE workflow_runs
   SET status = $3, error = $4, updated_at = now(),
       finished_at = CASE WHEN $3 IN ('failed', 'cancelled') THEN now() END
 WHERE workflow_id = $1 AND next_seq = $2 AND status = 'running'
RETURNING workflow_id;

-- name: successor
-- The message a committed seq left behind (the newest, if a retry wrote another), and whether
-- a live lease says someone else takes care of it (database time). A row not due yet (a wait,
-- 0010) is left to the relay: a late duplicate of the waiting phase's message must not send
-- it early.
SELECT outbox_id, dedup_id, group_id, body, sent_at, leased
  FROM (SELECT outbox_id, dedup_id, group_id, body, sent_at, due_at,
               coalesce(lease_until > now(), false) AS leased
          FROM outbox
         WHERE workflow_id = $1 AND branch = $2 AND seq = $3
         ORDER BY outbox_id DESC
         LIMIT 1) latest
 WHERE due_at IS NULL OR due_at <= now();

-- name: mark_sent
UPDATE outbox SET sent_at = now() WHERE outbox_id = ANY($1::bigint[]) AND sent_at IS NULL;

-- name: claim_unsent
-- Relay: claim the rows that are due, in one short statement that commits before anything is
-- sent (no transaction or row lock held across the SQS call; fine behind PgBouncer in
-- transaction mode). Due: unsent, no live lease, and either a wait's due time (0010) has
-- come, or the lease expired (a worker's chain died: send at once), or, never leased and
-- never deferred, it was committed $1 seconds ago (database time). The claim is itself a
-- lease ($3 = the relay's id, $4 seconds): a relay that dies mid-send leaves its rows to
-- another relay once the claim expires. SKIP LOCKED lets relays racing for the same rows
-- split them.
WITH due AS (
    SELECT outbox_id
      FROM outbox
     WHERE sent_at IS NULL
       AND (lease_until IS NULL OR lease_until <= now())
       AND (due_at <= now()
            OR (due_at IS NULL
                AND coalesce(lease_until, created_at + make_interval(secs => $1)) <= now()))
     ORDER BY outbox_id
     LIMIT $2
     FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
   SET lease_holder = $3, lease_until = now() + make_interval(secs => $4)
  FROM due
 WHERE o.outbox_id = due.outbox_id
RETURNING o.outbox_id, o.dedup_id, o.group_id, o.body;

-- name: extend_leases
-- Rows leased to a worker ($1, $2) live $3 seconds more. Only rows still leased to it and
-- unsent: a lease that expired and was claimed by a relay stays lost.
UPDATE outbox SET lease_until = now() + make_interval(secs => $3)
 WHERE outbox_id = ANY($1::bigint[]) AND lease_holder = $2 AND sent_at IS NULL
RETURNING outbox_id;

-- name: extend_chains
-- A worker's heartbeat: the chain leases it holds on runs' positions ($1, $2; 0020) live $3
-- seconds more; returns the runs still held (a rescued chain is not).
SELECT * FROM phasegate_extend_chains($1::text[], $2, $3) AS held(workflow_id);

-- name: end_chain
-- A chain's message as an outbox row, its position's lease cleared (0020: the holder $3 ends
-- its chain, or with $3 NULL a rescuer takes an expired one); NULL when there was none to end.
SELECT phasegate_end_chain($1, $2, $3, $4, $5, $6, $7, $8) AS outbox_id;

-- name: chain_of
-- The chain lease on the position of a run at next_seq $2 (0020), and what its message is
-- made of, should it have to be rebuilt; no row: no chain. Where the chain is comes from the
-- run row: a live chain's position may be a heartbeat behind it (0030).
SELECT p.workflow_id, p.workflow, r.next_seq, r.current_phase, p.chain_traceparent,
       r.region, p.chain_until > now() AS live, p.chain_holder AS holder
  FROM run_positions p JOIN workflow_runs r ON r.workflow_id = p.workflow_id
 WHERE p.workflow_id = $1 AND r.next_seq = $2 AND r.status = 'running'
   AND p.chain_holder IS NOT NULL;

-- name: expired_chains
-- Relay: the chains whose lease ran out (their worker died mid-chain). run_positions holds
-- the runs that have not ended and is scanned whole, as for requeue_stalled.
SELECT p.workflow_id, p.workflow, r.next_seq, r.current_phase, p.chain_traceparent,
       r.region, false AS live, p.chain_holder AS holder
  FROM run_positions p JOIN workflow_runs r ON r.workflow_id = p.workflow_id
 WHERE p.chain_until <= now() AND p.chain_holder IS NOT NULL AND r.status = 'running'
 ORDER BY p.chain_until
 LIMIT $1;

-- name: release_leases
-- Give up leases ($2's) on rows that stay unsent: the relay sends them on its next rounds
-- (a failed relay send, a continued hop that will be retried).
UPDATE outbox SET lease_holder = NULL, lease_until = NULL
 WHERE outbox_id = ANY($1::bigint[]) AND lease_holder = $2 AND sent_at IS NULL;

-- name: requeue_stalled
-- Relay: a run that has not moved for $1 seconds although the message that wakes it was sent
-- as long ago. SQS lost that message, or something deleted it unprocessed ("a lost message
-- must never lose work"). The row becomes unsent again under a new deduplication id (SQS
-- would drop the old one for 5 minutes), so the relay sends it once more; if the first copy
-- was not lost after all, the worker sees a duplicate by seq. The runs come from
-- run_positions (0017): no index on updated_at, so the phase commit's update stays HOT. A
-- branch chain is a run of its own in this respect: a running branch that has not moved
-- although its message was sent gets it again (its live branches through branches_live_idx).
-- The claim of the relay that sent it the first time is cleared with it: a stall shorter than
-- that claim (PHASEGATE_RELAY_STALL_AFTER_S under the claim's 30 s) would otherwise hold the
-- row back until the old claim ran out.
WITH stalled AS (
    SELECT o.outbox_id
      FROM run_positions r
      JOIN LATERAL (
          SELECT outbox_id, sent_at FROM outbox o
           WHERE o.workflow_id = r.workflow_id AND o.branch = 'main' AND o.seq = r.next_seq
           ORDER BY outbox_id DESC LIMIT 1) o ON true
     WHERE r.status IN ('pending', 'running', 'waiting')
       AND r.updated_at < now() - make_interval(secs => $1)
       AND o.sent_at < now() - make_interval(secs => $1)
    UNION ALL
    SELECT o.outbox_id
      FROM branches b
      JOIN workflow_runs r ON r.workflow_id = b.workflow_id AND r.status = 'running'
      JOIN LATERAL (
          SELECT outbox_id, sent_at FROM outbox o
           WHERE o.workflow_id = b.workflow_id AND o.branch = b.branch AND o.seq = b.next_seq
           ORDER BY outbox_id DESC LIMIT 1) o ON true
     WHERE b.status = 'running'
       AND b.updated_at < now() - make_interval(secs => $1)
       AND o.sent_at < now() - make_interval(secs => $1)
), picked AS (
    SELECT outbox_id FROM stalled LIMIT $2
)
UPDATE outbox SET sent_at = NULL, lease_holder = NULL, lease_until = NULL,
       dedup_id = left(outbox.dedup_id, 64) || ':r' || floor(extract(epoch FROM now()))::bigint
  FROM picked
 WHERE outbox.outbox_id = picked.outbox_id
RETURNING outbox.workflow_id;

-- name: outbox_lag
-- Age of the oldest unsent outbox row, in seconds (0 when none); a wait's row counts from
-- its due time, and not at all before it. A row under a live lease is being taken care of
-- (a continued chain, a relay mid-send).
SELECT coalesce(extract(epoch FROM now() - min(coalesce(due_at, created_at))), 0)::float8
       AS lag_s
  FROM outbox WHERE sent_at IS NULL AND (due_at IS NULL OR due_at <= now())
   AND (lease_until IS NULL OR lease_until <= now());

-- name: quarantine
INSERT INTO quarantine (message_id, workflow_id, reason, body_bytes, worker_id)
VALUES ($1, $2, $3, $4, $5)
RETURNING quarantine_id;

-- name: emergency_checkpoint
-- In-phase progress saved under memory pressure; it never moves next_seq and is only
-- written while the run is still at this seq. The run row is read FOR KEY SHARE: a run being
-- deleted is waited for and then found gone, so no checkpoint outlives its run (0025).
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, worker_id)
SELECT workflow_id, $2, $3, $4, 'emergency', $5, $6::jsonb, $7, $8
  FROM workflow_runs
 WHERE workflow_id = $1 AND next_seq = $3 AND status = 'running'
   FOR KEY SHARE
RETURNING checkpoint_id;

-- =========================================================================================
-- Inside the room: steps, delivery receipts, tiers, reviews, re-runs, versions.
-- (phasegate/steps.py, phasegate/door.py, phasegate/tiers.py, phasegate/versions.py; schema 0002_steps)
-- =========================================================================================

-- name: step_claim
-- Before a write/execute step runs: record it as pre_execution, or find the record an earlier
-- attempt left (completed: replay its output; pre_execution: call again with the same key).
-- One round trip; the record is committed before the step's function is called.
WITH ins AS (
    INSERT INTO step_records (workflow_id, branch, seq, step_seq, step_name, category,
                              idempotency_key, input_hash, status, worker_id)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pre_execution', $9)
    ON CONFLICT (workflow_id, branch, seq, step_seq) DO NOTHING
    RETURNING step_name, category, idempotency_key, input_hash, status, NULL::text AS output
)
SELECT * FROM ins
UNION ALL
SELECT step_name, category, idempotency_key, input_hash, status, output::text
  FROM step_records
 WHERE workflow_id = $1 AND branch = $2 AND seq = $3 AND step_seq = $4
   AND NOT EXISTS (SELECT 1 FROM ins);

-- name: step_find
SELECT step_name, category, idempotency_key, input_hash, status, output::text AS output
  FROM step_records
 WHERE workflow_id = $1 AND branch = $2 AND seq = $3 AND step_seq = $4;

-- name: step_complete
-- After the step's function returned: its output, once (the first completion wins).
UPDATE step_records SET status = 'completed', output = $5::jsonb, completed_at = now()
 WHERE workflow_id = $1 AND branch = $2 AND seq = $3 AND step_seq = $4
   AND status = 'pre_execution'
RETURNING step_seq;

-- name: step_record_completed
-- A cached read step: its output, recorded after it ran (a concurrent duplicate keeps the first).
INSERT INTO step_records (workflow_id, branch, seq, step_seq, step_name, category,
                          idempotency_key, input_hash, status, output, worker_id, completed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'completed', $9::jsonb, $10, now())
ON CONFLICT (workflow_id, branch, seq, step_seq) DO NOTHING;

-- name: delivery_find
SELECT receipt::text AS receipt
  FROM deliveries WHERE workflow_id = $1 AND batch_id = $2 AND artifact_id = $3;

-- name: delivery_record
INSERT INTO deliveries (workflow_id, batch_id, artifact_id, idempotency_key, seq, receipt,
                        worker_id)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
ON CONFLICT (workflow_id, batch_id, artifact_id) DO NOTHING;

-- name: delivery_done_batches
SELECT batch_id FROM deliveries
 WHERE workflow_id = $1 AND artifact_id = '' AND batch_id = ANY($2::text[]);

-- name: room_entry
-- What a phase of a workflow with tiers or a version fetcher needs beyond load_for_phase, in
-- one round trip: the door it enters by (the checkpoint at seq - 1: how it ended, what it
-- re-ran, its staleness envelope and age in database time), the operator's review decision
-- for this seq (the signal phasegate.approve / phasegate.reject delivered to it under the
-- run's current epoch, 0014), the last review raised, and how many attempts the door's phase
-- has had so far. A decision written by an orchestrator of the previous release has no signal,
-- only its control_actions row: read that when there is no signal.
SELECT r.base_seq, r.epoch, r.review::text AS review,
       c.phase AS door_phase, c.outcome AS door_outcome, c.rerun_of AS door_rerun_of,
       c.resource_versions::text AS resource_versions,
       extract(epoch FROM now() - c.created_at)::float8 AS age_s,
       coalesce(
         (SELECT substr(s.name, length('phasegate.') + 1) FROM signals s
           WHERE s.workflow_id = r.workflow_id AND s.consumed_seq = $3
             AND s.consumed_epoch = r.epoch
             AND s.name LIKE 'phasegate.%' AND s.name IN ('phasegate.approve', 'phasegate.reject')
           ORDER BY s.signal_id DESC LIMIT 1),
         (SELECT a.action FROM control_actions a
           WHERE a.workflow_id = r.workflow_id AND a.seq = $3 AND a.epoch = r.epoch
             AND a.action IN ('approve', 'reject')
           ORDER BY a.action_id DESC LIMIT 1)) AS decision,
       (SELECT count(*) FROM checkpoints k
         WHERE k.workflow_id = r.workflow_id AND k.branch = $2 AND k.kind = 'phase'
           AND k.seq < $3
           AND (k.seq = coalesce(c.rerun_of, c.seq) OR k.rerun_of = coalesce(c.rerun_of, c.seq))
       )::int AS door_attempts
  FROM workflow_runs r
  LEFT JOIN checkpoints c
         ON c.workflow_id = r.workflow_id AND c.branch = $2 AND c.seq = $3 - 1
        AND c.kind = 'phase'
 WHERE r.workflow_id = $1;

-- name: room_checkpoint
-- The state a re-run starts from: the phase checkpoint before its first attempt.
SELECT state::text AS state, state_hash, schema_version,
       resource_versions::text AS resource_versions
  FROM checkpoints
 WHERE workflow_id = $1 AND branch = $2 AND seq = $3 AND kind = 'phase';

-- name: room_settle_run
-- Stop a run at its door without running a phase: awaiting_review (stale resources, with the
-- review record), completed (an approved review of the last phase), failed/needs_restart (a
-- re-run's input that is corrupt or cannot be upcast).
UPDATE workflow_runs
   SET status = $3, error = $4, review = coalesce($5::jsonb, review), updated_at = now(),
       finished_at = CASE WHEN $3 IN ('completed', 'failed', 'cancelled') THEN now() END
 WHERE workflow_id = $1 AND next_seq = $2 AND status = 'running'
RETURNING workflow_id;

-- name: versions_in_flight
-- `phasegate versions`: unfinished runs by workflow and by the schema version of the state
-- they will resume from (at_input: they start from their input, which has no version).
SELECT r.workflow, (r.next_seq = r.base_seq) AS at_input, c.schema_version AS version,
       count(*)::int AS runs
  FROM workflow_runs r
  LEFT JOIN checkpoints c
         ON c.workflow_id = r.workflow_id AND c.branch = 'main' AND c.seq = r.next_seq - 1
        AND c.kind = 'phase'
 WHERE r.status IN ('pending', 'running', 'awaiting_review', 'waiting')
 GROUP BY 1, 2, 3
 ORDER BY 1, 2, 3;

-- name: count_crash
-- One more crash of the transition on this message; returns the count so far.
INSERT INTO transition_crashes AS c (message_id, error_type) VALUES ($1, $2)
ON CONFLICT (message_id) DO UPDATE
   SET crashes = c.crashes + 1, error_type = excluded.error_type, updated_at = now()
RETURNING crashes;

-- name: fail_run
-- A run whose message the worker gave up on (quarantined after repeated crashes): failed,
-- with the reason, whatever seq it is at, unless it already ended.
UPDATE workflow_runs
   SET status = 'failed', error = $2, updated_at = now(), finished_at = now()
 WHERE workflow_id = $1 AND status NOT IN ('completed', 'failed', 'cancelled')
RETURNING workflow_id;

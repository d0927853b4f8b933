-- Outbox leases (issue 18). A lease is a promise that someone is taking care of a row that is
-- not sent yet, until `lease_until` (database time):
--   * a worker that continues a run locally writes the next hop's row already leased to itself
--     and extends the lease from its heartbeat while the chain lives (worker/continuation.py);
--   * a relay claims the rows it is about to send with a short lease, commits, then sends
--     (orchestrator/relay.py), so no transaction and no row lock is held across the SQS call
--     and a relay that dies mid-send leaves rows another relay takes when the claim expires.
-- Nobody sends a row whose lease is live. NULL: no lease. Existing rows need no backfill.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_holder text;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_until timestamptz;

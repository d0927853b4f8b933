-- How often the transition itself (not a phase) crashed on one SQS message. SQS's
-- ApproximateReceiveCount cannot tell a crash from a phase retry, a hand-back or a database
-- outage, so the worker counts crashes here, by MessageId (the same on every redelivery),
-- and quarantines the message after a few instead of looping until SQS's redrive moves the
-- raw body to the DLQ. Rows are few (one per crashing message) and kept, like the
-- quarantine: the worker role gets no DELETE (0005).
CREATE TABLE IF NOT EXISTS transition_crashes (
    message_id  text PRIMARY KEY,
    crashes     integer NOT NULL DEFAULT 1,
    error_type  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON transition_crashes TO phasegate_worker;
    END IF;
END
$$;

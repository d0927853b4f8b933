-- The console's redrive of a quarantined message (docs/how-to/console.md): who redrove it and
-- when, so a second click changes nothing and the page shows what was done. The redrive
-- itself writes the run row, an outbox row and a control_actions row like a retry; the
-- quarantine row keeps no body, so nothing here can hold payload data either.
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS redriven_at timestamptz;
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS redriven_by text;

-- The orchestrator (0007) lists the quarantine and marks a row redriven; nothing else.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        GRANT SELECT ON quarantine TO phasegate_orchestrator;
        GRANT UPDATE (redriven_at, redriven_by) ON quarantine TO phasegate_orchestrator;
    END IF;
END
$$;

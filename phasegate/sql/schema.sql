-- The schema's own bookkeeping: which numbered migrations are applied (phasegate/migrate.py).
-- A block starts with `-- name: <name>`.

-- name: migrations_table
CREATE TABLE IF NOT EXISTS phasegate_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: migration_lock
SELECT pg_advisory_xact_lock($1)

-- name: migrations_applied
SELECT version FROM phasegate_migrations

-- name: migration_record
INSERT INTO phasegate_migrations (version, name) VALUES ($1, $2)

-- name: migrations_table_exists
SELECT to_regclass('phasegate_migrations') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM phasegate_migrations

-- name: ping
SELECT 1

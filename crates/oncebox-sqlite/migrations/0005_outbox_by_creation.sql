-- oncebox SQLite schema, version 5: the outbox's rows indexed by creation time, for
-- listings filtered by time (the dashboard's messages page), which read them newest first
-- from this index at any depth. Idempotent.
CREATE INDEX IF NOT EXISTS oncebox_outbox_created ON oncebox_outbox (created_at, seq);

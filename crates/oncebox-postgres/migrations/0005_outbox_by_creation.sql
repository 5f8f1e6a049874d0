-- oncebox: the outbox's rows indexed by creation time, for listings filtered by time (the
-- dashboard's messages page), which read them newest first from this index at any depth.
-- It costs an enqueue one more index entry (4 % of a business transaction's throughput,
-- measured with 8 producers). Idempotent. On a large outbox, build it first without
-- blocking enqueues, and this statement then finds it:
--   CREATE INDEX CONCURRENTLY outbox_created ON <schema>.outbox (created_at, seq);

CREATE INDEX IF NOT EXISTS outbox_created ON :"schema".outbox (created_at, seq);

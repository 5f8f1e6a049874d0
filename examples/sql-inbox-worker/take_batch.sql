-- One batch of a worker outside Rust that processes what `oncebox receive` stored in
-- the durable inbox (PostgreSQL): take the next rows, have the effect, mark them
-- processed, all in one transaction. Prints how many rows it processed (0: none left).
--
--   psql postgres://app@db/shop -X -q -A -t -v schema=oncebox -v consumer=orders -f take_batch.sql
--
-- The statements are the inbox contract of docs/service.md: several workers may run
-- this at once (FOR UPDATE SKIP LOCKED: a row is taken by one transaction at a time; a
-- worker that dies rolls back and its rows are taken again), and each customer's rows
-- are processed in the order they were received (a row waits while an earlier row of
-- its key is pending). The effect here is a row in `shop_events`, the service's own
-- table; a real worker does its work in the same transaction.
BEGIN;

WITH taken AS (
  -- Take: the next pending rows of the consumer, at most one per key at a time.
  SELECT d.seq, d.message_id, d.key, d.kind, d.headers, d.payload
  FROM :"schema".durable_inbox AS d
  WHERE d.consumer = :'consumer' AND d.status = 'pending' AND d.available_at <= now()
    -- The first pending row of its key (a scalar subquery: one index probe per row,
    -- whatever the planner knows of the table).
    AND (d.key IS NULL OR d.seq = (
      SELECT min(e.seq) FROM :"schema".durable_inbox AS e
      WHERE e.consumer = d.consumer AND e.key = d.key AND e.status = 'pending'))
  ORDER BY d.seq
  LIMIT 100
  FOR UPDATE SKIP LOCKED
), effect AS (
  -- The worker's effect, in the same transaction.
  INSERT INTO shop_events (message_id, key, payload)
  SELECT message_id, key, payload FROM taken
), processed AS (
  -- Mark processed: done now; `oncebox receive` deletes done rows after the dedup
  -- window, and until then a redelivery of the message is recognised.
  UPDATE :"schema".durable_inbox AS d
  SET status = 'done', done_at = now()
  FROM taken WHERE d.seq = taken.seq
  RETURNING d.seq
)
SELECT count(*) FROM processed;

COMMIT;

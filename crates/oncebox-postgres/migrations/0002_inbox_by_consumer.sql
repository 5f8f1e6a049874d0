-- oncebox PostgreSQL schema, version 2: inbox records purged per consumer.
--
-- Each consumer purges its own records, older than its own dedup window; the index that
-- serves that purge leads with the consumer. Every statement is idempotent.
CREATE INDEX IF NOT EXISTS inbox_consumer_processed
    ON :"schema".inbox (consumer, processed_at);

DROP INDEX IF EXISTS :"schema".inbox_processed;

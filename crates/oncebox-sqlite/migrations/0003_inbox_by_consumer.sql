-- oncebox SQLite schema, version 3: inbox records purged per consumer.
--
-- Each consumer purges its own records, older than its own dedup window; the index that
-- serves that purge leads with the consumer. Every statement is idempotent.
CREATE INDEX IF NOT EXISTS oncebox_inbox_consumer_processed
    ON oncebox_inbox (consumer, processed_at);

DROP INDEX IF EXISTS oncebox_inbox_processed;

-- oncebox MySQL / MariaDB schema, version 3: inbox records purged per consumer.
--
-- Each consumer purges its own records, older than its own dedup window; the index that
-- serves that purge leads with the consumer. MySQL has no `ADD INDEX IF NOT EXISTS`
-- (MariaDB has), so the change is prepared only while the old index is there: every
-- statement is idempotent.
SET @oncebox_index = IF(EXISTS (
        SELECT 1 FROM information_schema.statistics
        WHERE table_schema = DATABASE() AND table_name = 'oncebox_inbox'
          AND index_name = 'oncebox_inbox_processed'),
    'ALTER TABLE oncebox_inbox DROP INDEX oncebox_inbox_processed, ADD INDEX oncebox_inbox_consumer_processed (consumer, processed_at)',
    'DO 0');
PREPARE oncebox_index FROM @oncebox_index;
EXECUTE oncebox_index;
DEALLOCATE PREPARE oncebox_index;
SET @oncebox_index = NULL;

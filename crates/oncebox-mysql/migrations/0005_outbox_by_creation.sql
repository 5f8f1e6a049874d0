-- oncebox MySQL / MariaDB schema, version 5: the outbox's rows indexed by creation time,
-- for listings filtered by time (the dashboard's messages page), which read them newest
-- first from this index at any depth.
--
-- MySQL has no `ADD INDEX IF NOT EXISTS` (MariaDB has), so the index is added only while
-- it is missing: every statement is idempotent.
SET @oncebox_index = IF(EXISTS (
        SELECT 1 FROM information_schema.statistics
        WHERE table_schema = DATABASE() AND table_name = 'oncebox_outbox'
          AND index_name = 'oncebox_outbox_created'),
    'DO 0',
    'ALTER TABLE oncebox_outbox ADD INDEX oncebox_outbox_created (created_at, seq)');
PREPARE oncebox_index FROM @oncebox_index;
EXECUTE oncebox_index;
DEALLOCATE PREPARE oncebox_index;
SET @oncebox_index = NULL;

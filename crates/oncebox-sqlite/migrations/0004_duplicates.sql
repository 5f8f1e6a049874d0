-- oncebox SQLite schema, version 4: the duplicates each inbox consumer skipped, counted
-- for operators (the dashboard's overview).
--
-- The consumer engine adds one per duplicate delivery it skips, in a statement of its own
-- once the delivery is settled; retention leaves this table alone, so the count runs from
-- the consumer's first duplicate. Times are Unix milliseconds. Idempotent.
CREATE TABLE IF NOT EXISTS oncebox_inbox_duplicates (
    consumer TEXT    NOT NULL PRIMARY KEY,
    skipped  INTEGER NOT NULL,
    last_at  INTEGER NOT NULL
);

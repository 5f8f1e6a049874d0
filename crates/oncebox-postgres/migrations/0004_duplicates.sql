-- oncebox: the duplicates each inbox consumer skipped, counted for operators (the
-- dashboard's overview). The consumer engine adds one per duplicate delivery it skips, in
-- a statement of its own once the delivery is settled; retention leaves this table alone,
-- so the count runs from the consumer's first duplicate. Idempotent.

CREATE TABLE IF NOT EXISTS :"schema".inbox_duplicates (
    consumer text        PRIMARY KEY,
    skipped  bigint      NOT NULL,
    last_at  timestamptz NOT NULL
);

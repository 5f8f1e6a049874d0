-- oncebox SQLite schema, version 1.
--
-- `SqliteStore::migrate` applies this file and records it in `_oncebox_migrations`.
-- Teams with their own migration tool may apply it as it is instead: every statement is
-- idempotent (IF NOT EXISTS / OR IGNORE). All times are milliseconds since the Unix epoch.

-- The transactional outbox. Producers insert rows in their own transactions; relays
-- claim pending rows with a lease, publish them and settle them.
--
-- `seq` is the commit order: SQLite has a single writer, so rows get their `seq` in the
-- order their transactions commit, and a relay that claims by status never skips a row.
CREATE TABLE IF NOT EXISTS oncebox_outbox (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT    NOT NULL UNIQUE,          -- message id (UUID text)
    topic        TEXT    NOT NULL,
    key          TEXT,                             -- ordering key; NULL = unordered
    kind         TEXT    NOT NULL DEFAULT '',
    headers      TEXT    NOT NULL DEFAULT '{}',    -- JSON object of strings
    payload      BLOB    NOT NULL,
    created_at   INTEGER NOT NULL,
    status       TEXT    NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'done', 'dead')),
    attempts     INTEGER NOT NULL DEFAULT 0,       -- failed attempts so far
    available_at INTEGER NOT NULL,                 -- not claimable before
    lease_token  TEXT,                             -- the claim holding the row
    lease_until  INTEGER,                          -- the claim's lease ends
    last_error   TEXT,                             -- last failure, or the dead reason
    done_at      INTEGER,                          -- published (status done)
    dead_at      INTEGER                           -- given up (status dead)
);

-- Claim: pending rows in commit order (covering the claimability test).
CREATE INDEX IF NOT EXISTS oncebox_outbox_pending
    ON oncebox_outbox (seq, available_at, lease_until, key)
    WHERE status = 'pending';

-- Claim: earlier pending rows of the same key (per-key order).
CREATE INDEX IF NOT EXISTS oncebox_outbox_pending_key
    ON oncebox_outbox (key, seq, available_at, lease_until)
    WHERE status = 'pending' AND key IS NOT NULL;

-- Retention: done rows by age.
CREATE INDEX IF NOT EXISTS oncebox_outbox_done
    ON oncebox_outbox (done_at)
    WHERE status = 'done';

-- Dead letters.
CREATE INDEX IF NOT EXISTS oncebox_outbox_dead
    ON oncebox_outbox (seq)
    WHERE status = 'dead';

-- The transactional inbox: ids processed per consumer, written in the handler's
-- transaction, with the handler's result for duplicates.
CREATE TABLE IF NOT EXISTS oncebox_inbox (
    consumer     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    result       BLOB,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS oncebox_inbox_processed
    ON oncebox_inbox (processed_at);

-- The durable inbox: deliveries stored first (and acked to the broker), processed later
-- from this table. One table for all consumers; each consumer sees its own rows.
CREATE TABLE IF NOT EXISTS oncebox_durable_inbox (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer       TEXT    NOT NULL,
    dedup_id       TEXT    NOT NULL,               -- the id strategy's id
    message_id     TEXT,                           -- the producer's id, if any
    topic          TEXT    NOT NULL,
    key            TEXT,
    kind           TEXT    NOT NULL DEFAULT '',
    headers        TEXT    NOT NULL DEFAULT '{}',
    payload        BLOB    NOT NULL,
    created_at     INTEGER,                        -- producer's time, if known
    source         TEXT    NOT NULL,               -- broker coordinates
    partition      INTEGER,
    position       TEXT    NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 1,
    received_at    INTEGER NOT NULL,
    status         TEXT    NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'done', 'dead')),
    attempts       INTEGER NOT NULL DEFAULT 0,
    available_at   INTEGER NOT NULL,
    lease_token    TEXT,
    lease_until    INTEGER,
    last_error     TEXT,
    result         BLOB,                           -- the handler's result (status done)
    done_at        INTEGER,
    dead_at        INTEGER,
    UNIQUE (consumer, dedup_id)
);

CREATE INDEX IF NOT EXISTS oncebox_durable_inbox_pending
    ON oncebox_durable_inbox (consumer, seq, available_at, lease_until, key)
    WHERE status = 'pending';

CREATE INDEX IF NOT EXISTS oncebox_durable_inbox_pending_key
    ON oncebox_durable_inbox (consumer, key, seq, available_at, lease_until)
    WHERE status = 'pending' AND key IS NOT NULL;

CREATE INDEX IF NOT EXISTS oncebox_durable_inbox_done
    ON oncebox_durable_inbox (consumer, done_at)
    WHERE status = 'done';

-- The idempotent receiver's dedup records: an id is in progress (leased to `token` until
-- `lease_until`) or completed (with `result`); either way it is free again at
-- `expires_at`.
CREATE TABLE IF NOT EXISTS oncebox_dedup (
    id          TEXT    PRIMARY KEY,
    state       TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    token       INTEGER NOT NULL,
    lease_until INTEGER,
    result      BLOB,
    expires_at  INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS oncebox_dedup_expires
    ON oncebox_dedup (expires_at);

-- Fencing tokens are drawn from one counter, so a token is never reused for an id, even
-- after its record expired and was purged.
CREATE TABLE IF NOT EXISTS oncebox_dedup_tokens (
    id   INTEGER PRIMARY KEY CHECK (id = 0),
    next INTEGER NOT NULL
);

INSERT OR IGNORE INTO oncebox_dedup_tokens (id, next) VALUES (0, 1);

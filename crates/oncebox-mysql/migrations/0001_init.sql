-- oncebox MySQL / MariaDB schema, version 1 (MySQL 8.0.16+, MariaDB 10.6+).
--
-- `MySqlStore::migrate` applies this file to the connection's database and records it
-- in `_oncebox_migrations`, apart from your application's `_sqlx_migrations`. Teams with
-- their own migration tool apply it as it is:
--
--     mysql --database=app < 0001_init.sql
--
-- Every statement is idempotent (IF NOT EXISTS, fill-if-empty), so a run that stopped
-- half way (MySQL commits each DDL statement on its own) can simply be run again.
--
-- Conventions:
-- - Times are BIGINT milliseconds since the Unix epoch, read from the database's clock
--   (`UTC_TIMESTAMP(6)`), never the relays' clocks; `created_at` is the producer's.
-- - Message ids and lease tokens are UUIDs as BINARY(16): half the bytes of CHAR(36) in
--   every index that holds them, compared byte by byte, and UUIDv7 ids arrive in index
--   order. Read them with `HEX(id)` (or `BIN_TO_UUID(id)` on MySQL 8).
-- - Identifiers that are compared (keys, consumers, dedup ids) are VARBINARY: exact byte
--   equality. A VARCHAR with the usual collations would take 'A' and 'a', or 'a' and
--   'a ' (PAD SPACE), for the same id.
-- - `status` is a TINYINT, 0 pending, 1 done, 2 dead: with an ENUM, MariaDB no longer
--   reads the key index of pending rows in order, one group per key.
-- - The lease and settlement columns are NOT NULL and fixed-size, 0 (or a token of
--   zero bytes) meaning "none": a claim's lease update then rewrites each row in place.
--   A NULL becoming a value grows the row, and made the lease update of 256 rows about
--   four times slower.

-- The transactional outbox. Producers insert rows in their own transactions; relays
-- claim pending rows with a lease, publish them and settle them.
--
-- `seq` is the per-key commit order: a producer locks the key's slot in
-- `oncebox_key_locks` *before* the row gets its `seq`, so two transactions enqueueing the
-- same key commit in `seq` order (see the crate docs, "Producing from other languages").
CREATE TABLE IF NOT EXISTS oncebox_outbox (
    seq          BIGINT         NOT NULL AUTO_INCREMENT,
    id           BINARY(16)     NOT NULL,                  -- message id
    topic        VARCHAR(255)   NOT NULL,
    `key`        VARBINARY(512)     NULL,                  -- ordering key; NULL = unordered
    kind         VARCHAR(255)   NOT NULL DEFAULT '',
    headers      MEDIUMTEXT     NOT NULL,                  -- JSON object of strings
    payload      LONGBLOB       NOT NULL,
    created_at   BIGINT         NOT NULL,
    status       TINYINT        NOT NULL DEFAULT 0,        -- 0 pending, 1 done, 2 dead
    attempts     INT            NOT NULL DEFAULT 0,        -- failed attempts so far
    available_at BIGINT         NOT NULL DEFAULT 0,        -- not claimable before
    lease_token  BINARY(16)     NOT NULL DEFAULT X'00000000000000000000000000000000',
                                                           -- the claim holding the row
    lease_until  BIGINT         NOT NULL DEFAULT 0,        -- the claim's lease ends
    last_error   TEXT               NULL,                  -- last failure, or the dead reason
    done_at      BIGINT         NOT NULL DEFAULT 0,        -- published (status 1)
    dead_at      BIGINT         NOT NULL DEFAULT 0,        -- given up (status 2)
    PRIMARY KEY (seq),
    UNIQUE KEY oncebox_outbox_id (id),
    -- Claim, step 1 (the first pending rows in commit order) and dead letters.
    KEY oncebox_outbox_pending (status, seq),
    -- Claim, step 2 (one probe per key) and unordered rows.
    KEY oncebox_outbox_pending_key (status, `key`, seq),
    -- Retention: done rows by age.
    KEY oncebox_outbox_done (status, done_at),
    CONSTRAINT oncebox_outbox_status CHECK (status IN (0, 1, 2))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Per-key enqueue locks: 65,536 slots, a key's slot is `CRC32(key) & 65535`. A producer
-- locks its key's slot (`SELECT ... FOR UPDATE`) before inserting the row, and holds it to
-- its commit or rollback. Two keys that share a slot only wait for each other.
CREATE TABLE IF NOT EXISTS oncebox_key_locks (
    slot SMALLINT UNSIGNED NOT NULL,
    PRIMARY KEY (slot)
) ENGINE = InnoDB;

INSERT INTO oncebox_key_locks (slot)
WITH RECURSIVE d (n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM d WHERE n < 255)
SELECT hi.n * 256 + lo.n FROM d AS hi CROSS JOIN d AS lo
WHERE NOT EXISTS (SELECT 1 FROM oncebox_key_locks);

-- Claim locks: one row per spool table (`outbox`, `durable_inbox:<consumer>`), locked for
-- the length of a claim transaction so that claims of one table run one at a time.
CREATE TABLE IF NOT EXISTS oncebox_claim_locks (
    name VARBINARY(300) NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB;

-- The transactional inbox: ids processed per consumer, written in the handler's
-- transaction, with the handler's result for duplicates.
CREATE TABLE IF NOT EXISTS oncebox_inbox (
    consumer     VARBINARY(255)  NOT NULL,
    message_id   VARBINARY(1024) NOT NULL,
    result       LONGBLOB            NULL,
    processed_at BIGINT          NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY oncebox_inbox_processed (processed_at)
) ENGINE = InnoDB;

-- The durable inbox: deliveries stored first (and acked to the broker), processed later
-- from this table. One table for all consumers; each consumer sees its own rows.
CREATE TABLE IF NOT EXISTS oncebox_durable_inbox (
    seq            BIGINT          NOT NULL AUTO_INCREMENT,
    consumer       VARBINARY(255)  NOT NULL,
    dedup_id       VARBINARY(1024) NOT NULL,               -- the id strategy's id
    message_id     BINARY(16)          NULL,               -- the producer's id, if any
    topic          VARCHAR(255)    NOT NULL,
    `key`          VARBINARY(512)      NULL,
    kind           VARCHAR(255)    NOT NULL DEFAULT '',
    headers        MEDIUMTEXT      NOT NULL,
    payload        LONGBLOB        NOT NULL,
    created_at     BIGINT              NULL,               -- producer's time, if known
    source         TEXT            NOT NULL,               -- broker coordinates
    `partition`    INT                 NULL,
    `position`     TEXT            NOT NULL,
    delivery_count INT             NOT NULL DEFAULT 1,
    received_at    BIGINT          NOT NULL,
    status         TINYINT         NOT NULL DEFAULT 0,     -- 0 pending, 1 done, 2 dead
    attempts       INT             NOT NULL DEFAULT 0,
    available_at   BIGINT          NOT NULL DEFAULT 0,
    lease_token    BINARY(16)      NOT NULL DEFAULT X'00000000000000000000000000000000',
    lease_until    BIGINT          NOT NULL DEFAULT 0,
    last_error     TEXT                NULL,
    result         LONGBLOB            NULL,               -- the handler's result (done)
    done_at        BIGINT          NOT NULL DEFAULT 0,
    dead_at        BIGINT          NOT NULL DEFAULT 0,
    PRIMARY KEY (seq),
    UNIQUE KEY oncebox_durable_inbox_dedup (consumer, dedup_id),
    KEY oncebox_durable_inbox_pending (consumer, status, seq),
    KEY oncebox_durable_inbox_pending_key (consumer, status, `key`, seq),
    KEY oncebox_durable_inbox_done (consumer, status, done_at),
    CONSTRAINT oncebox_durable_inbox_status CHECK (status IN (0, 1, 2))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The idempotent receiver's dedup records: an id is in progress (leased to `token` until
-- `lease_until`) or completed (with `result`); either way it is free again at
-- `expires_at`. Tokens come from AUTO_INCREMENT, which never hands out a value twice (its
-- counter survives restarts on MySQL 8 and MariaDB 10.2.4+): an expired record is taken
-- over by deleting it and inserting a new one, with a larger token.
CREATE TABLE IF NOT EXISTS oncebox_dedup (
    id          VARBINARY(1024) NOT NULL,
    state       ENUM('in_progress', 'completed') NOT NULL,
    token       BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    lease_until BIGINT              NULL,
    result      LONGBLOB            NULL,
    expires_at  BIGINT          NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY oncebox_dedup_token (token),
    KEY oncebox_dedup_expires (expires_at)
) ENGINE = InnoDB;

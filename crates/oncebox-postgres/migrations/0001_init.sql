-- oncebox PostgreSQL schema, version 1.
--
-- `PgStore::migrate` applies this file with `:"schema"` replaced by the store's schema
-- (default `oncebox`) and records it in `<schema>._oncebox_migrations`. Teams with their
-- own migration tool apply it as it is with psql, which fills in the placeholder:
--
--     psql -v schema=oncebox -v ON_ERROR_STOP=1 -f 0001_init.sql
--
-- or paste it into their tool with `:"schema"` replaced by the schema name. Every
-- statement is idempotent (IF NOT EXISTS). Times are `timestamptz` and are written and
-- compared with the database's clock, never the clocks of the relays.

CREATE SCHEMA IF NOT EXISTS :"schema";

-- The transactional outbox. Producers insert rows in their own transactions; relays claim
-- pending rows with a lease, publish them and settle them.
--
-- `seq` is the per-key commit order: a producer takes a transaction-scoped advisory lock
-- on the key's hash *before* the row gets its `seq`, so two transactions enqueueing the
-- same key commit in `seq` order. Producers in other languages insert with the same
-- statement `PgOutbox::enqueue` runs (see the crate docs, "Producing from other
-- languages"); rows inserted without the lock are still published, each key's rows in
-- `seq` order, which is then allocation order and not necessarily commit order.
--
-- fillfactor 50 leaves room on each page for a second version of every row on it, so
-- that the claim's lease update (which touches no indexed column: `lease_token` and
-- `lease_until` are in no index or index predicate) stays a HOT update: no new index
-- entries, no index bloat. A claim leases a run of consecutive rows, i.e. every row of a
-- page at once, and the old versions cannot be pruned before the claim commits, so the
-- page needs room for all of them; at 85 only about one lease in six was HOT, and the
-- claim cost twice as much. Rows are short-lived (published, then deleted or purged), so
-- the table stays small and the space is cheap.
CREATE TABLE IF NOT EXISTS :"schema".outbox (
    seq          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           uuid        NOT NULL UNIQUE,            -- message id
    topic        text        NOT NULL,
    key          text,                                   -- ordering key; NULL = unordered
    kind         text        NOT NULL DEFAULT '',
    headers      jsonb       NOT NULL DEFAULT '{}',      -- object of strings
    payload      bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    status       text        NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'done', 'dead')),
    attempts     integer     NOT NULL DEFAULT 0,         -- failed attempts so far
    available_at timestamptz NOT NULL DEFAULT now(),     -- not claimable before
    lease_token  uuid,                                   -- the claim holding the row
    lease_until  timestamptz,                            -- the claim's lease ends
    last_error   text,                                   -- last failure, or the dead reason
    done_at      timestamptz,                            -- published (status done)
    dead_at      timestamptz                             -- given up (status dead)
) WITH (fillfactor = 50);

-- Claim, step 1: the first pending rows in commit order.
CREATE INDEX IF NOT EXISTS outbox_pending
    ON :"schema".outbox (seq) WHERE status = 'pending';

-- Claim, step 2 (keys whose rows lie beyond step 1's window): one probe per key.
CREATE INDEX IF NOT EXISTS outbox_pending_key
    ON :"schema".outbox (key, seq) WHERE status = 'pending' AND key IS NOT NULL;

-- Claim, step 2: unordered rows beyond step 1's window.
CREATE INDEX IF NOT EXISTS outbox_pending_unkeyed
    ON :"schema".outbox (seq) WHERE status = 'pending' AND key IS NULL;

-- Retention: done rows by age.
CREATE INDEX IF NOT EXISTS outbox_done
    ON :"schema".outbox (done_at) WHERE status = 'done';

-- Dead letters.
CREATE INDEX IF NOT EXISTS outbox_dead
    ON :"schema".outbox (seq) WHERE status = 'dead';

-- The transactional inbox: ids processed per consumer, written in the handler's
-- transaction, with the handler's result for duplicates.
CREATE TABLE IF NOT EXISTS :"schema".inbox (
    consumer     text        NOT NULL,
    message_id   text        NOT NULL,
    result       bytea,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS inbox_processed
    ON :"schema".inbox (processed_at);

-- The durable inbox: deliveries stored first (and acked to the broker), processed later
-- from this table. One table for all consumers; each consumer sees its own rows.
CREATE TABLE IF NOT EXISTS :"schema".durable_inbox (
    seq            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer       text        NOT NULL,
    dedup_id       text        NOT NULL,               -- the id strategy's id
    message_id     uuid,                               -- the producer's id, if any
    topic          text        NOT NULL,
    key            text,
    kind           text        NOT NULL DEFAULT '',
    headers        jsonb       NOT NULL DEFAULT '{}',
    payload        bytea       NOT NULL,
    created_at     timestamptz,                        -- producer's time, if known
    source         text        NOT NULL,               -- broker coordinates
    partition      integer,
    position       text        NOT NULL,
    delivery_count integer     NOT NULL DEFAULT 1,
    received_at    timestamptz NOT NULL DEFAULT now(),
    status         text        NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'done', 'dead')),
    attempts       integer     NOT NULL DEFAULT 0,
    available_at   timestamptz NOT NULL DEFAULT now(),
    lease_token    uuid,
    lease_until    timestamptz,
    last_error     text,
    result         bytea,                              -- the handler's result (done)
    done_at        timestamptz,
    dead_at        timestamptz,
    UNIQUE (consumer, dedup_id)
) WITH (fillfactor = 50);  -- as the outbox: room for the lease update to stay HOT

CREATE INDEX IF NOT EXISTS durable_inbox_pending
    ON :"schema".durable_inbox (consumer, seq) WHERE status = 'pending';

CREATE INDEX IF NOT EXISTS durable_inbox_pending_key
    ON :"schema".durable_inbox (consumer, key, seq)
    WHERE status = 'pending' AND key IS NOT NULL;

CREATE INDEX IF NOT EXISTS durable_inbox_pending_unkeyed
    ON :"schema".durable_inbox (consumer, seq) WHERE status = 'pending' AND key IS NULL;

CREATE INDEX IF NOT EXISTS durable_inbox_done
    ON :"schema".durable_inbox (consumer, done_at) WHERE status = 'done';

-- The idempotent receiver's dedup records: an id is in progress (leased to `token` until
-- `lease_until`) or completed (with `result`); either way it is free again at
-- `expires_at`.
CREATE TABLE IF NOT EXISTS :"schema".dedup (
    id          text        PRIMARY KEY,
    state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    token       bigint      NOT NULL,
    lease_until timestamptz,
    result      bytea,
    expires_at  timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS dedup_expires
    ON :"schema".dedup (expires_at);

-- Fencing tokens come from one sequence, so a token is never issued twice, even for an id
-- whose record expired and was purged.
CREATE SEQUENCE IF NOT EXISTS :"schema".dedup_tokens;
